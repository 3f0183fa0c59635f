"""Every kind of bad input gets a typed error that says what was received and what was expected."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests import models
from tfnet import (
    GradientUnavailableError,
    GraphExecutionError,
    GraphLoadError,
    InputSpecError,
    InputTypeError,
    NoWeightsError,
    TensorNameError,
    TFNet,
    WeightError,
    WeightTypeError,
)


@pytest.fixture(scope="module")
def tf1():
    graph_def, _ = models.tf1_graph()
    return graph_def


@pytest.fixture(scope="module")
def pb_path(tf1, tmp_path_factory):
    path = tmp_path_factory.mktemp("pb") / "model.pb"
    path.write_bytes(tf1.SerializeToString())
    return str(path)


@pytest.fixture
def net(tf1):
    return TFNet.from_frozen_graph(tf1, "x", "logits")


# ---------------------------------------------------------------- files


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Frozen graph file not found: .*nope\.pb"):
        TFNet.from_frozen_graph(str(tmp_path / "nope.pb"), "x", "y")


def test_truncated_protobuf(pb_path, tmp_path):
    data = open(pb_path, "rb").read()
    cut = tmp_path / "cut.pb"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GraphLoadError, match=r"is not a frozen TensorFlow graph: .*truncated or corrupt"):
        TFNet.from_frozen_graph(str(cut), "x", "logits")


def test_corrupt_protobuf(pb_path, tmp_path):
    data = bytearray(open(pb_path, "rb").read())
    rng = np.random.default_rng(0)
    for i in rng.integers(0, len(data), 200):
        data[i] = rng.integers(0, 256)
    bad = tmp_path / "bad.pb"
    bad.write_bytes(bytes(data))
    with pytest.raises(GraphLoadError):
        TFNet.from_frozen_graph(str(bad), "x", "logits")


def test_random_bytes_are_not_a_graph(tmp_path):
    junk = tmp_path / "junk.pb"
    junk.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(GraphLoadError, match=r"junk\.pb.*4096 bytes.*not a frozen TensorFlow graph"):
        TFNet.from_frozen_graph(str(junk), "x", "y")


def test_text_file_is_not_a_graph(tmp_path):
    txt = tmp_path / "notes.pb"
    txt.write_text("this is not a graph\n")
    with pytest.raises(GraphLoadError, match="not a frozen TensorFlow graph"):
        TFNet.from_frozen_graph(str(txt), "x", "y")


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.pb"
    empty.write_bytes(b"")
    with pytest.raises(GraphLoadError, match="is empty"):
        TFNet.from_frozen_graph(str(empty), "x", "y")


def test_saved_model_given_as_frozen_graph(tmp_path):
    net = TFNet.from_keras(models.small_cnn())
    path = str(tmp_path / "sm")
    net.save_saved_model(path)
    with pytest.raises(GraphLoadError, match=r"SavedModel directory.*from_saved_model"):
        TFNet.from_frozen_graph(path, "img", "fc")
    with pytest.raises(GraphLoadError, match=r"SavedModel proto.*from_saved_model"):
        TFNet.from_frozen_graph(os.path.join(path, "saved_model.pb"), "img", "fc")


def test_wrong_argument_type():
    with pytest.raises(TypeError, match="Expected a path, bytes or a tf.compat.v1.GraphDef.*int"):
        TFNet.from_frozen_graph(42, "x", "y")


def test_text_graph_is_accepted(tf1, tmp_path):
    from google.protobuf import text_format

    path = tmp_path / "model.pbtxt"
    path.write_text(text_format.MessageToString(tf1))
    net = TFNet.from_frozen_graph(str(path), "x", "logits")
    assert net.weight_names[0] == "conv/w"


def test_saved_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="SavedModel directory not found"):
        TFNet.from_saved_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(GraphLoadError, match="not a SavedModel directory"):
        TFNet.from_saved_model(str(tmp_path / "empty"))
    net = TFNet.from_keras(models.small_cnn())
    net.save_saved_model(str(tmp_path / "sm"))
    with pytest.raises(TensorNameError, match=r"Unknown signature 'serving'.*'serving_default'"):
        TFNet.from_saved_model(str(tmp_path / "sm"), signature="serving")


def test_export_folder_errors(tmp_path, net):
    with pytest.raises(FileNotFoundError, match="Export folder not found"):
        TFNet.from_export_folder(str(tmp_path / "none"))
    folder = tmp_path / "export"
    net.save(str(folder))
    meta = json.loads((folder / "graph_meta.json").read_text())
    # a graph file that no longer matches its checksum is never loaded
    data = (folder / "frozen_inference_graph.pb").read_bytes()
    (folder / "frozen_inference_graph.pb").write_bytes(data[:-10])
    with pytest.raises(GraphLoadError, match="does not match the checksum"):
        TFNet.from_export_folder(str(folder))
    (folder / "graph_meta.json").write_text(json.dumps({"input_names": meta["input_names"]}))
    with pytest.raises(GraphLoadError, match=r"must have 'output_names'"):
        TFNet.from_export_folder(str(folder))
    (folder / "graph_meta.json").write_text("{not json")
    with pytest.raises(GraphLoadError, match="is not valid JSON"):
        TFNet.from_export_folder(str(folder))


# ---------------------------------------------------------------- names


def test_unknown_input_name_lists_closest(tf1):
    with pytest.raises(TensorNameError, match=r"Unknown output tensor 'logit'.*'logits'"):
        TFNet.from_frozen_graph(tf1, "x", "logit")
    with pytest.raises(TensorNameError, match=r"Unknown input tensor 'featurs'.*'features'"):
        TFNet.from_frozen_graph(tf1, "featurs", "logits")


def test_bad_tensor_name_format(tf1):
    with pytest.raises(TensorNameError, match=r"'node' or 'node:index'. Received: 'x:y'"):
        TFNet.from_frozen_graph(tf1, "x:y", "logits")


def test_unfed_placeholder(tf1):
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None, 2], name="a")
        keep = tf.compat.v1.placeholder(tf.float32, [], name="keep_prob")
        tf.identity(a * keep, name="y")
    with pytest.raises(InputSpecError, match=r"depend on placeholders \['keep_prob'\].*Add them to `inputs`"):
        TFNet.from_frozen_graph(g.as_graph_def(), "a", "y")


def test_unknown_cut_name(net):
    with pytest.raises(TensorNameError, match=r"Unknown cut tensor 'feature'.*'features'"):
        net.cut("feature")


# ---------------------------------------------------------------- inputs


def test_wrong_rank(net):
    with pytest.raises(InputSpecError, match=r"'x:0' expects rank 4 with shape \(None, 6, 6, 2\); received rank 3"):
        net.forward(np.zeros((6, 6, 2), "float32"))


def test_wrong_shape(net):
    with pytest.raises(InputSpecError, match=r"expects shape \(None, 6, 6, 2\); received shape \(1, 6, 6, 3\) \(dimension 3 is 3, expected 2\)"):
        net.forward(np.zeros((1, 6, 6, 3), "float32"))


def test_wrong_dtype(net):
    with pytest.raises(InputTypeError, match=r"'x:0' expects dtype float32.*received dtype str32"):
        net.forward(np.full((1, 6, 6, 2), "a"))
    model = models.embedding_model()
    emb = TFNet.from_keras(model)
    with pytest.raises(InputTypeError, match=r"'ids:0' expects dtype int32.*received dtype float32"):
        emb.forward([np.zeros((1, 4), "float32"), np.zeros((1, 2), "float32")])


def test_wrong_number_of_inputs():
    net = TFNet.from_keras(models.two_in_two_out())
    with pytest.raises(InputSpecError, match=r"takes 2 inputs \['a:0', 'b:0'\]; received one value"):
        net.forward(np.zeros((1, 5), "float32"))
    with pytest.raises(InputSpecError, match=r"takes 2 input\(s\).*received 3 values"):
        net.forward([np.zeros((1, 5))] * 3)
    with pytest.raises(InputSpecError, match=r"Unknown input name 'c'"):
        net.forward({"a": np.zeros((1, 5)), "c": np.zeros((1, 3))})
    with pytest.raises(InputSpecError, match=r"same batch size; received sizes \[1, 2\]"):
        net.forward([np.zeros((1, 5)), np.zeros((2, 3))])


def test_none_input(net):
    with pytest.raises(InputTypeError, match="Input 'x:0' is None"):
        net.forward(None)


def test_runtime_failure_is_wrapped():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 4], name="x")
        tf.reshape(x * tf.constant([1.0, 2.0, 3.0, 4.0], name="w"), [2, 2], name="y")
    net = TFNet.from_frozen_graph(g.as_graph_def(), "x", "y")
    with pytest.raises(GraphExecutionError, match=r"TensorFlow failed to run the graph on inputs of shapes \[\(3, 4\)\]: "
                       r"Input to reshape is a tensor with 12 values, but the requested shape has 4$"):
        net.forward(np.ones((3, 4)))  # TensorFlow's reason, not its "Graph execution error:" line


def test_backward_failures_are_typed():
    """An op without a registered gradient (``RandomGammaGrad``) is a GradientUnavailableError naming it, not
    TensorFlow's LookupError; a graph that fails at run time while differentiated is a GraphExecutionError."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        a = tf.nn.softplus(x * tf.constant([1.0, 2.0, 3.0, 4.0], name="w")) + 1.0
        tf.raw_ops.RandomGammaGrad(alpha=a, sample=a, name="y")
        tf.reshape(x * tf.constant([1.0, 2.0, 3.0, 4.0], name="v"), [2, 2], name="z")
    no_gradient = TFNet.from_frozen_graph(g.as_graph_def(), "x", "y")
    assert no_gradient.forward(np.ones((2, 4))).shape == (2, 4)  # forward still works
    with pytest.raises(GradientUnavailableError, match=r"No gradient defined for operation.*RandomGammaGrad"):
        no_gradient.backward(np.ones((2, 4)))
    fails = TFNet.from_frozen_graph(g.as_graph_def(), "x", "z")
    with pytest.raises(GraphExecutionError, match=r"failed to differentiate the graph on inputs of shapes \[\(3, 4\)\]: "
                       r"Input to reshape is a tensor with 12 values, but the requested shape has 4$"):
        fails.backward(np.ones((3, 4)))


# ---------------------------------------------------------------- weights


def test_set_weights_unknown_name(net):
    with pytest.raises(WeightError, match=r"Unknown weight 'conv/W'.*'conv/w'"):
        net.set_weights({"conv/W": np.zeros((3, 3, 2, 4))})


def test_set_weights_wrong_shape_changes_nothing(net):
    before = net.get_weights()
    with pytest.raises(WeightError, match=r"weight 'fc/w' has shape \(4, 3\); received shape \(3, 4\)"):
        net.set_weights({"conv/b": np.ones(4), "fc/w": np.zeros((3, 4))})
    after = net.get_weights()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


def test_set_weights_wrong_dtype(net):
    with pytest.raises(WeightTypeError, match=r"weight 'conv/b' takes numbers of dtype float32; received dtype str32"):
        net.set_weights({"conv/b": np.array(list("abcd"))})


def test_partial_set_weights(net):
    net.set_weights({"conv/b": np.arange(4, dtype="float64")})
    np.testing.assert_array_equal(net.get_weights(["conv/b"])["conv/b"], np.arange(4, dtype="float32"))
    assert net.get_weights()["conv/b"].dtype == np.float32


def test_trainable_errors(net):
    with pytest.raises(WeightError, match=r"No weight name starts with 'dense'"):
        net.trainable = "dense"
    with pytest.raises(WeightError, match=r"Unknown weight 'fc/x'"):
        net.trainable = ["fc/x"]
    with pytest.raises(TypeError, match="`trainable` takes a list of names"):
        net.trainable = 3


# ---------------------------------------------------------------- no weights


@pytest.fixture
def weightless():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        tf.nn.softmax(x * 2.0, name="y")
    return TFNet.from_frozen_graph(g.as_graph_def(), "x", "y")


def test_graph_without_weights_is_a_fixed_function(weightless):
    assert weightless.weight_names == []
    out = weightless.forward(np.array([[0.0, 0.0, 0.0]]))
    np.testing.assert_allclose(out, [[1 / 3] * 3], rtol=1e-6)
    # its input gradient, as Keras gives a weightless layer's (tf.GradientTape of the same softmax is the oracle)
    x = tf.constant([[0.1, -0.3, 0.7]])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.nn.softmax(x * 2.0)
    g = np.array([[1.0, 0.0, -2.0]], np.float32)
    grad_in, grad_w = weightless.backward(x.numpy(), g)
    np.testing.assert_allclose(grad_in, tape.gradient(y, x, output_gradients=tf.constant(g)).numpy(), rtol=1e-6)
    assert grad_w == {}
    with pytest.raises(NoWeightsError, match="This graph has no weights"):
        weightless.trainable = True
    with pytest.raises(NoWeightsError, match="this graph has no weights"):
        weightless.set_weights({"w": np.zeros(3)})
