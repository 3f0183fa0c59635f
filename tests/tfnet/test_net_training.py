"""Trainable selection, hooks, weight updates, cut and head, and the fused step."""

import re

import numpy as np
import pytest
import tensorflow as tf

from tests import models
from tests.models import rel_err
from tfnet import InputSpecError, TFNet, TFNetError


@pytest.fixture
def net():
    graph_def, _ = models.tf1_graph()
    return TFNet.from_frozen_graph(graph_def, "x", "logits")


X = np.random.default_rng(0).normal(size=(4, 6, 6, 2)).astype("float32")


# ---------------------------------------------------------------- trainable


def test_trainable_selection(net):
    assert net.trainable == ["conv/w", "conv/b", "bn/gamma", "bn/beta", "fc/w"]
    net.trainable = "conv/"
    assert net.trainable == ["conv/w", "conv/b"]
    net.trainable = re.compile(r"/(w|gamma)$")
    assert net.trainable == ["conv/w", "bn/gamma", "fc/w"]
    net.trainable = "bn"  # a prefix leaves the statistics frozen
    assert net.trainable == ["bn/gamma", "bn/beta"]
    net.trainable = ["bn/mean", "fc/w:0"]  # explicit names may include statistics
    assert net.trainable == ["bn/mean", "fc/w"]
    net.trainable = lambda name: name.endswith("b")
    assert net.trainable == ["conv/b"]
    net.trainable = False
    assert net.trainable == []
    net.trainable = True
    assert net.trainable == ["conv/w", "conv/b", "bn/gamma", "bn/beta", "fc/w"]


def test_backward_covers_only_trainable(net):
    net.trainable = ["fc/w"]
    _, grads = net.backward(X)
    assert list(grads) == ["fc/w"]


def test_backward_of_an_output_without_a_gradient_counts_only_the_others():
    """Two outputs, the second given ``None``: the gradients are those of ``sum(y1 * g)`` alone (a GradientTape of
    the same arithmetic is the oracle), the second output's weight gets zeros; every output ``None`` is an error."""
    rng = np.random.default_rng(1)
    w1, w2 = rng.normal(size=(3, 2)).astype("float32"), rng.normal(size=(3, 4)).astype("float32")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        tf.matmul(x, tf.constant(w1, name="w1"), name="y1")
        tf.tanh(tf.matmul(x, tf.constant(w2, name="w2")), name="y2")
    net = TFNet.from_frozen_graph(g.as_graph_def(), "x", ["y1", "y2"])
    x = rng.normal(size=(5, 3)).astype("float32")
    gy = rng.normal(size=(5, 2)).astype("float32")
    xt, v1, v2 = tf.constant(x), tf.constant(w1), tf.constant(w2)
    with tf.GradientTape() as tape:
        tape.watch([xt, v1, v2])
        y1, y2 = tf.matmul(xt, v1), tf.tanh(tf.matmul(xt, v2))
    want_x, want_1, want_2 = tape.gradient([y1, y2], [xt, v1, v2], output_gradients=[gy, tf.zeros_like(y2)])
    for grad_outputs in ([gy, None], {"y1:0": gy, "y2:0": None}):
        got_x, got_w = net.backward(x, grad_outputs)
        np.testing.assert_allclose(got_x, want_x.numpy(), rtol=1e-6)
        np.testing.assert_allclose(got_w["w1"], want_1.numpy(), rtol=1e-6)
        assert not np.any(want_2.numpy()) and not np.any(got_w["w2"])
    # both outputs: the sum of the two products
    both = net.backward(x, [gy, np.ones((5, 4), "float32")])[1]["w2"]
    np.testing.assert_allclose(both, tape_of_w2(x, w2), rtol=1e-5)
    with pytest.raises(InputSpecError, match="Every output gradient is None"):
        net.backward(x, [None, None])


def tape_of_w2(x, w2):
    v2 = tf.constant(w2)
    with tf.GradientTape() as tape:
        tape.watch(v2)
        y2 = tf.tanh(tf.matmul(tf.constant(x), v2))
    return tape.gradient(y2, v2).numpy()


# ---------------------------------------------------------------- hooks and updates


def test_forward_hook_and_removal(net):
    plain = net.forward(X)
    handle = net.register_forward_hook(lambda y: y * 2.0)
    np.testing.assert_allclose(net.forward(X), 2 * plain, rtol=1e-6)
    # backward differentiates the hooked function
    _, g2 = net.backward(X)
    handle.remove()
    _, g1 = net.backward(X)
    assert rel_err(g2["fc/w"], 2 * g1["fc/w"]) < 1e-6
    np.testing.assert_allclose(net.forward(X), plain, rtol=1e-6)


def test_gradient_hook_masks(net):
    with net.register_gradient_hook(lambda g: {k: (v if k == "fc/w" else tf.zeros_like(v)) for k, v in g.items()}):
        _, grads = net.backward(X)
        assert all(np.all(v == 0) for k, v in grads.items() if k != "fc/w")
        assert np.any(grads["fc/w"] != 0)
    _, grads = net.backward(X)
    assert np.any(grads["conv/w"] != 0)


def test_apply_updates_and_update_hook(net):
    before = net.get_weights()
    net.apply_updates({"fc/w": np.full((4, 3), 0.25)})
    np.testing.assert_allclose(net.get_weights()["fc/w"], before["fc/w"] + 0.25, rtol=1e-6)
    net.register_update_hook(lambda w: {k: tf.clip_by_value(v, -0.1, 0.1) for k, v in w.items()})
    net.apply_updates({"fc/w": np.full((4, 3), 5.0), "conv/b": np.zeros(4)})
    assert np.all(net.get_weights()["fc/w"] == np.float32(0.1))
    assert np.abs(net.get_weights()["conv/b"]).max() <= 0.1


def test_hook_must_be_callable(net):
    with pytest.raises(TypeError, match="A hook must be callable"):
        net.register_forward_hook("nope")


# ---------------------------------------------------------------- cut and head


def test_cut_keeps_weights_up_to_the_tensor(net):
    feats = net.cut("features")
    assert feats.weight_names == ["conv/w", "conv/b", "bn/gamma", "bn/beta", "bn/mean", "bn/var"]
    assert feats.output_specs[0].shape.as_list() == [None, 4]
    # the features equal what the full graph computes internally
    probe = TFNet.from_frozen_graph(net.frozen_graph_def(), "x", ["features", "logits"])
    np.testing.assert_allclose(feats.forward(X), probe.forward(X)[0], rtol=1e-6)


def test_keras_layer_names_are_cut_points():
    model = models.small_cnn()
    net = TFNet.from_keras(model)
    feats = net.cut("gap")
    import keras

    ref = keras.Model(model.input, model.get_layer("gap").output)
    x = models.random_images(3, 8)
    np.testing.assert_allclose(feats.forward(x), ref(x).numpy(), rtol=1e-5, atol=1e-6)


def test_head_is_one_net_with_all_weights(net):
    import keras

    keras.utils.set_random_seed(0)
    head = [keras.layers.Dense(8, activation="relu", name="h1"), keras.layers.Dense(5, name="h2")]
    full = net.cut("features").add_head(head, name="head")
    assert full.weight_names[-4:] == ["head/h1/kernel", "head/h1/bias", "head/h2/kernel", "head/h2/bias"]
    assert "head/h2/kernel" in full.trainable and "conv/w" in full.trainable
    feats = net.cut("features").forward(X)
    w = full.get_weights()
    ref = np.maximum(feats @ w["head/h1/kernel"] + w["head/h1/bias"], 0) @ w["head/h2/kernel"] + w["head/h2/bias"]
    np.testing.assert_allclose(full.forward(X), ref, rtol=1e-5, atol=1e-6)
    full.trainable = "head/"
    _, grads = full.backward(X)
    assert list(grads) == ["head/h1/kernel", "head/h1/bias", "head/h2/kernel", "head/h2/bias"]


def test_head_round_trips_through_save(net, tmp_path):
    import keras

    full = net.cut("features").add_head(keras.layers.Dense(3, name="cls"))
    full.trainable = "head/"
    full.save(str(tmp_path / "m"))
    again = TFNet.load(str(tmp_path / "m"))
    assert again.trainable == ["head/cls/kernel", "head/cls/bias"]
    np.testing.assert_array_equal(again.forward(X), full.forward(X))


# ---------------------------------------------------------------- fused step


def mse(targets, outputs):
    return tf.reduce_mean(tf.square(outputs - targets))


def test_fused_step_equals_explicit_methods(net):
    graph_def, _ = models.tf1_graph()
    twin = TFNet.from_frozen_graph(graph_def, "x", "logits")
    y = np.random.default_rng(1).normal(size=(4, 3)).astype("float32")
    lr = 0.1
    step = net.train_step(mse, lr)
    state = step.init_state()
    for _ in range(3):
        result = step(X, y, state)
        state = result.state
        # the same step through forward / backward / apply_updates
        out = twin.forward(X)
        dloss = 2 * (out - y) / out.size
        _, grads = twin.backward(X, dloss)
        twin.apply_updates({k: -lr * g for k, g in grads.items()})
        assert bool(result.finite)
    for k, v in twin.get_weights().items():
        assert rel_err(net.get_weights()[k], v) < 1e-5, k


def test_fused_step_runs_hooks(net):
    y = np.zeros((4, 3), "float32")
    net.register_gradient_hook(lambda g: {k: tf.clip_by_norm(v, 1e-3) for k, v in g.items()})
    net.register_update_hook(lambda w: {k: tf.clip_by_value(v, -0.5, 0.5) for k, v in w.items()})
    before = net.get_weights()
    step = net.train_step(mse, 1.0)
    step(X, y, step.init_state())
    after = net.get_weights()
    for k in net.trainable:
        delta = after[k] - np.clip(before[k], -0.5, 0.5)
        assert np.abs(after[k]).max() <= 0.5
        assert np.linalg.norm(delta) <= 1e-3 + 1e-6, k


def test_fused_step_skips_non_finite_loss(net):
    y = np.zeros((4, 3), "float32")
    step = net.train_step(lambda t, o: tf.reduce_mean(o) * np.float32("nan"), 0.1)
    before = net.get_weights()
    result = step(X, y, step.init_state())
    assert not bool(result.finite)
    for k, v in net.get_weights().items():
        np.testing.assert_array_equal(v, before[k])


def test_fused_step_notices_trainable_change(net):
    step = net.train_step(mse, 0.1)
    net.trainable = "fc/"
    with pytest.raises(TFNetError, match="trainable weights changed after this step was built"):
        step(X, np.zeros((4, 3), "float32"), step.init_state())


def test_fused_step_rejects_bad_arguments(net):
    with pytest.raises(ValueError, match=r"`learning_rate` must be positive. Received: learning_rate=-0.1"):
        net.train_step(mse, -0.1)
    with pytest.raises(TypeError, match="`transform` must have init"):
        net.train_step(mse, object())
