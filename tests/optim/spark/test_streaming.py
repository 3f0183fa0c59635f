"""Structured Streaming inference (issue 33): TFPredictor and TFNetTransformer on a ``readStream``
DataFrame (Parquet files arriving in a folder), written to a memory sink and to a Parquet sink,
equal to ``net.forward``; a bad row stops the query with the typed error. Real local[2] Spark."""

import keras
import numpy as np
import pytest

from optim import BadRowError, TFNetTransformer, TFPredictor
from tfnet import TFNet

pytestmark = pytest.mark.spark


def _net():
    keras.utils.set_random_seed(4)
    return TFNet.from_keras(keras.Sequential([keras.Input((6,), name="x"), keras.layers.Dense(3, name="logits")]))


def test_streaming_inference_to_memory_and_parquet_sinks(spark, tmp_path):
    x = np.random.RandomState(0).randn(40, 6).astype("float32")
    schema = "id long, x array<float>"
    src = str(tmp_path / "incoming")
    for part in range(2):  # two files arrive
        spark.createDataFrame([(i, x[i].tolist()) for i in range(part * 20, part * 20 + 20)], schema) \
            .write.mode("append").parquet(src)
    net = _net()
    stream = spark.readStream.schema(schema).parquet(src)
    assert stream.isStreaming

    query = (TFPredictor(net).predict(stream, feature_cols="x").writeStream.format("memory").queryName("scored")
             .outputMode("append").trigger(availableNow=True).start())
    query.awaitTermination()
    rows = sorted(spark.sql("SELECT id, output FROM scored").collect(), key=lambda r: r.id)
    assert [r.id for r in rows] == list(range(40))
    np.testing.assert_allclose(np.array([r.output for r in rows]), net.forward(x), rtol=1e-5, atol=1e-6)

    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    stage = TFNetTransformer(net, inputCols=["x"], task="classification")
    query = (stage.transform(stream).writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    written = sorted(spark.read.parquet(out).collect(), key=lambda r: r.id)
    logits = net.forward(x)
    np.testing.assert_allclose(np.array([r.output for r in written]), logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal([r.prediction for r in written], np.argmax(logits, 1).astype(float))
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(np.array([r.probability.toArray() for r in written]),
                               softmax / softmax.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_a_bad_row_stops_a_streaming_query_with_the_typed_error(spark, tmp_path):
    src = str(tmp_path / "incoming")
    spark.createDataFrame([(0, [0.0] * 6), (1, None), (2, [1.0] * 6)], "id long, x array<float>").coalesce(1) \
        .write.parquet(src)
    stream = spark.readStream.schema("id long, x array<float>").parquet(src)
    query = (TFPredictor(_net()).predict(stream, feature_cols="x").writeStream.format("memory").queryName("bad")
             .trigger(availableNow=True).start())
    with pytest.raises(BadRowError, match=r"^Column 'x', row 1 of partition 0: the value is null"):
        query.awaitTermination()
