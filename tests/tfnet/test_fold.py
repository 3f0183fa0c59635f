"""Batch-norm folding in the graph that runs: the same function and gradients, fewer passes."""

import numpy as np
import pytest
import tensorflow as tf

from tests import models
from tests.models import rel_err
from tfnet import TFNet


def both(build):
    """The same model as a folded and an unfolded TFNet."""
    folded = build(True)
    plain = build(False)
    return folded, plain


def assert_same_function(folded, plain, x, tol=1e-5):
    y1, y2 = folded.forward(x), plain.forward(x)
    assert rel_err(y1, y2) <= tol
    dy = np.random.default_rng(0).normal(size=np.shape(y1)).astype("float32")
    gx1, gw1 = folded.backward(x, dy)
    gx2, gw2 = plain.backward(x, dy)
    assert rel_err(gx1, gx2) <= tol
    assert sorted(gw1) == sorted(gw2)
    for k in gw1:
        assert rel_err(gw1[k], gw2[k]) <= tol, k


def test_keras_conv_bias_batchnorm_is_folded():
    model = models.small_cnn()
    folded, plain = both(lambda f: TFNet.from_keras(model, fold_batch_norm=f))
    assert folded.graph.folded == 1
    assert plain.graph.folded == 0
    assert_same_function(folded, plain, models.random_images(3, 8))
    # what is saved is the original graph, not the folded one
    ops = {n.op for n in folded.frozen_graph_def().node}
    assert "Rsqrt" in ops


def test_depthwise_and_pointwise_are_folded():
    model = models.mobilenet_v2(size=32)
    folded, plain = both(lambda f: TFNet.from_keras(model, fold_batch_norm=f))
    n_bn = sum(1 for layer in model.layers if "BatchNormalization" in type(layer).__name__)
    assert folded.graph.folded == n_bn
    assert_same_function(folded, plain, models.random_images(2, 32))


def test_dense_batchnorm_is_folded():
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    h = keras.layers.Dense(5, name="d")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    out = keras.layers.Activation("tanh")(h)
    model = keras.Model(inp, out)
    models._randomise_bn(model, 1)
    folded, plain = both(lambda f: TFNet.from_keras(model, fold_batch_norm=f))
    assert folded.graph.folded == 1
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    assert_same_function(folded, plain, x)


def _tf1_fused(bias: bool, extra_use: bool = False):
    rng = np.random.default_rng(0)
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 5, 5, 3], name="x")
        w = tf.constant(rng.normal(0, 0.3, (3, 3, 3, 4)).astype("float32"), name="w")
        h = tf.nn.conv2d(x, w, 1, "SAME")
        if bias:
            h = tf.nn.bias_add(h, tf.constant(rng.normal(0, 0.1, 4).astype("float32"), name="b"))
        c = lambda name, v: tf.constant(v.astype("float32"), name=name)
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            h, c("gamma", rng.uniform(0.5, 1.5, 4)), c("beta", rng.normal(0, 0.1, 4)),
            c("mean", rng.normal(0, 0.1, 4)), c("var", rng.uniform(0.5, 1.5, 4)), is_training=False,
        )
        y = tf.nn.relu(y)
        if extra_use:
            y = y + tf.reduce_mean(h)
        tf.identity(y, name="y")
    return g.as_graph_def()


@pytest.mark.parametrize("bias", [True, False])
def test_tf1_fused_batch_norm_is_folded(bias):
    gd = _tf1_fused(bias)
    folded, plain = both(lambda f: TFNet.from_frozen_graph(gd, "x", "y", fold_batch_norm=f))
    assert folded.graph.folded == 1
    assert "FusedBatchNormV3" not in {n.op for n in folded.graph.compute_template.node}
    assert_same_function(folded, plain, np.random.default_rng(2).normal(size=(2, 5, 5, 3)).astype("float32"))


def test_conv_output_used_elsewhere_is_left_alone():
    gd = _tf1_fused(True, extra_use=True)
    net = TFNet.from_frozen_graph(gd, "x", "y")
    assert net.graph.folded == 0


def _residual_chain(bias_not_bn: bool):
    """Three blocks of ``x + BN(Conv(relu(x)))`` (Xception's middle flow, NASNet's cells): each sum is read by the next
    block's Relu and by its sum. With ``bias_not_bn`` the convolutions have a bias and no batch norm follows them:
    the ops a fold makes of the other, as a Keras user writes them."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 8))
    x = inp
    for _ in range(3):
        y = layers.Conv2D(8, 3, padding="same", use_bias=bias_not_bn)(layers.Activation("relu")(x))
        x = layers.Add()([y if bias_not_bn else layers.BatchNormalization()(y), x])
    model = keras.Model(inp, layers.Dense(3)(layers.GlobalAveragePooling2D()(x)))
    models._randomise_bn(model, 1)
    return model


def test_a_batch_norm_before_a_sum_read_past_the_next_activation_is_folded_and_its_bias_guarded():
    """Folded there, the ops are what TensorFlow's remapper breaks on: the three batch norms fold, and the first two
    blocks' biases (their sums read by the next Relu and sum) run as ``AddV2`` (tfnet.remapper_guard), the last's
    (its sum read by the pooling alone) as ``BiasAdd``; the same function and gradients. tests/tfnet/
    test_remapper_guard.py runs its first backward in a fresh process: no error."""
    model = _residual_chain(bias_not_bn=False)
    folded, plain = both(lambda f: TFNet.from_keras(model, fold_batch_norm=f))
    assert folded.graph.folded == 3 and folded.graph.guarded_biases == 2
    assert plain.graph.folded == 0 and plain.graph.guarded_biases == 0
    assert_same_function(folded, plain, np.random.default_rng(3).normal(size=(2, 6, 6, 8)).astype("float32"))


def test_a_batch_norm_before_a_sum_with_one_reader_is_folded():
    """ResNet's blocks: the sum's one reader is the Relu (which the next block's shortcut reads), so the remapper's
    fusion is sound and the folded biases stay ``BiasAdd``."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 8))
    x = inp
    for _ in range(2):
        y = layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same", use_bias=False)(x))
        x = layers.Activation("relu")(layers.Add()([y, x]))
    model = keras.Model(inp, layers.GlobalAveragePooling2D()(x))
    models._randomise_bn(model, 1)
    folded, plain = both(lambda f: TFNet.from_keras(model, fold_batch_norm=f))
    assert folded.graph.folded == 2 and folded.graph.guarded_biases == 0
    assert_same_function(folded, plain, np.random.default_rng(4).normal(size=(2, 6, 6, 8)).astype("float32"))
