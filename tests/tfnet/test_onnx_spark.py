"""A PyTorch-exported CNN, pretrained on digits 0-4 by scripts/export_onnx_fixtures.py, fine-tuned
on digits 5-9 over Spark local[2] with two Horovod ranks, then served with TFPredictor (TensorFlow and
OpenVINO backends)."""

import os
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import optim  # noqa: E402
from examples import digits  # noqa: E402
from optim import TFDataset, TFOptimizer, TFPredictor  # noqa: E402
from tfnet import TFNet  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

MODEL = os.path.join(os.path.dirname(__file__), "..", "fixtures", "onnx", "digits_cnn.onnx")


def sce(y, logits):
    import tensorflow as tf

    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(tf.reshape(y, [-1]), tf.int32), logits))


def test_pytorch_cnn_fine_tuned_on_new_digits_over_two_ranks(spark, tmp_path):
    import keras

    model = onnx.load(MODEL)
    features = [n for n in model.graph.node if n.op_type == "Gemm"][-1].input[0]  # what the classifier reads
    body = TFNet.from_onnx(MODEL, outputs=features)
    keras.utils.set_random_seed(1)
    net = body.add_head(keras.layers.Dense(5, name="digit"), name="head")
    x, y = digits.load(range(5, 10))
    x = x.transpose(0, 3, 1, 2)  # PyTorch's NCHW
    (xtr, ytr), (xte, yte) = digits.split(x, y - 5)
    df = spark.createDataFrame(
        [(xtr[i].ravel().tolist(), int(ytr[i])) for i in range(len(xtr))], "pixels array<float>, label long"
    ).repartition(2)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (1, 8, 8)})
    opt = TFOptimizer(net, sce, {"head/": optim.Adam(0.01), re.compile(r"^features\."): optim.Adam(0.001)},
                      metrics=["accuracy"], model_dir=str(tmp_path / "run"))
    history = opt.optimize(data, epochs=6, batch_size=32, validation_data=(xte, yte), num_workers=2, verbose=0)
    accuracy = float(np.mean(np.argmax(net.forward(xte), 1) == yte))
    assert accuracy >= 0.95, (accuracy, history)
    assert opt.last_run["attempts"] == 1

    # serving the fine-tuned net: TensorFlow and OpenVINO backends over the same DataFrame
    test_df = spark.createDataFrame([(i, xte[i].ravel().tolist()) for i in range(len(xte))],
                                    "id long, pixels array<float>").coalesce(2)
    want = net.forward(xte)
    for backend in ("tensorflow", "openvino"):
        rows = TFPredictor(net, batch_per_thread=32, backend=backend).predict(test_df, feature_cols="pixels").collect()
        got = np.array([r.output for r in sorted(rows, key=lambda r: r.id)], np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=backend)
