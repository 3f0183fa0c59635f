"""``save_onnx`` after ``cut`` and ``add_head``: the ONNX body the outputs need, then the Keras head as
ONNX nodes, with the fine-tuned weights; checked by onnx.checker and against onnxruntime."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfnet import TFNet  # noqa: E402
from tfnet.onnx import NotOnnxNetError, OnnxExportError  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "onnx")
CNN = os.path.join(FIXTURES, "digits_cnn.onnx")
X = dict(np.load(os.path.join(FIXTURES, "digits_cnn.npz")))["in_0"]


def run_ort(path, x):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def onnx_values(path, kind):
    model = onnx.load(path)
    return [n.output[0] for n in model.graph.node if n.op_type == kind]


def sce(y, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(y, tf.int32), logits))


def test_fine_tuned_body_and_head_written_as_onnx(tmp_path):
    features = onnx_values(CNN, "Gemm")  # the classifier reads the flattened features
    flat = [n.input[0] for n in onnx.load(CNN).graph.node if n.op_type == "Gemm"][0]
    assert features
    body = TFNet.from_onnx(CNN, outputs=["logits", flat])
    keras.utils.set_random_seed(0)
    net = body.cut(body.output_names[1]).add_head(
        [keras.layers.Dense(8, activation="relu", name="hidden"), keras.layers.Dropout(0.5),
         keras.layers.Dense(3, name="scores")], name="head")
    original = net.get_weights(["features.0.weight"])["features.0.weight"]
    step = net.train_step(sce, 0.1)
    state = step.init_state()
    y = tf.constant([0, 1, 2, 1], tf.int64)
    for _ in range(3):
        state = step(tf.constant(X), y, state).state
    tuned = net.get_weights()
    assert np.abs(tuned["features.0.weight"] - original).max() > 1e-4, "the body was fine-tuned"
    path = str(tmp_path / "tuned.onnx")
    net.save_onnx(path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    want = net.forward(X)
    got = run_ort(path, X)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    written = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    np.testing.assert_array_equal(written["features.0.weight"], tuned["features.0.weight"])
    np.testing.assert_array_equal(written["head/hidden/kernel"], tuned["head/hidden/kernel"])
    assert "classifier.weight" not in written, "the cut-off classifier is not written"
    again = TFNet.from_onnx(path)
    np.testing.assert_allclose(again.forward(X), want, rtol=1e-5, atol=1e-6)
    assert again.output_names == ["head/scores:0"]


_HEADS = {
    "max_pool_flatten_gelu_batch_norm": lambda: [
        keras.layers.MaxPooling2D(2, data_format="channels_first"), keras.layers.Flatten(),
        keras.layers.Dense(5, activation="gelu"), keras.layers.BatchNormalization(), keras.layers.Softmax()],
    "global_average_tanh_leaky_sigmoid": lambda: [
        keras.layers.GlobalAveragePooling2D(data_format="channels_first"), keras.layers.Dense(4, activation="tanh"),
        keras.layers.LeakyReLU(0.2), keras.layers.Activation("sigmoid")],
    "average_pool_same_global_max_relu6_elu": lambda: [
        keras.layers.AveragePooling2D(3, 2, padding="same", data_format="channels_first"),
        keras.layers.GlobalMaxPooling2D(data_format="channels_first"), keras.layers.Dense(4, activation="relu6"),
        keras.layers.Dense(2, activation="elu")],
}


@pytest.mark.parametrize("head", sorted(_HEADS))
def test_pooling_and_activation_heads_equal_onnxruntime(tmp_path, head):
    relu = onnx_values(CNN, "Relu")[-1]  # (N, 64, 4, 4): the last feature map
    keras.utils.set_random_seed(1)
    net = TFNet.from_onnx(CNN, outputs=relu).add_head(_HEADS[head]())
    net.set_weights({k: v + 0.05 for k, v in net.get_weights().items() if k.startswith("head/")})
    path = str(tmp_path / "net.onnx")
    net.save_onnx(path)
    np.testing.assert_allclose(run_ort(path, X)[0], net.forward(X), rtol=1e-5, atol=1e-5)


def test_cut_inside_the_nhwc_body_writes_the_transpose(tmp_path):
    body = TFNet.from_onnx(CNN)
    relu = onnx_values(CNN, "Relu")[-1]
    inner = [t for t, (name, nhwc) in body.onnx_source.values.items() if name == relu and nhwc]
    assert inner, "the converter keeps that feature map in NHWC"
    keras.utils.set_random_seed(2)
    net = body.cut(inner[0]).add_head([keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    path = str(tmp_path / "net.onnx")
    net.save_onnx(path)
    np.testing.assert_allclose(run_ort(path, X)[0], net.forward(X), rtol=1e-5, atol=1e-5)
    cut = body.cut(inner[0])  # no head: the NHWC feature map itself
    cut.save_onnx(path)
    got = run_ort(path, X)[0]
    assert got.shape == (4, 4, 4, 64)
    np.testing.assert_allclose(got, cut.forward(X), rtol=1e-5, atol=1e-5)


def test_nets_from_keras_and_unsupported_head_ops_are_refused(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(NotOnnxNetError, match=r"this net was built from a TensorFlow graph.*Use net\.save\(folder\)"):
        TFNet.from_keras(model).save_onnx(str(tmp_path / "k.onnx"))
    relu = onnx_values(CNN, "Relu")[-1]
    net = TFNet.from_onnx(CNN, outputs=relu).add_head(keras.layers.Conv2D(2, 3, data_format="channels_first"))
    with pytest.raises(OnnxExportError, match=r"cannot write TensorFlow op Conv2D .*Heads of these ops are supported"):
        net.save_onnx(str(tmp_path / "c.onnx"))
    assert not os.path.exists(tmp_path / "c.onnx")


def test_sequence_heads_on_a_two_input_transformer(tmp_path):
    """Dense on a sequence (Keras's Tensordot: shapes computed at run time), LayerNormalization,
    Flatten, Reshape, 1-D pooling (ExpandDims, pool, Squeeze) and global pooling, after a body with
    integer ids and a float mask."""
    path = os.path.join(FIXTURES, "transformer.onnx")
    data = dict(np.load(os.path.join(FIXTURES, "transformer.npz")))
    inputs = [data["in_0"], data["in_1"]]
    body = TFNet.from_onnx(path, outputs="hidden")
    keras.utils.set_random_seed(3)
    heads = [[keras.layers.Dense(4, activation="softmax"), keras.layers.Flatten(), keras.layers.Dense(2)],
             [keras.layers.LayerNormalization(), keras.layers.GlobalMaxPooling1D(), keras.layers.Dense(3)],
             [keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3, activation="selu")],
             [keras.layers.MaxPooling1D(2), keras.layers.AveragePooling1D(2, padding="same"),
              keras.layers.Reshape((-1,)), keras.layers.Dense(3)],
             [keras.layers.Reshape((8, 4, 8)), keras.layers.AveragePooling2D(2), keras.layers.Flatten(),
              keras.layers.Dense(2, activation="softplus")]]
    for k, head in enumerate(heads):
        net = body.add_head(head)
        out = str(tmp_path / f"seq{k}.onnx")
        net.save_onnx(out)
        session = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["ids", "mask"]
        got = session.run(None, dict(zip(["ids", "mask"], inputs)))[0]
        np.testing.assert_allclose(got, net.forward(inputs), rtol=1e-5, atol=1e-5)


def test_batch_norm_biases_merged_with_running_means_are_untied(tmp_path):
    """At torchvision's initial values the exporter stores batch-norm biases and running means (all
    zeros) as one initializer. The bias trains, the mean stays, and the file written back holds both."""
    from tfnet.onnx.shared_stats import shared_statistics

    path = os.path.join(FIXTURES, "googlenet.onnx")
    shared = shared_statistics(onnx.load(path).graph)
    assert shared, "the fixture has initializers that are both a bias and a running mean"
    net = TFNet.from_onnx(path)
    assert all(n in net.trainable and n + "_statistic" in net.statistic_names for n in shared)
    x = dict(np.load(os.path.join(FIXTURES, "googlenet.npz")))["in_0"]
    step = net.train_step(lambda y, o: tf.reduce_mean(tf.square(o - 1.0)), 0.5)
    step(tf.constant(x), tf.zeros([2]), step.init_state())
    tuned = net.get_weights()
    original = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    name = max(shared, key=lambda n: np.abs(tuned[n] - original[n]).max())
    assert np.abs(tuned[name] - original[name]).max() > 1e-3, "the bias (or weight) trained"
    for n in shared:
        np.testing.assert_array_equal(tuned[n + "_statistic"], original[n])  # the statistic did not
    out = str(tmp_path / "tuned.onnx")
    net.save_onnx(out)
    np.testing.assert_allclose(run_ort(out, x)[0], net.forward(x), rtol=1e-5, atol=1e-6)
    written = onnx.load(out)
    stats = {i for n in written.graph.node if n.op_type == "BatchNormalization" for i in n.input[3:5]}
    assert name + "_statistic" in stats and not shared & stats
