"""One road per kind of data (issues 41 and 55): the same mistake gives the same typed error and message from each of
the six roads (numpy arrays, a ``tf.data`` input, a DataFrame, an RDD, the Parquet files Spark wrote from it and a
Delta table of the same rows), raised on the driver before any training stage (no Spark job at all, but for the RDD's
one-record sample);
a Parquet file that cannot be read is named and not retried; a bad row of a Parquet file is named by its file
and its row in it; Hive-style partition folders are columns. Real Spark (``local[2]``), real Parquet written by
Spark, the net from Keras."""

import glob
import os
import re

import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from tests import digits
from tests.spark_utils import jobs_since, spark_jobs
from tfnet import TFNet
from tfnet.errors import InputSpecError

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)
N = 64


def dense_net():
    """Input ``x`` of rows (64,): flat digits."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,), name="x"), keras.layers.Dense(10, name="logits")])
    return TFNet.from_keras(model)


def cnn_net():
    """Input ``image`` of rows (8, 8, 1)."""
    return TFNet.from_keras(digits.cnn(classes=10, seed=0))


@pytest.fixture(scope="module")
def rows():
    x, y = digits.load()
    return x[:N], y[:N]


def frame(spark, columns: dict, schema: str, partitions: int = 2):
    n = len(next(iter(columns.values())))
    data = [tuple(v[i] for v in columns.values()) for i in range(n)]
    return spark.createDataFrame(data, schema).repartition(partitions)


def written(df, path) -> str:
    df.write.mode("overwrite").parquet(str(path))
    return str(path)


def raised(spark, fn, error: type, sample: bool = False):
    """The ``error`` that ``fn`` raises, and that no Spark job ran for it (the warm-up aside; with ``sample``, only the
    one job of an RDD's one-record sample, untagged, and none of tfnet's)."""
    before = spark_jobs(spark)
    with pytest.raises(error) as caught:
        fn()
    jobs = jobs_since(spark, before)
    if sample:
        assert jobs == [""], f"more than the RDD's sample ran before the error: {jobs}; {caught.value}"
    else:
        assert jobs == [], f"a Spark job ran before the error: {caught.value}"
    return caught.value


#: The roads whose data has no column names: numpy arrays name theirs ``features`` and ``labels``, and so do a
#: ``tf.data`` input and an RDD (whose records are arrays).
UNNAMED = ("arrays", "tf.data", "rdd")


def six_roads(spark, tmp_path, net, error, columns, schema, feature, label, arrays, roads=None, **options):
    """The ``error`` of one mistake on each road: ``{"dataframe": e, "parquet": e, "delta": e, "arrays": e, "tf.data":
    e, "rdd": e}``; the last three from ``arrays`` (``(features, labels)``; None: a mistake they cannot make), ``roads``
    (default: all six) those to take."""
    import deltalake
    import pyarrow.parquet as pq
    import tensorflow as tf

    df = frame(spark, columns, schema)
    folder = written(df, tmp_path / "data")
    table = str(tmp_path / "delta")
    deltalake.write_deltalake(table, pq.read_table(folder))  # the very rows and types Spark wrote
    makers = {"dataframe": lambda: TFDataset.from_dataframe(df, feature, label, **options),
              "parquet": lambda: TFDataset.from_parquet(folder, feature, label, **options),
              "delta": lambda: TFDataset.from_delta(table, feature, label, **options)}
    if arrays is not None:
        x, y = arrays
        makers["arrays"] = lambda: arrays
        makers["tf.data"] = lambda: TFDataset.from_tf_data(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
        makers["rdd"] = lambda: TFDataset.from_rdd(spark.sparkContext.parallelize(list(zip(x, y)), 2))
    out = {}
    for road in roads or makers:
        def run(data=makers[road]):
            TFOptimizer(net, SCE, optim.SGD(0.1)).optimize(data(), batch_size=16, num_workers=2, verbose=0)

        out[road] = raised(spark, run, error, sample=road == "rdd")
    assert set(out) == set(roads or ("dataframe", "parquet", "delta", *(UNNAMED if arrays is not None else ())))
    return out


def same(errors: dict, names: dict | None = None) -> str:
    """The one message every road gave (in the messages of the roads without column names, ``names``' keys put back
    as their values: the arrays' names as the DataFrame's columns); asserts one type and one message."""
    types = {k: type(e) for k, e in errors.items()}
    assert len(set(types.values())) == 1, types
    messages = {}
    for road, err in errors.items():
        text = str(err).split("\n")[0]
        for theirs, ours in (names or {}).items() if road in UNNAMED else ():
            text = text.replace(theirs, ours)
        messages[road] = text
    assert len(set(messages.values())) == 1, messages
    return messages["dataframe"]


def test_a_string_label_column(spark, tmp_path, rows):
    x, y = rows
    errors = six_roads(spark, tmp_path, dense_net(), optim.DataError,
                       {"pixels": x.reshape(N, 64).tolist(), "label": [str(v) for v in y]},
                       "pixels array<float>, label string", "pixels", "label", (x.reshape(N, 64), y.astype(str)))
    message = same(errors, {"'labels'": "'label'", "'labels_index'": "'label_index'"})
    assert "label column 'label' holds string values, and SparseCategoricalCrossentropy" in message
    assert "StringIndexer(inputCol='label'" in message


def test_an_array_of_strings_feature(spark, tmp_path, rows):
    x, y = rows
    strings = x.reshape(N, 64).astype(str)
    errors = six_roads(spark, tmp_path, dense_net(), optim.ColumnError,
                       {"pixels": strings.tolist(), "label": y.tolist()},
                       "pixels array<string>, label long", "pixels", "label", (strings, y))
    message = same(errors, {"'features'": "'pixels'"})
    assert message.startswith("Column 'pixels' holds array<string> values, and input 'x:0' takes float32 numbers")


def test_an_unknown_column(spark, tmp_path, rows):
    x, y = rows
    errors = six_roads(spark, tmp_path, dense_net(), optim.ColumnError,
                       {"pixels": x.reshape(N, 64).tolist(), "label": y.tolist()},
                       "pixels array<float>, label long", "pixel", "label", None)
    message = same(errors)
    assert message == "Column 'pixel' is not among the data's columns ['pixels', 'label']; closest: ['pixels']."


def test_an_encoded_image_column_without_a_shape(spark, tmp_path, rows):
    x, y = rows
    png = [b"\x89PNG\r\n\x1a\n" + bytes(8)] * N
    arrays = (np.array(png, dtype=object), y)
    errors = six_roads(spark, tmp_path, cnn_net(), InputSpecError, {"png": png, "label": y.tolist()},
                       "png binary, label long", "png", "label", arrays,
                       roads=("dataframe", "parquet", "delta", "arrays", "rdd"))  # tf.data's strings are not images
    message = same(errors, {"'features'": "'png'"})
    assert message.startswith("Column 'png' holds encoded images, and input 'image:0' takes rows of shape (8, 8, 1): "
                              "pass feature_shapes={'png': (8, 8, 1)}")


def test_a_per_row_shape_that_differs_from_the_input(spark, tmp_path, rows):
    x, y = rows
    errors = six_roads(spark, tmp_path, dense_net(), InputSpecError,
                       {"pixels": x.reshape(N, 64).tolist(), "label": y.tolist()},
                       "pixels array<float>, label long", "pixels", "label", (x.reshape(N, 8, 8), y),
                       feature_shapes={"pixels": (8, 8)})
    message = same(errors, {"'features'": "'pixels'"})
    assert message == ("Column 'pixels' has rows of shape (8, 8), and input 'x:0' takes rows of shape (64,) (the net's "
                       "input is (None, 64), the batch first): if its rows hold 64 values, pass "
                       "feature_shapes={'pixels': (64,)} (a DataFrame or Parquet files) or reshape the array to (n, 64).")


def parquet_folder(spark, tmp_path, x, y, files: int = 2) -> list[str]:
    df = frame(spark, {"pixels": x.reshape(len(x), 64).tolist(), "label": y.tolist()},
               "pixels array<float>, label long", partitions=files)
    folder = written(df, tmp_path / "pq")
    return sorted(glob.glob(os.path.join(folder, "part-*.parquet")))


def test_a_truncated_parquet_file_is_named_on_the_driver(spark, tmp_path, rows):
    x, y = rows
    files = parquet_folder(spark, tmp_path, x, y)
    for bad in (files[1], files[0]):  # a file after the first, then the first (which pyarrow reads the schema from)
        data = open(bad, "rb").read()
        open(bad, "wb").write(data[: len(data) // 2])
        err = raised(spark, lambda b=bad: TFDataset.from_parquet(os.path.dirname(b), "pixels", "label"), optim.DataError)
        assert str(err).startswith(f"Parquet file {bad!r} cannot be read: Parquet magic bytes not found"), str(err)


def test_a_parquet_file_of_another_schema_is_named_on_the_driver(spark, tmp_path, rows):
    """A schema mismatch is no retry's to mend: a file without a column read, or with it as another type, is named
    before any job."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = rows
    files = parquet_folder(spark, tmp_path, x, y)
    pq.write_table(pa.table({"pixels": pa.array(x[:4].reshape(4, 64).tolist(), pa.list_(pa.float32()))}), files[1])
    err = raised(spark, lambda: TFDataset.from_parquet(os.path.dirname(files[1]), "pixels", "label"), optim.DataError)
    assert str(err) == (f"Parquet file {files[1]!r} has no column 'label' (its columns: ['pixels']); every file must "
                        "hold the columns read.")
    pq.write_table(pa.table({"pixels": pa.array(x[:4].reshape(4, 64).tolist(), pa.list_(pa.float32())),
                             "label": pa.array(["a"] * 4)}), files[1])
    err = raised(spark, lambda: TFDataset.from_parquet(os.path.dirname(files[1]), "pixels", "label"), optim.DataError)
    assert str(err) == (f"Parquet file {files[1]!r} holds column 'label' as string, where the files' schema has "
                        "bigint: the files do not share one schema.")


def test_a_parquet_file_with_corrupt_pages_fails_once_naming_it(spark, tmp_path, rows):
    """The footer reads, a page does not decode: the rank's error names the file and the stage is not retried
    (a retry reads the same bytes)."""
    import pyarrow.parquet as pq

    x, y = rows
    files = parquet_folder(spark, tmp_path, x, y)
    meta = pq.ParquetFile(files[0]).metadata
    start = meta.row_group(0).column(0).data_page_offset
    raw = bytearray(open(files[0], "rb").read())
    raw[start:start + 48] = bytes(48)  # the first page header of the pixels column
    open(files[0], "wb").write(bytes(raw))
    data = TFDataset.from_parquet(os.path.dirname(files[0]), "pixels", "label", feature_shapes={"pixels": (64,)})
    before = spark_jobs(spark)
    opt = TFOptimizer(dense_net(), SCE, optim.SGD(0.1))
    with pytest.raises(optim.CorruptFileError, match=re.escape(f"Parquet file {files[0]!r} is corrupt")):
        opt.optimize(data, batch_size=16, num_workers=2, verbose=0)
    trains = [g for g in jobs_since(spark, before) if g.startswith("tfnet-train-")]
    assert len(trains) == 1, f"one attempt, not retried: {trains}"


def test_a_null_row_and_a_nan_row_are_named_by_file_and_row(spark, tmp_path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = rows
    folder = tmp_path / "rows"
    folder.mkdir()
    flat = x.reshape(N, 64)
    for k in range(2):  # two files of 32 rows, written by pyarrow as any other tool would
        part = flat[k * 32:(k + 1) * 32].tolist()
        if k == 1:
            part[5] = None  # a null row: row 5 of the second file
        pq.write_table(pa.table({"pixels": pa.array(part, pa.list_(pa.float32())), "label": y[k * 32:(k + 1) * 32]}),
                       folder / f"part-{k}.parquet")
    second = str(folder / "part-1.parquet")
    opt = TFOptimizer(dense_net(), SCE, optim.SGD(0.1))
    with pytest.raises(optim.BadRowError, match=re.escape(f"Column 'pixels' is null at row 5 of file {second!r}")):
        opt.optimize(TFDataset.from_parquet(str(folder), "pixels", "label"), batch_size=16, num_workers=2, verbose=0)
    nan = flat[32:].copy()
    nan[7, 3] = np.nan
    pq.write_table(pa.table({"pixels": pa.array(nan.tolist(), pa.list_(pa.float32())), "label": y[32:]}), second)
    with pytest.raises(optim.NonFiniteInputError, match=re.escape(f"row 7 of file {second!r} has NaN or Inf in input 0")):
        opt.optimize(TFDataset.from_parquet(str(folder), "pixels", "label"), batch_size=16, num_workers=2, verbose=0)


def test_a_hive_partition_column_trains_as_a_label(spark, tmp_path):
    """Spark's ``partitionBy("label")`` keeps the label only in the folder names (``label=3/``): it is a column
    of ``from_parquet`` like any other, each row with its own label, and the net learns from it."""
    x, y = digits.load()
    x, y = x[:400], y[:400]
    df = frame(spark, {"pixels": x.reshape(len(x), 64).tolist(), "label": y.tolist()}, "pixels array<float>, label long")
    folder = str(tmp_path / "hive")
    df.write.partitionBy("label").parquet(folder)
    assert "label=0" in os.listdir(folder)
    data = TFDataset.from_parquet(folder, "pixels", "label")
    by_pixels = {x[i].reshape(64).astype(np.float32).tobytes(): int(y[i]) for i in range(len(x))}
    got = [(f.tobytes(), int(label)) for features, labels in data.batches(50, shuffle=False)
           for f, label in zip(features[0].astype(np.float32), labels)]
    assert len(got) == len(x) and all(by_pixels[f] == label for f, label in got)
    opt = TFOptimizer(dense_net(), SCE, optim.Adam(0.05), metrics=["accuracy"])
    opt.optimize(data, epochs=4, batch_size=40, num_workers=2, verbose=0)
    assert opt.evaluate((x.reshape(len(x), 64), y))["accuracy"] > 0.85


def test_validation_split_holds_out_the_same_rows_on_every_road(spark, tmp_path):
    """``validation_split=0.25``: numpy arrays split on the driver; a DataFrame and the Parquet files Spark wrote
    from it split on the ranks as they read their rows. The rows held out are the same on every road (a hash of
    their values, keyed by the seed): each run's last validation accuracy is the evaluation of those very rows."""
    from optim.data.holdout import HoldOut

    x, y = digits.load()
    x, y = x[:320].reshape(320, 64), y[:320]
    held = HoldOut(0.25, seed=5).mask([x, y])
    assert 50 < held.sum() < 110
    df = frame(spark, {"pixels": x.tolist(), "label": y.tolist()}, "pixels array<float>, label long")
    folder = written(df, tmp_path / "split")
    roads = {"arrays": (x, y), "dataframe": TFDataset.from_dataframe(df, "pixels", "label"),
             "parquet": TFDataset.from_parquet(folder, "pixels", "label")}
    for road, data in roads.items():
        opt = TFOptimizer(dense_net(), SCE, optim.Adam(0.02), metrics=["accuracy"])
        history = opt.optimize(data, epochs=2, batch_size=16, seed=5, validation_split=0.25, num_workers=2,
                               verbose=0)
        on_held = opt.evaluate((x[held], y[held]))
        assert history["val_accuracy"][-1] == pytest.approx(on_held["accuracy"], abs=1e-6), road
        assert history["val_loss"][-1] == pytest.approx(on_held["loss"], rel=1e-4), road
        assert sum(opt.last_run["rows"]) == int((~held).sum()), road  # the ranks trained on the rest only
    with pytest.raises(ValueError, match=r"`validation_split` must be a fraction between 0 and 1. Received: "
                                         r"validation_split=1.5"):
        TFOptimizer(dense_net(), SCE, optim.SGD(0.1)).optimize((x, y), validation_split=1.5, verbose=0)
