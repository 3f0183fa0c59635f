"""``optimize(..., class_weight={...})`` against Keras's own ``fit(..., class_weight=...)`` on the same model, data and
order: the same weights after an epoch. With sample weights too (which Keras 3's ``fit`` refuses beside
``class_weight``), each example weighs the product: Keras ``fit`` with those products as its sample weights."""

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tfnet import TFNet


def model(seed=0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(3, name="logits")])
    m.compile(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)


@pytest.mark.parametrize("with_sample_weights", [False, True])
def test_class_weight_trains_as_keras_fit(with_sample_weights):
    x, y = data()
    cw = {0: 2.0, 2: 0.5}
    sw = np.linspace(0.5, 1.5, len(x)).astype(np.float32) if with_sample_weights else None
    reference = model()
    tfnet = TFOptimizer(TFNet.from_keras(reference), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                        optim.SGD(0.1))
    if sw is None:
        reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, class_weight=cw, verbose=0)
    else:
        product = sw * np.array([cw.get(int(c), 1.0) for c in y], np.float32)
        reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, sample_weight=product, verbose=0)
    tfnet.optimize((x, y), batch_size=8, shuffle=False, class_weight=cw, sample_weight=sw, verbose=0)
    for got, want in zip(tfnet.net.get_weights().values(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain = TFOptimizer(TFNet.from_keras(model()), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                        optim.SGD(0.1))
    plain.optimize((x, y), batch_size=8, shuffle=False, sample_weight=sw, verbose=0)
    assert max(float(np.abs(a - b).max()) for a, b in zip(plain.net.get_weights().values(),
                                                           tfnet.net.get_weights().values())) > 1e-3


def test_bad_class_weights_are_clear_errors():
    x, y = data(16)
    opt = TFOptimizer(TFNet.from_keras(model()), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.SGD(0.1))
    with pytest.raises(ValueError, match=r"`class_weight` keys are class ids \(integers >= 0\). Received: 'cat'"):
        opt.optimize((x, y), batch_size=8, class_weight={"cat": 1.0}, verbose=0)
    with pytest.raises(ValueError, match=r"`class_weight` values are finite weights >= 0. Received: 1: -1.0"):
        opt.optimize((x, y), batch_size=8, class_weight={1: -1.0}, verbose=0)
    with pytest.raises(TypeError, match=r"`class_weight` must be a dict"):
        opt.optimize((x, y), batch_size=8, class_weight=[1.0, 2.0], verbose=0)


def _binary_model(seed=0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(1, activation="sigmoid", name="p")])
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    return m


def _one_hot_model(seed=0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(3, activation="softmax", name="p")])
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy")
    return m


@pytest.mark.parametrize("form", ["binary_int", "binary_float", "binary_column", "one_hot"])
def test_class_weight_for_every_label_form_keras_takes(form):
    """One sigmoid output with int, float or (n, 1) labels (the README's `class_weight={0: 1.0, 1: 5.0}` is such a
    case), and one-hot labels: the weights after an epoch are Keras's own fit's."""
    x, _ = data()
    positive = x[:, 0] > 0
    y, build, loss = {
        "binary_int": (positive.astype(np.int64), _binary_model, optim.losses.BinaryCrossentropy()),
        "binary_float": (positive.astype(np.float32), _binary_model, optim.losses.BinaryCrossentropy()),
        "binary_column": (positive.astype(np.float32)[:, None], _binary_model, optim.losses.BinaryCrossentropy()),
        "one_hot": (np.eye(3, dtype=np.float32)[positive.astype(int) + (x[:, 1] > 0.5)], _one_hot_model,
                    optim.losses.CategoricalCrossentropy()),
    }[form]
    cw = {0: 1.0, 1: 5.0} if form != "one_hot" else {0: 2.0, 2: 0.5}
    reference = build()
    opt = TFOptimizer(TFNet.from_keras(build()), loss, optim.SGD(0.1))
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, class_weight=cw, verbose=0)
    opt.optimize((x, y), batch_size=8, shuffle=False, class_weight=cw, verbose=0)
    for got, want in zip(opt.net.get_weights().values(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    unweighted = build()
    unweighted.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert max(float(np.abs(a - b).max()) for a, b in zip(unweighted.get_weights(), reference.get_weights())) > 1e-3
