"""Sample weights as Keras takes them: (x, y, w), `sample_weight=`, or a tf.data.Dataset of
(x, y, w). Keras's own fit and evaluate are the oracle for the weighted loss and metrics."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from tests import digits


def compiled(seed=0, outputs=1):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Dense(16, activation="tanh", name="hidden")(keras.layers.Flatten()(inp))
    outs = [keras.layers.Dense(10, name="digit")(h)] + ([keras.layers.Dense(2, name="parity")(h)] if outputs == 2 else [])
    model = keras.Model(inp, outs if outputs == 2 else outs[0])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"] if outputs == 1 else None,
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="w_accuracy")] if outputs == 1 else None)
    return model


def data(n=256):
    x, y = digits.load()
    w = np.random.default_rng(0).uniform(0.0, 3.0, n).astype(np.float32)
    w[:20] = 0.0  # some examples count for nothing
    return x[:n], y[:n], w


def test_weighted_loss_and_metrics_equal_keras():
    x, y, w = data()
    model = compiled()
    opt = TFOptimizer.from_keras(model)
    want = model.evaluate(x, y, sample_weight=w, batch_size=32, verbose=0, return_dict=True)
    got = opt.evaluate((x, y, w))
    assert got["accuracy"] == pytest.approx(want["accuracy"], rel=1e-6)  # metrics=: unweighted, as Keras's
    assert got["w_accuracy"] == pytest.approx(want["w_accuracy"], rel=1e-6)  # weighted_metrics=: weighted
    assert got["w_accuracy"] != pytest.approx(got["accuracy"], rel=1e-3)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert got["loss"] != pytest.approx(opt.evaluate((x, y))["loss"], rel=1e-3), "the weights change the loss"
    model.fit(x, y, sample_weight=w, batch_size=32, epochs=1, shuffle=False, verbose=0)
    opt.optimize((x, y), sample_weight=w, epochs=1, batch_size=32, shuffle=False, verbose=0)
    by_name = {v.path: v.numpy() for v in model.trainable_variables}
    for name, value in opt.net.get_weights().items():
        np.testing.assert_allclose(value, by_name[name], rtol=1e-4, atol=1e-6)


def test_tf_data_with_weights_and_multi_output():
    x, y, w = data(128)
    model = compiled(outputs=2)
    opt = TFOptimizer.from_keras(model)
    ds = tf.data.Dataset.from_tensor_slices((x, (y, y % 2), w)).batch(32)
    want = model.evaluate(ds, verbose=0, return_dict=True)["loss"]
    assert opt.evaluate(tf.data.Dataset.from_tensor_slices((x, (y, y % 2), w)).batch(32))["loss"] == \
        pytest.approx(want, rel=1e-5)


def test_bad_weights_are_clear_errors():
    x, y, w = data(64)
    from tfnet import TFNet

    opt = TFOptimizer(TFNet.from_keras(compiled()), "sparse_categorical_crossentropy", optim.SGD(0.1),
                      weighted_metrics=[lambda t, p: tf.reduce_mean(p)])
    with pytest.raises(TypeError, match=r"cannot weight examples \(a function of a whole batch\)"):
        opt.optimize((x, y), sample_weight=w, batch_size=32, verbose=0)
    with pytest.raises(optim.DataError, match=r"one finite, non-negative number per example"):
        opt.optimize((x, y), sample_weight=-w, batch_size=32, verbose=0)
    with pytest.raises(optim.DataError, match=r"same number of examples"):
        opt.optimize((x, y), sample_weight=w[:10], batch_size=32, verbose=0)
