"""``TFDataset.from_delta`` on tables written by delta-rs itself (``deltalake.write_deltalake``): three versions
(written, appended, overwritten), partitioned, on local disk and on a real S3 server (moto). The rows read at a
version equal what ``deltalake.DeltaTable(...).to_pandas()`` gives for it; the partition column is a column like
any other; a version or a time the table does not have is a typed error naming what it has; the table trains over
two ranks of a real Spark ``local[2]``.

The schema is the version's, as Delta readers take it: a column added by schema evolution (``schema_mode="merge"``)
reads as nulls in the files written before it, and a null where a value is needed is ``BadRowError`` naming the file
and the row; under column mapping (modes ``name`` and ``id``) a renamed column reads under its new name, a dropped one
is gone, and one added again under an old name reads as nulls in the older files. The oracle is delta-rs's own query
engine (``deltalake.QueryBuilder``) on the same version."""

import datetime
import json
import os
import re
import time
import uuid

import deltalake  # tfnet[delta], which `make` installs for the tests
import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from optim.data.delta import delta_options
from tests import digits
from tests.s3_server import MotoS3
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]


def frame(x, y, first: int, n: int):
    import pandas as pd

    rows = range(first, first + n)
    return pd.DataFrame({"pixels": [x[i].reshape(64).astype(np.float32) for i in rows], "label": y[first:first + n],
                         "half": ["low" if y[i] < 5 else "high" for i in rows]})


def write_versions(uri: str, options=None):
    """Version 0: rows 0..199; 1: rows 200..299 appended; 2: overwritten with rows 300..449. Returns the time
    between versions 0 and 1."""
    x, y = digits.load()
    write = dict(partition_by=["half"], storage_options=options)
    deltalake.write_deltalake(uri, frame(x, y, 0, 200), **write)
    time.sleep(1.1)
    between = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(1.1)
    deltalake.write_deltalake(uri, frame(x, y, 200, 100), mode="append", **write)
    deltalake.write_deltalake(uri, frame(x, y, 300, 150), mode="overwrite", **write)
    return between


def rows_of(data) -> list[tuple]:
    """Every row the dataset gives, sorted: (pixels, label, half) with the label decoded from its column."""
    out = []
    for features, labels in data.batches(64, shuffle=False):
        pixels, half = features
        for p, h, label in zip(pixels, half, labels):
            out.append((np.asarray(p, np.float32).tobytes(), int(label), h.decode() if isinstance(h, bytes) else str(h)))
    return sorted(out)


def rows_in_table(uri: str, version: int, options=None) -> list[tuple]:
    table = deltalake.DeltaTable(uri, version=version, storage_options=delta_options(uri, options)).to_pandas()
    return sorted((np.asarray(p, np.float32).tobytes(), int(label), str(h))
                  for p, label, h in zip(table.pixels, table.label, table.half))


def dense_net():
    import keras

    keras.utils.set_random_seed(0)
    return TFNet.from_keras(keras.Sequential([keras.Input((64,), name="x"), keras.layers.Dense(10, name="logits")]))


def test_versions_of_a_local_table_read_as_delta_rs_reads_them(spark, tmp_path):
    uri = str(tmp_path / "table")
    between = write_versions(uri)
    for version in (0, 1, 2):
        data = TFDataset.from_delta(uri, ["pixels", "half"], "label", version=version)
        assert data.version == version and data.partition_types == {"half": data.partition_types["half"]}
        assert rows_of(data) == rows_in_table(uri, version), version
    assert len(rows_of(TFDataset.from_delta(uri, ["pixels", "half"], "label"))) == 150  # the newest: version 2
    as_of = TFDataset.from_delta(uri, ["pixels", "half"], "label", timestamp=between)
    assert as_of.version == 0 and rows_of(as_of) == rows_in_table(uri, 0)
    with pytest.raises(optim.DataError, match=r"has no version 7; it has versions \[0, 1, 2\]"):
        TFDataset.from_delta(uri, "pixels", "label", version=7)
    with pytest.raises(optim.DataError, match=r"has no version as of '1999-01-01T00:00:00Z'"):
        TFDataset.from_delta(uri, "pixels", "label", timestamp="1999-01-01T00:00:00Z")
    with pytest.raises(optim.DataError, match=r"No Delta table at .*: it has no _delta_log"):
        TFDataset.from_delta(str(tmp_path), "pixels", "label")
    with pytest.raises(optim.ColumnError, match=r"Column 'pixel' is not among the data's columns "
                                                r"\['pixels', 'label', 'half'\]; closest: \['pixels'\]"):
        TFDataset.from_delta(uri, "pixel", "label")
    # the newest version trains over two ranks, every row on one rank
    opt = TFOptimizer(dense_net(), optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.Adam(0.02),
                      metrics=["accuracy"])
    history = opt.optimize(TFDataset.from_delta(uri, "pixels", "label"), epochs=3, batch_size=30, num_workers=2,
                           verbose=0)
    assert sorted(opt.last_run["rows"]) == [75, 75] and opt.global_step == 3 * 5  # 75 rows a rank, 15 a step
    assert history["loss"][-1] < history["loss"][0]


def test_a_table_on_s3(spark, tmp_path):
    with MotoS3(tmp_path) as s3:
        uri = "s3://tfnet/delta/table"
        write_versions(uri, delta_options(uri, s3.options))
        for version in (0, 2):
            data = TFDataset.from_delta(uri, ["pixels", "half"], "label", version=version, storage_options=s3.options)
            assert rows_of(data) == rows_in_table(uri, version, s3.options), version
        opt = TFOptimizer(dense_net(), optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.1))
        opt.optimize(TFDataset.from_delta(uri, "pixels", "label", storage_options=s3.options), epochs=1, batch_size=30,
                     num_workers=2, verbose=0)
        assert sorted(opt.last_run["rows"]) == [75, 75] and opt.global_step == 5


def rows_read(data, columns) -> list[tuple]:
    """The rows as the ranks read them from the files, before decoding (a null has no tensor): ``columns`` of each,
    lists as tuples, sorted."""
    import pyarrow as pa

    source = data._source(0, 1)
    reader = source.open()
    try:
        table = pa.concat_tables([reader.read(b) for b in range(len(source.block_rows))])
    finally:
        reader.close()
    return sorted(zip(*(plain(table.column(c).to_pylist()) for c in columns)), key=repr)


def rows_delta_reads(uri: str, version: int, columns) -> list[tuple]:
    """The rows as delta-rs's own query engine (DataFusion) reads that version, which honours column mapping."""
    import pyarrow as pa

    table = deltalake.DeltaTable(uri, version=version)
    query = f"SELECT {', '.join(columns)} FROM t"
    read = pa.table(deltalake.QueryBuilder().register("t", table).execute(query).read_all())
    return sorted(zip(*(plain(read.column(c).to_pylist()) for c in columns)), key=repr)


def plain(values: list) -> list:
    return [tuple(v) if isinstance(v, list) else v for v in values]


def files_of(uri: str, version: int) -> list[str]:
    import pyarrow as pa

    actions = pa.table(deltalake.DeltaTable(uri, version=version).get_add_actions(flatten=True))
    return [os.path.join(uri, p) for p in actions.column("path").to_pylist()]


def test_a_column_added_by_schema_evolution_reads_as_null_in_older_files(spark, tmp_path):
    uri = str(tmp_path / "table")
    x, y = digits.load()
    deltalake.write_deltalake(uri, frame(x, y, 0, 200), partition_by=["half"])
    newer = frame(x, y, 200, 100)
    newer["extra"] = [p * 2 for p in newer.pixels]  # a second input, from version 1 on
    deltalake.write_deltalake(uri, newer, partition_by=["half"], mode="append", schema_mode="merge")
    older = files_of(uri, 0)
    data = TFDataset.from_delta(uri, ["pixels", "extra"], "label", version=1)
    read = rows_read(data, ["pixels", "extra", "label", "half"])
    assert read == rows_delta_reads(uri, 1, ["pixels", "extra", "label", "half"])
    assert sum(extra is None for _, extra, _, _ in read) == 200 and len(read) == 300
    assert all(extra == tuple(2 * np.asarray(p)) for p, extra, _, _ in read if extra is not None)
    # version 0 is as it was, without the column
    assert rows_of(TFDataset.from_delta(uri, ["pixels", "half"], "label", version=0)) == rows_in_table(uri, 0)
    with pytest.raises(optim.ColumnError, match=r"Column 'extra' is not among the data's columns"):
        TFDataset.from_delta(uri, ["pixels", "extra"], "label", version=0)
    # a null where the net needs a value: the usual error, naming one of the older files and its row
    opt = TFOptimizer(dense_net(), optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.1))
    named = "|".join(re.escape(repr(f)) for f in older)
    with pytest.raises(optim.BadRowError, match=rf"Column 'extra' is null at row \d+ of file ({named}); every "
                                                r"training row needs a value"):
        opt.optimize(TFDataset.from_delta(uri, "extra", "label"), epochs=1, batch_size=30, num_workers=2, verbose=0)


def alter(uri: str, operation: str, change) -> None:
    """Commits ``change(fields)`` (the schema's fields as JSON) as the table's next version: the ``metaData`` action
    that Spark's ALTER TABLE writes for ``operation``. delta-rs 1.6 has no RENAME/DROP COLUMN, and refuses ADD COLUMNS
    on a column-mapped table; Delta's Spark jars are not here (no network), so the test writes that one action of the
    Delta protocol itself; delta-rs then reads the table, as the oracle."""
    table = deltalake.DeltaTable(uri)
    meta = table.metadata()
    fields = change(json.loads(table.schema().to_json())["fields"])
    configuration = dict(meta.configuration)
    configuration["delta.columnMapping.maxColumnId"] = str(max(f["metadata"]["delta.columnMapping.id"]
                                                               for f in fields))
    action = {"metaData": {"id": meta.id, "name": meta.name, "description": meta.description,
                           "format": {"provider": "parquet", "options": {}},
                           "schemaString": json.dumps({"type": "struct", "fields": fields}),
                           "partitionColumns": list(meta.partition_columns), "configuration": configuration,
                           "createdTime": meta.created_time}}
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": operation}}
    with open(os.path.join(uri, "_delta_log", f"{table.version() + 1:020d}.json"), "x") as log:
        log.write(json.dumps(info) + "\n" + json.dumps(action) + "\n")


@pytest.mark.parametrize("mode", ["name", "id"])
def test_columns_renamed_dropped_and_added_again_under_column_mapping(spark, tmp_path, mode):
    uri = str(tmp_path / "table")
    x, y = digits.load()
    first = frame(x, y, 0, 200).assign(old=np.arange(200))
    deltalake.write_deltalake(uri, first, partition_by=["half"], configuration={"delta.columnMapping.mode": mode})
    alter(uri, "RENAME COLUMN", lambda fields: [dict(f, name="image") if f["name"] == "pixels" else f for f in fields])
    alter(uri, "DROP COLUMNS", lambda fields: [f for f in fields if f["name"] != "old"])
    alter(uri, "ADD COLUMNS", lambda fields: fields + [{"name": "old", "type": "long", "nullable": True, "metadata": {
        "delta.columnMapping.id": 100, "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}}])
    newer = frame(x, y, 200, 100).rename(columns={"pixels": "image"}).assign(old=np.arange(1000, 1100))
    deltalake.write_deltalake(uri, newer, partition_by=["half"], mode="append")
    older = files_of(uri, 0)
    # version 0: the files hold physical names (or field ids), the table the logical ones (delta-rs's to_pandas
    # gives nulls for such a table: its query engine is the oracle)
    columns = ["pixels", "old", "label", "half"]
    read = rows_read(TFDataset.from_delta(uri, ["pixels", "old", "half"], "label", version=0), columns)
    assert read == rows_delta_reads(uri, 0, columns) and sorted(old for _, old, _, _ in read) == list(range(200))
    # version 1: renamed
    data = TFDataset.from_delta(uri, ["image", "half"], "label", version=1)
    assert rows_read(data, ["image", "half", "label"]) == rows_delta_reads(uri, 1, ["image", "half", "label"])
    with pytest.raises(optim.ColumnError, match=r"Column 'pixels' is not among the data's columns "
                                                r"\['image', 'label', 'half', 'old'\]"):
        TFDataset.from_delta(uri, "pixels", "label", version=1)
    # version 2: dropped
    with pytest.raises(optim.ColumnError, match=r"Column 'old' is not among the data's columns "
                                                r"\['image', 'label', 'half'\]"):
        TFDataset.from_delta(uri, ["image", "old"], "label", version=2)
    # version 4: added again under the old name: nulls in the older files (not their old values), then rows appended
    columns = ["image", "old", "label", "half"]
    read = rows_read(TFDataset.from_delta(uri, ["image", "old"], "label"), columns)
    assert read == rows_delta_reads(uri, 4, columns) and len(read) == 300
    assert sorted(old for _, old, _, _ in read if old is not None) == list(range(1000, 1100))
    named = "|".join(re.escape(repr(f)) for f in older)
    with pytest.raises(optim.BadRowError, match=rf"Column 'old' is null at row \d+ of file ({named}); every training "
                                                r"row needs a value"):
        list(TFDataset.from_delta(uri, ["image", "old"], "label").batches(64, shuffle=False))
    # the renamed column trains over two ranks
    opt = TFOptimizer(dense_net(), optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.Adam(0.02))
    history = opt.optimize(TFDataset.from_delta(uri, "image", "label"), epochs=3, batch_size=30, num_workers=2,
                           verbose=0)
    assert sorted(opt.last_run["rows"]) == [150, 150] and history["loss"][-1] < history["loss"][0]
