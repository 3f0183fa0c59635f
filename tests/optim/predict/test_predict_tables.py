"""TFPredictor over Parquet files and a Delta table (``TFDataset.from_parquet`` / ``from_delta``) on a real local[2]
Spark: files written by pyarrow and a table written by delta-rs (``deltalake.write_deltalake``), never by tfnet. The
result is a DataFrame of every column of the files (partition columns included) in the files' order, with the outputs
appended, equal to ``TFNet.forward`` on the same rows; ``TFOptimizer.predict`` gives the same. Mistakes (columns given
twice, a wrong column, a missing folder, a kind of input no road takes) are typed errors before any Spark job."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import optim
from optim import TFDataset, TFOptimizer, TFPredictor
from optim.errors import ColumnError, DataError
from tests import models
from tests.spark_utils import jobs_since, spark_jobs
from tfnet import TFNet
from tfnet.errors import InputSpecError

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

N = 100


@pytest.fixture(scope="module")
def cnn():
    return TFNet.from_keras(models.small_cnn())


@pytest.fixture(scope="module")
def images():
    return models.random_images(N, 8, seed=5)


def write_hive_folder(root, images) -> None:
    """Rows 0..59 under ``part=a``, 60..99 under ``part=b``, two files each, row groups of 7 rows: written by pyarrow,
    flat float32 pixels, and a folder pyarrow's discovery leaves out (``_SUCCESS``)."""
    bounds = {"a": [(0, 35), (35, 60)], "b": [(60, 80), (80, 100)]}
    for part, spans in bounds.items():
        folder = root / f"part={part}"
        folder.mkdir(parents=True)
        for k, (a, b) in enumerate(spans):
            table = pa.table({"id": pa.array(np.arange(a, b), pa.int64()),
                              "img": pa.array(images[a:b].reshape(b - a, -1).tolist(), pa.list_(pa.float32())),
                              "tag": pa.array([f"r{i}" for i in range(a, b)])})
            pq.write_table(table, folder / f"part-{k}.parquet", row_group_size=7)
    (root / "_SUCCESS").write_text("")


def test_parquet_files_predict_as_a_dataframe_equal_to_forward(spark, cnn, images, tmp_path):
    root = tmp_path / "hive"
    write_hive_folder(root, images)
    before = spark_jobs(spark)
    data = TFDataset.from_parquet(str(root), "img", feature_shapes={"img": (8, 8, 3)})
    predictor = TFPredictor(cnn, batch_per_thread=16)
    out = predictor.predict(data)
    assert jobs_since(spark, before) == []  # lazy: nothing read yet
    assert out.columns == ["id", "img", "tag", "part", "output"]
    assert out.rdd.getNumPartitions() == 2
    rows = out.collect()
    assert [r.id for r in rows] == list(range(N)), "the files' order"
    assert [r.tag for r in rows] == [f"r{i}" for i in range(N)]
    assert [r.part for r in rows] == ["a"] * 60 + ["b"] * 40
    np.testing.assert_allclose(rows[61].img, images[61].ravel())
    got = np.array([r.output for r in rows], np.float32)
    np.testing.assert_allclose(got, cnn.forward(images), rtol=1e-5, atol=1e-6)
    assert predictor.stats()["rows"] == N

    named = predictor.predict(data, output_cols="scores").select("id", "scores").collect()
    np.testing.assert_allclose(np.array([r.scores for r in named], np.float32), cnn.forward(images), rtol=1e-5,
                               atol=1e-6)

    one = TFPredictor(cnn).predict(TFDataset.from_parquet(str(root / "part=b" / "part-1.parquet"), "img",
                                                          feature_shapes={"img": (8, 8, 3)}))
    assert one.columns == ["id", "img", "tag", "output"]  # a single file: no partition column
    rows = one.collect()
    assert [r.id for r in rows] == list(range(80, 100))
    np.testing.assert_allclose(np.array([r.output for r in rows], np.float32), cnn.forward(images[80:]),
                               rtol=1e-5, atol=1e-6)


def test_optimizer_predict_on_parquet_is_the_same_dataframe(spark, cnn, images, tmp_path):
    root = tmp_path / "hive"
    write_hive_folder(root, images)
    opt = TFOptimizer(cnn, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.1))
    out = opt.predict(TFDataset.from_parquet(str(root), "img", feature_shapes={"img": (8, 8, 3)}), batch_size=8)
    rows = out.select("id", "output").collect()
    assert [r.id for r in rows] == list(range(N))
    np.testing.assert_allclose(np.array([r.output for r in rows], np.float32), cnn.forward(images), rtol=1e-5,
                               atol=1e-6)


def test_a_delta_table_predicts_as_of_its_version(spark, tmp_path):
    deltalake = pytest.importorskip("deltalake")
    import keras
    import pandas as pd

    keras.utils.set_random_seed(0)
    net = TFNet.from_keras(keras.Sequential([keras.Input((64,), name="x"), keras.layers.Dense(10, name="logits")]))
    x = np.random.default_rng(1).normal(size=(150, 64)).astype(np.float32)

    def frame(a, b):
        return pd.DataFrame({"id": np.arange(a, b), "pixels": [x[i] for i in range(a, b)],
                             "half": ["low" if i % 2 else "high" for i in range(a, b)]})

    uri = str(tmp_path / "table")
    deltalake.write_deltalake(uri, frame(0, 100), partition_by=["half"])
    deltalake.write_deltalake(uri, frame(100, 150), partition_by=["half"], mode="append")

    before = spark_jobs(spark)
    newest = TFPredictor(net, batch_per_thread=32).predict(TFDataset.from_delta(uri, "pixels"), output_cols="logits")
    first = TFPredictor(net).predict(TFDataset.from_delta(uri, "pixels", version=0))
    assert jobs_since(spark, before) == []
    assert newest.columns == ["id", "pixels", "half", "logits"] and first.columns[-1] == "output"
    for out, n in ((newest, 150), (first, 100)):
        rows = out.collect()
        ids = np.array([r.id for r in rows])
        assert sorted(ids.tolist()) == list(range(n))
        assert all(r.half == ("low" if r.id % 2 else "high") for r in rows)
        got = np.array([r[-1] for r in rows], np.float32)
        np.testing.assert_allclose(got, net.forward(x[ids]), rtol=1e-5, atol=1e-6)


def test_mistakes_are_typed_errors_before_any_job(spark, cnn, images, tmp_path):
    root = tmp_path / "hive"
    write_hive_folder(root, images)
    data = TFDataset.from_parquet(str(root), "img", feature_shapes={"img": (8, 8, 3)})
    p = TFPredictor(cnn)
    before = spark_jobs(spark)
    with pytest.raises(ColumnError, match=r"ParquetDataset names its feature columns itself .*takes only output_cols"):
        p.predict(data, feature_cols="img")
    with pytest.raises(ColumnError, match=r"Output column 'tag' already exists in the DataFrame.*Columns: \['id', 'img', 'tag', 'part'\]"):
        p.predict(data, output_cols="tag")
    with pytest.raises(ColumnError, match=r"Column 'imgs' is not among the data's columns.*'img'"):
        TFDataset.from_parquet(str(root), "imgs")
    with pytest.raises(DataError, match=r"No Parquet files at .*missing.*: it does not exist"):
        TFDataset.from_parquet(str(tmp_path / "missing"), "img")
    with pytest.raises(InputSpecError, match=r"Column 'img' holds flat arrays.*feature_shapes"):
        p.predict(TFDataset.from_parquet(str(root), "img"))
    with pytest.raises(TypeError, match=r"TFPredictor.predict takes a Spark DataFrame, an RDD, a TFDataset "
                                        r"\(from_dataframe, from_rdd, from_parquet, from_delta\) or numpy arrays.*"
                                        r"Received: .*Dataset"):
        import tensorflow as tf

        p.predict(tf.data.Dataset.from_tensor_slices(images))
    with pytest.raises(TypeError, match=r"Received: builtins.NoneType"):
        p.predict(None)
    with pytest.raises(TypeError, match=r"numpy arrays \(ArrayDataset\) cannot be predicted over Spark: "
                                        r"TFPredictor.predict takes a Spark DataFrame"):
        p.predict(TFDataset.from_ndarrays(images))
    unsigned = tmp_path / "unsigned.parquet"
    pq.write_table(pa.table({"img": pa.array(images[:4].reshape(4, -1).tolist(), pa.list_(pa.float32())),
                             "count": pa.array([1, 2, 3, 4], pa.uint8())}), unsigned)
    with pytest.raises(TypeError, match=r"Parquet files at .*unsigned.parquet' has columns that a Spark DataFrame "
                                        r"cannot hold: \['count: uint8'\]; its columns: \['img', 'count'\]"):
        p.predict(TFDataset.from_parquet(str(unsigned), "img", feature_shapes={"img": (8, 8, 3)}))
    assert jobs_since(spark, before) == []
