"""TFNet against TensorFlow itself, on real models: forward, backward, save and reload."""

import numpy as np
import pytest
import tensorflow as tf

from tests import models
from tests.models import rel_err
from tfnet import TFNet

RTOL = 1e-4


def keras_oracle(model, inputs, grad_outputs):
    """Outputs, input gradients and weight gradients of sum(y * dy) from Keras itself."""
    xs = [tf.constant(x) for x in inputs]
    floats = [x for x in xs if x.dtype.is_floating]
    with tf.GradientTape() as tape:
        tape.watch(floats)
        ys = model(xs if len(xs) > 1 else xs[0], training=False)
        ys = tf.nest.flatten(ys)
        loss = tf.add_n([tf.reduce_sum(y * dy) for y, dy in zip(ys, grad_outputs)])
    # one backward pass for the weights and the float inputs
    grads = tape.gradient(loss, [*model.trainable_variables, *floats])
    gw, by_input = grads[:len(model.trainable_variables)], iter(grads[len(model.trainable_variables):])
    gx = [next(by_input) if x.dtype.is_floating else None for x in xs]
    weights = {v.path: tf.convert_to_tensor(g).numpy() for v, g in zip(model.trainable_variables, gw)}
    return [y.numpy() for y in ys], [None if g is None else g.numpy() for g in gx], weights


def check_against_keras(model, inputs, seed=0):
    net = TFNet.from_keras(model)
    rng = np.random.default_rng(seed)
    ys_ref = tf.nest.flatten(model(inputs if len(inputs) > 1 else inputs[0], training=False))
    dys = [rng.normal(size=y.shape).astype("float32") for y in ys_ref]
    ref_y, ref_gx, ref_gw = keras_oracle(model, inputs, dys)

    out = net.forward(inputs if len(inputs) > 1 else inputs[0])
    out = out if isinstance(out, list) else [out]
    assert len(out) == len(ref_y)
    for a, b in zip(out, ref_y):
        assert a.shape == b.shape
        assert rel_err(a, b) <= RTOL

    gx, gw = net.backward(inputs if len(inputs) > 1 else inputs[0], dys if len(dys) > 1 else dys[0])
    gx = gx if isinstance(gx, list) else [gx]
    assert sorted(gw) == sorted(ref_gw), "trainable weights must be Keras' trainable variables"
    for name, g in ref_gw.items():
        assert rel_err(gw[name], g) <= RTOL, name
    for a, b in zip(gx, ref_gx):
        if b is None:
            assert a is None
        else:
            assert rel_err(a, b) <= RTOL
    return net


@pytest.fixture(scope="module")
def resnet():
    return models.resnet50(size=32)


def test_small_cnn_matches_keras():
    model = models.small_cnn()
    net = check_against_keras(model, [models.random_images(3, 8)])
    assert net.statistic_names == ["bn/moving_variance", "bn/moving_mean"] or sorted(
        net.statistic_names
    ) == ["bn/moving_mean", "bn/moving_variance"]


def test_mobilenet_v2_matches_keras():
    model = models.mobilenet_v2(size=32)
    net = check_against_keras(model, [models.random_images(2, 32)])
    assert len(net.statistic_names) == sum("moving_" in v.path for v in model.variables)


def test_resnet50_matches_keras(resnet):
    check_against_keras(resnet, [models.random_images(2, 32)])


def test_two_inputs_two_outputs_match_keras():
    model = models.two_in_two_out()
    rng = np.random.default_rng(1)
    a = rng.normal(size=(4, 5)).astype("float32")
    b = rng.normal(size=(4, 3)).astype("float32")
    net = check_against_keras(model, [a, b])
    assert net.input_names == ["a:0", "b:0"]
    assert net.output_names == ["y1:0", "y2:0"]
    by_name = net.forward({"b": b, "a": a})
    np.testing.assert_allclose(by_name[1], model([a, b])[1].numpy(), rtol=1e-5)


def test_integer_input_embedding_matches_keras():
    model = models.embedding_model()
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 20, (6, 4)).astype("int32")
    extra = rng.normal(size=(6, 2)).astype("float32")
    net = check_against_keras(model, [ids, extra])
    gx, gw = net.backward([ids, extra], np.ones((6, 2), "float32"))
    assert gx[0] is None, "integer inputs get no gradient"
    assert gw["emb/embeddings"].shape == (20, 3)
    # int64 ids are accepted for an int32 input
    np.testing.assert_allclose(net.forward([ids.astype("int64"), extra]), net.forward([ids, extra]))


def test_tf1_graph_matches_session():
    graph_def, oracle = models.tf1_graph()
    net = TFNet.from_frozen_graph(graph_def, "x", "logits")
    assert net.weight_names == ["conv/w", "conv/b", "bn/gamma", "bn/beta", "bn/mean", "bn/var", "fc/w"]
    assert net.statistic_names == ["bn/mean", "bn/var"], "FusedBatchNorm mean/var are statistics"
    assert net.trainable == ["conv/w", "conv/b", "bn/gamma", "bn/beta", "fc/w"]
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 6, 6, 2)).astype("float32")
    dy = rng.normal(size=(5, 3)).astype("float32")
    y_ref, gx_ref, gw_ref = oracle(x, dy)
    assert rel_err(net.forward(x), y_ref) <= RTOL
    net.trainable = net.weight_names  # statistics too, when named explicitly
    gx, gw = net.backward(x, dy)
    assert rel_err(gx, gx_ref) <= RTOL
    for name, g in gw_ref.items():
        assert rel_err(gw[name], g) <= RTOL, name


def test_any_batch_size_and_chunking():
    model = models.small_cnn()
    net = TFNet.from_keras(model)
    for n in (1, 7, 33):
        x = models.random_images(n, 8, seed=n)
        np.testing.assert_allclose(net.forward(x), model(x).numpy(), rtol=1e-5, atol=1e-6)
    x = models.random_images(50, 8)
    np.testing.assert_allclose(net.forward(x, batch_size=16), net.forward(x), rtol=1e-6, atol=1e-7)


def test_fixed_batch_placeholder_is_relaxed():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 3], name="x")
        tf.matmul(x, tf.constant(np.eye(3, dtype="float32")), name="y")
    net = TFNet.from_frozen_graph(g.as_graph_def(), "x", "y")
    assert net.input_specs[0].shape.as_list() == [None, 3]
    np.testing.assert_allclose(net.forward(np.ones((4, 3))), np.ones((4, 3)))


def test_forward_returns_tensors_when_asked():
    net = TFNet.from_keras(models.small_cnn())
    out = net.forward(models.random_images(2, 8), as_tensors=True)
    assert isinstance(out, tf.Tensor)


def test_call_is_differentiable_under_tape():
    model = models.small_cnn()
    net = TFNet.from_keras(model)
    x = models.random_images(2, 8)
    with tf.GradientTape() as tape:
        tape.watch(net.trainable_variables)
        loss = tf.reduce_sum(net(x))
    grads = tape.gradient(loss, net.trainable_variables)
    _, ref = net.backward(x)
    for name, g in zip(net.trainable, grads):
        assert rel_err(g, ref[name]) <= 1e-6


def test_string_input_passes_through():
    g = tf.Graph()
    with g.as_default():
        s = tf.compat.v1.placeholder(tf.string, [None], name="s")
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        n = tf.cast(tf.strings.length(s), tf.float32)
        w = tf.constant([2.0, 3.0], name="w")
        tf.identity(tf.reduce_sum(x * w, axis=1) + n, name="y")
    net = TFNet.from_frozen_graph(g.as_graph_def(), ["s", "x"], "y")
    np.testing.assert_allclose(net.forward([np.array(["ab", "cde"]), np.ones((2, 2))]), [7.0, 8.0])
    gx, gw = net.backward([np.array(["ab", "cde"]), np.ones((2, 2))])
    assert gx[0] is None
    np.testing.assert_allclose(gx[1], [[2, 3], [2, 3]])
    np.testing.assert_allclose(gw["w"], [2.0, 2.0])


def test_intermediate_tensor_as_input():
    graph_def, _ = models.tf1_graph()
    net = TFNet.from_frozen_graph(graph_def, "x", "logits")
    head = TFNet.from_frozen_graph(graph_def, "features", "logits")
    assert head.weight_names == ["fc/w"]
    x = np.random.default_rng(0).normal(size=(2, 6, 6, 2)).astype("float32")
    feats = net.cut("features").forward(x)
    np.testing.assert_allclose(head.forward(feats), net.forward(x), rtol=1e-5, atol=1e-6)
