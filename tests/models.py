"""Small real models for tests, built in code (no downloads)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def small_cnn(input_shape=(8, 8, 3), classes=2, seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input(input_shape, name="img")
    x = keras.layers.Conv2D(4, 3, name="c1")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Activation("relu", name="relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    out = keras.layers.Dense(classes, name="fc")(x)
    model = keras.Model(inp, out)
    _randomise_bn(model, seed)
    return model


def _randomise_bn(model, seed):
    """Give batch-norm layers non-trivial statistics, so tests notice if they are ignored."""
    import keras

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            mean, var = layer.moving_mean, layer.moving_variance
            mean.assign(rng.normal(0, 0.1, mean.shape).astype("float32"))
            var.assign(rng.uniform(0.5, 1.5, var.shape).astype("float32"))


def mobilenet_v2(size=32, seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV2(
        input_shape=(size, size, 3), alpha=0.35, weights=None, classes=10
    )
    _randomise_bn(model, seed)
    return model


def resnet50(size=32, seed=0, classes=10):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.applications.ResNet50(input_shape=(size, size, 3), weights=None, classes=classes)
    _randomise_bn(model, seed)
    return model


def two_in_two_out(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    a = keras.Input((5,), name="a")
    b = keras.Input((3,), name="b")
    h = keras.layers.Concatenate(name="cat")([a, b])
    h = keras.layers.Dense(6, activation="tanh", name="hidden")(h)
    y1 = keras.layers.Dense(2, name="y1")(h)
    y2 = keras.layers.Dense(1, activation="sigmoid", name="y2")(h)
    return keras.Model([a, b], [y1, y2])


def embedding_model(vocab=20, seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    ids = keras.Input((4,), dtype="int32", name="ids")
    dense_in = keras.Input((2,), name="extra")
    e = keras.layers.Embedding(vocab, 3, name="emb")(ids)
    e = keras.layers.Flatten(name="flat")(e)
    h = keras.layers.Concatenate(name="cat")([e, dense_in])
    out = keras.layers.Dense(2, name="out")(h)
    return keras.Model([ids, dense_in], out)


def tf1_graph(seed=0):
    """A TF1-style model: placeholders, variables, a fused batch norm, frozen with
    convert_variables_to_constants. Returns (graph_def, oracle) where oracle(x, dy) gives the
    outputs and the gradients of sum(y * dy) w.r.t. every variable, from a v1 Session."""
    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 2], name="x")
        w = tf.compat.v1.get_variable("conv/w", initializer=rng.normal(0, 0.3, (3, 3, 2, 4)).astype("float32"))
        b = tf.compat.v1.get_variable("conv/b", initializer=rng.normal(0, 0.1, (4,)).astype("float32"))
        gamma = tf.compat.v1.get_variable("bn/gamma", initializer=rng.uniform(0.5, 1.5, (4,)).astype("float32"))
        beta = tf.compat.v1.get_variable("bn/beta", initializer=rng.normal(0, 0.1, (4,)).astype("float32"))
        mean = tf.compat.v1.get_variable("bn/mean", initializer=rng.normal(0, 0.1, (4,)).astype("float32"))
        var = tf.compat.v1.get_variable("bn/var", initializer=rng.uniform(0.5, 1.5, (4,)).astype("float32"))
        fc = tf.compat.v1.get_variable("fc/w", initializer=rng.normal(0, 0.3, (4, 3)).astype("float32"))
        h = tf.nn.conv2d(x, w, strides=1, padding="SAME") + b
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(h, gamma, beta, mean, var, is_training=False, name="bn/fused")
        h = tf.nn.relu(h)
        h = tf.reduce_mean(h, axis=[1, 2], name="features")
        y = tf.identity(tf.matmul(h, fc), name="logits")
        dy = tf.compat.v1.placeholder(tf.float32, [None, 3], name="dy")
        variables = [w, b, gamma, beta, mean, var, fc]
        grads = tf.gradients(y, [x] + variables, grad_ys=dy)
        # TensorFlow defines no gradient for an inference-mode FusedBatchNorm's mean and
        # variance; tfnet reports zeros there.
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, [x] + variables)]
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=graph)
    sess.run(init)
    frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
        sess, graph.as_graph_def(), ["logits"]
    )
    names = [v.op.name for v in variables]

    def oracle(xv, dyv):
        out = sess.run([y] + grads, {x: xv, dy: dyv})
        return out[0], out[1], dict(zip(names, out[2:]))

    return frozen, oracle


def random_images(n, size, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype("float32")


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))
