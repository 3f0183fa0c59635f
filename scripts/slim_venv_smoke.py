"""What the cluster image's slimmed venv must still do, run by that venv's Python with the repository
on its path (scripts/slim_venv_replica.sh): Spark (parquet, ORC, a Spark ML vector column and an
evaluator), tfnet fine-tuning from a DataFrame on 2 Horovod ranks, TFPredictor on OpenVINO, an ONNX
model, a Spark Connect server. Prints one line per part; any failure raises."""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def spark_parts(spark) -> None:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import Vectors

    tmp = tempfile.mkdtemp()
    df = spark.range(100).selectExpr("id", "cast(id % 3 as double) as label", "cast(id as string) as s")
    df.write.parquet(f"{tmp}/p")
    df.write.orc(f"{tmp}/o")
    assert spark.read.parquet(f"{tmp}/p").count() == 100 and spark.read.orc(f"{tmp}/o").count() == 100
    v = spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 1.0, 1.0), (Vectors.dense([3.0, 4.0]), 0.0, 1.0)],
                              ["v", "label", "prediction"])
    assert v.select(vector_to_array("v").alias("a")).collect()[1].a == [3.0, 4.0]
    assert MulticlassClassificationEvaluator(metricName="accuracy").evaluate(v) == 0.5
    print("spark: parquet, ORC, Spark ML vectors and an evaluator ok", flush=True)


def tfnet_parts(spark) -> None:
    import numpy as np

    import optim
    from optim import TFDataset, TFOptimizer, TFPredictor
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i])) for i in range(256)],
                               "pixels array<float>, label long")
    net = TFNet.from_keras(digits.cnn(classes=10))
    opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05))
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    history = opt.optimize(data, epochs=2, batch_size=32, num_workers=2, verbose=0)
    assert history["loss"][1] < history["loss"][0], history
    print(f"tfnet on 2 Horovod ranks ok: loss {history['loss']}", flush=True)
    predictor = TFPredictor(net, backend="openvino")
    assert predictor.backend == "openvino"
    np.testing.assert_allclose(predictor.predict(x[:64]), net.forward(x[:64]), rtol=1e-4, atol=1e-4)
    assert len(predictor.predict(df, feature_cols="pixels").collect()) == 256
    print("TFPredictor on OpenVINO ok", flush=True)
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ones = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(TFNet.from_onnx(model).forward(ones), ones @ w, rtol=1e-5)
    print("TFNet.from_onnx ok", flush=True)


def connect_part() -> None:
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote("local[2]").getOrCreate()
    assert session.range(10).count() == 10
    session.stop()
    print("a Spark Connect server and client ok", flush=True)


def main() -> None:
    from tests.spark_utils import local_spark

    spark = local_spark(2)
    spark_parts(spark)
    tfnet_parts(spark)
    spark.stop()
    connect_part()


if __name__ == "__main__":
    main()
