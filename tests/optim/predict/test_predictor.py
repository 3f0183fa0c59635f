"""TFPredictor and TFNetTransformer on a real local[2] Spark: DataFrames, RDDs, Pipelines, image
columns, OpenVINO, bad rows, and the model loaded once per Python worker."""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pytest

from optim import TFNetTransformer, TFPredictor
from optim.errors import BadRowError, ColumnError
from tests import models
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def list_column(x: np.ndarray) -> pa.Array:
    """Rows of ``x`` as a flat Arrow list column."""
    n, size = len(x), int(np.prod(x.shape[1:]))
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * size), pa.array(x.reshape(-1)))


def frame(spark, columns: dict, partitions: int = 2):
    """A DataFrame from Arrow columns, split into ``partitions`` contiguous, ordered partitions."""
    table = pa.table(columns)
    n = table.num_rows
    bounds = [round(i * n / partitions) for i in range(partitions + 1)]
    dfs = [spark.createDataFrame(table.slice(a, b - a)) for a, b in zip(bounds, bounds[1:])]
    df = dfs[0]
    for other in dfs[1:]:
        df = df.union(other)
    return df


@pytest.fixture(scope="module")
def cnn():
    return TFNet.from_keras(models.small_cnn())


@pytest.fixture(scope="module")
def images():
    return models.random_images(1000, 8, seed=3)


def test_dataframe_equals_forward_keeps_columns_and_order(spark, cnn, images):
    n = len(images)
    df = frame(spark, {"id": pa.array(np.arange(n)), "tag": pa.array([f"r{i}" for i in range(n)]),
                       "img": list_column(images)}, partitions=2)
    p = TFPredictor(cnn, batch_per_thread=32)
    out = p.predict(df)
    assert out.columns == ["id", "tag", "img", "output"]
    rows = out.collect()
    assert [r.id for r in rows] == list(range(n))  # order kept within (ordered) partitions
    assert rows[7].tag == "r7" and np.allclose(rows[7].img, images[7].ravel())
    got = np.array([r.output for r in rows], np.float32)
    want = cnn.forward(images)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = p.stats()
    # batch_per_thread rows per model call: 500 rows per partition -> 16 calls each
    assert stats["calls"] == 2 * math.ceil(500 / 32) and stats["max_rows"] == 32 and stats["rows"] == n
    # where the workers' time went, summed over them: every part ran, and the engine's part is what a timer around
    # forward alone says (TensorFlow here: well over the microseconds Arrow's reading and writing take a batch)
    seconds = stats["seconds"]
    assert seconds["engine"] > 0 and seconds["read"] > 0 and seconds["write"] > 0
    assert seconds["engine"] > seconds["write"]

    # A second predict, on one partition: the broadcast is reused, and no worker loads twice.
    again = p.predict(df.coalesce(1)).select("id", "output").collect()
    got = np.array([r.output for r in again], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = p.stats()
    assert stats["rows"] == 2 * n
    assert stats["loads"] and set(stats["loads"].values()) == {1}, stats["loads"]  # once per Python worker
    assert len(stats["loads"]) <= 4 < stats["calls"]


def test_only_the_feature_columns_go_to_python(spark, images):
    """The model runs on the feature columns alone; the other columns stay in Spark. A column that Arrow cannot
    carry (an ``interval``) is kept as it is: when every column went through Python (``mapInArrow``), such a
    DataFrame failed with pyspark's ``NOT_IMPLEMENTED``. A dotted column name is a name, not a struct field, and two
    columns of one name (as a join leaves them) stay as they were."""
    from pyspark.sql import functions as F

    keras_model = models.small_cnn()
    n = 40
    df = frame(spark, {"id": pa.array(np.arange(n)), "img": list_column(images[:n])}).select(
        "id", F.expr("make_interval(0, 0, 0, id + 1, 0, 0, 0)").alias("waited"), F.lit("a").alias("tag"),
        F.col("img").alias("in.img"), F.lit("b").alias("tag"))
    out = TFPredictor(TFNet.from_keras(keras_model), batch_per_thread=16).predict(df, feature_cols="in.img")
    assert out.columns == ["id", "waited", "tag", "in.img", "tag", "output"]
    rows = out.withColumn("waited", F.col("waited").cast("string")).collect()  # no interval in Python
    assert [r.id for r in rows] == list(range(n)) and [r.waited for r in rows] == [f"{i + 1} days" for i in range(n)]
    assert {(r[2], r[4]) for r in rows} == {("a", "b")}
    np.testing.assert_allclose(np.array([r.output for r in rows], np.float32),  # Keras's own answer
                               keras_model(images[:n], training=False).numpy(), rtol=1e-5, atol=1e-6)


def test_several_inputs_nested_and_scalar_columns(spark):
    net = TFNet.from_keras(models.two_in_two_out())
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(60, 5)), rng.normal(size=(60, 3)).astype("float32")
    df = spark.createDataFrame([(i, a[i].tolist(), b[i].tolist()) for i in range(60)],
                               "id long, a_values array<double>, b_values array<float>").coalesce(2)
    p = TFPredictor(net, batch_per_thread=7)
    out = p.predict(df, feature_cols={"b": "b_values", "a": "a_values"}, output_cols=["logits", "prob"])
    assert out.columns == ["id", "a_values", "b_values", "logits", "prob"]
    rows = sorted(out.collect(), key=lambda r: r.id)
    want = net.forward([a.astype("float32"), b])
    np.testing.assert_allclose([r.logits for r in rows], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r.prob for r in rows], want[1], rtol=1e-5, atol=1e-6)

    with pytest.raises(ColumnError, match=r"Unknown column 'c'.*for input 'a:0'"):
        p.predict(df, feature_cols=["c", "b_values"])


def test_pipeline_save_and_load(spark, cnn, images, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import SQLTransformer

    x = images[:40]
    df = frame(spark, {"id": pa.array(np.arange(40)), "pixels": list_column(x)})
    stages = [SQLTransformer(statement="SELECT id, pixels AS features FROM __THIS__"),
              TFNetTransformer(cnn, inputCols=["features"], outputCols=["logits"], batchPerThread=8)]
    assert isinstance(stages[1], TFNetTransformer) and stages[1].getInputCols() == ["features"]
    model = Pipeline(stages=stages).fit(df)
    want = cnn.forward(x)
    got = np.array([r.logits for r in sorted(model.transform(df).collect(), key=lambda r: r.id)], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    path = str(tmp_path / "pipeline")
    model.write().overwrite().save(path)
    assert os.path.exists(os.path.join(path, "stages", "1_" + stages[1].uid, "model", "frozen_inference_graph.pb"))
    loaded = PipelineModel.load(path)
    stage = loaded.stages[1]
    assert isinstance(stage, TFNetTransformer) and stage.uid == stages[1].uid
    assert stage.getOrDefault(stage.batchPerThread) == 8 and stage.getOutputCols() == ["logits"]
    got = np.array([r.logits for r in sorted(loaded.transform(df).collect(), key=lambda r: r.id)], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_image_columns_decode_and_resize(spark):
    import sklearn.datasets
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    net = TFNet.from_keras(models.small_cnn(input_shape=(48, 64, 3)))
    folder = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    files = spark.read.format("binaryFile").option("pathGlobFilter", "*.jpg").load(folder)
    out = TFPredictor(net, batch_per_thread=2).predict(files, feature_cols=["content"]).collect()
    reference = load_sample_images()  # decoded by Pillow
    by_name = {os.path.basename(f): img for f, img in zip(reference.filenames, reference.images)}
    pixels = np.stack([by_name[os.path.basename(r.path)] for r in out])
    want = net.forward(tf.image.resize(pixels, (48, 64)).numpy())
    np.testing.assert_allclose([r.output for r in out], want, rtol=1e-4, atol=1e-5)

    pngs = [tf.io.encode_png(img).numpy() for img in reference.images]
    df = spark.createDataFrame([(i, bytearray(b)) for i, b in enumerate(pngs)], "id long, png binary")
    got = sorted(TFPredictor(net).predict(df, feature_cols="png").collect(), key=lambda r: r.id)
    want = net.forward(tf.image.resize(np.stack(reference.images), (48, 64)).numpy())
    np.testing.assert_allclose([r.output for r in got], want, rtol=1e-4, atol=1e-5)


def test_raw_uint8_pixels_reach_the_engine_as_uint8(spark):
    """A binary column of raw uint8 pixels crosses Arrow and reaches the engine at a byte a value, and the engine
    casts it inside its model (TensorFlow's graph, OpenVINO's pre-processing): the outputs equal ``net.forward`` of
    the float32 pixels, and the bytes handed to the engine are a quarter of an array column's. (A net of its own:
    the workers keep an engine per model, and the other tests count their own loads.)"""
    cnn = TFNet.from_keras(models.small_cnn(seed=5))
    x = np.random.default_rng(5).integers(0, 256, (120, 8, 8, 3)).astype(np.uint8)
    df = frame(spark, {"id": pa.array(np.arange(120)), "raw": pa.array([p.tobytes() for p in x], pa.binary()),
                       "img": list_column(x.astype(np.float32))})
    want = cnn.forward(x.astype(np.float32))
    for backend, tol in (("tensorflow", 1e-6), ("openvino", 1e-4)):
        fed = {}
        for column in ("raw", "img"):
            p = TFPredictor(cnn, batch_per_thread=20, backend=backend)
            got = np.array([r.output for r in p.predict(df, feature_cols=column).collect()], np.float32)
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{backend} {column}")
            fed[column] = p.stats()["input_bytes"]
        assert fed == {"raw": x.size, "img": 4 * x.size}, (backend, fed)


def test_arrow_batches_of_16_mib_in_tfnets_session_and_full_model_calls_across_them(spark):
    """Rows of 1 MiB (512x512 floats), 24 a partition: tfnet's session (build_session) has Spark cut each partition
    into Arrow batches of at most 16 MiB, where Spark's 64 MiB sent it whole; the model still runs on 7 rows a call,
    across the batches' boundaries (4 calls a partition: 7, 7, 7, 3), and each row's output is its own mean."""
    import keras

    from optim.spark.session import ARROW_BATCH_BYTES, ARROW_BATCH_BYTES_KEY

    assert spark.conf.get(ARROW_BATCH_BYTES_KEY) == ARROW_BATCH_BYTES == "16m"
    net = TFNet.from_keras(keras.Sequential([keras.Input((512, 512, 1)), keras.layers.GlobalAveragePooling2D()]))
    x = np.random.default_rng(3).uniform(0, 1, (48, 512, 512, 1)).astype(np.float32)
    df = spark.createDataFrame(pa.table({"id": pa.array(np.arange(48)), "image": list_column(x)})).repartition(2)
    predictor = TFPredictor(net, batch_per_thread=7)
    rows = predictor.predict(df, feature_cols="image").select("id", "output").collect()
    got = np.array([r.output for r in sorted(rows, key=lambda r: r.id)])
    np.testing.assert_allclose(got, x.mean(axis=(1, 2)), rtol=1e-5)
    stats = predictor.stats()
    assert stats["arrow_batches"] >= 4, stats  # 2 or more a partition (Spark's default: 1)
    assert (stats["calls"], stats["rows"], stats["max_rows"]) == (8, 48, 7), stats


def test_openvino_backend_over_spark(spark, cnn, images):
    x = images[:200]
    df = frame(spark, {"id": pa.array(np.arange(200)), "img": list_column(x)})
    p = TFPredictor(cnn, batch_per_thread=16, backend="openvino")
    assert p.backend == "openvino"
    got = np.array([r.output for r in p.predict(df).collect()], np.float32)  # ordered partitions
    np.testing.assert_allclose(got, cnn.forward(x), rtol=1e-4, atol=1e-4)
    assert set(p.stats()["loads"].values()) == {1}


def test_bad_rows(spark, cnn, images):
    import sklearn.datasets

    x = images[:6]
    rows = [(i, x[i].ravel().tolist()) for i in range(6)]
    rows[2] = (2, None)
    rows[4] = (4, x[4].ravel().tolist()[:100])
    df = spark.createDataFrame(rows, "id long, img array<float>").coalesce(1)

    with pytest.raises(BadRowError, match=r"^Column 'img', row 2 of partition 0: the value is null\. "
                                        r"Fix or filter the row, or pass on_error='null'"):
        TFPredictor(cnn, batch_per_thread=4).predict(df).collect()

    lenient = TFPredictor(cnn, batch_per_thread=4, on_error="null")
    out = lenient.predict(df).collect()  # one partition: in order
    assert [r.output is None for r in out] == [False, False, True, False, True, False]
    assert out[2].prediction_error == "column 'img': the value is null"
    assert out[4].prediction_error == "column 'img': the array has 100 values; input 'img:0' needs 192 (per-row shape (8, 8, 3))"
    good = [0, 1, 3, 5]
    np.testing.assert_allclose([out[i].output for i in good], cnn.forward(x[good]), rtol=1e-5, atol=1e-6)
    assert all(out[i].prediction_error is None for i in good)

    # an undecodable image, among good ones
    net = TFNet.from_keras(models.small_cnn(input_shape=(16, 16, 3)))
    jpeg = open(os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", "china.jpg"), "rb").read()
    images_df = spark.createDataFrame([(0, bytearray(jpeg)), (1, bytearray(b"not an image")), (2, None)],
                                      "id long, data binary").coalesce(1)
    with pytest.raises(BadRowError, match=r"^Column 'data', row 1 of partition 0: the image could not be "
                                        r"decoded \(12 bytes"):
        TFPredictor(net).predict(images_df, feature_cols="data").collect()
    out = TFPredictor(net, on_error="null", error_col="why").predict(images_df, feature_cols="data").collect()
    assert out[0].output is not None and out[0].why is None
    assert out[1].output is None and out[1].why.startswith("column 'data': the image could not be decoded")
    assert out[2].why == "column 'data': the value is null"


def test_rdd(spark, cnn, images):
    x = images[:100]
    p = TFPredictor(cnn, batch_per_thread=16)
    out = p.predict(spark.sparkContext.parallelize(list(x), 3)).collect()
    np.testing.assert_allclose(np.stack(out), cnn.forward(x), rtol=1e-5, atol=1e-6)

    net = TFNet.from_keras(models.two_in_two_out())
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(20, 5)).astype("float32"), rng.normal(size=(20, 3)).astype("float32")
    rows = [(a[i], b[i]) for i in range(20)] + [(a[0], b[0][:2])]
    lenient = TFPredictor(net, batch_per_thread=6, on_error="null")
    out = lenient.predict(spark.sparkContext.parallelize(rows, 2)).collect()
    assert out[-1] is None  # the bad element
    want = net.forward([a, b])
    np.testing.assert_allclose(np.stack([o[0] for o in out[:-1]]), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack([o[1] for o in out[:-1]]), want[1], rtol=1e-5, atol=1e-6)

    strict = TFPredictor(net, batch_per_thread=6)
    with pytest.raises(BadRowError, match=r"^Row 10 of partition 1: input 'b:0' needs per-row shape \(3,\); "
                                        r"received shape \(2,\)"):
        strict.predict(spark.sparkContext.parallelize(rows, 2)).collect()
