"""``TFDataset.from_delta`` on tables written by delta-rs itself (``deltalake.write_deltalake``): three versions
(written, appended, overwritten), partitioned, on local disk and on a real S3 server (moto). The rows read at a
version equal what ``deltalake.DeltaTable(...).to_pandas()`` gives for it; the partition column is a column like
any other; a version or a time the table does not have is a typed error naming what it has; the table trains over
two ranks of a real Spark ``local[2]``."""

import datetime
import time

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
