"""Multi-output nets as Keras compiles them: one loss applied to every output, a list or a dict of
losses, loss_weights; Keras's own evaluate and fit are the oracles. Labels are checked before the
first step."""

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests import digits

SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def two_output_model(loss, loss_weights=None, seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Dense(16, activation="tanh", name="hidden")(keras.layers.Flatten()(inp))
    model = keras.Model(inp, [keras.layers.Dense(10, name="digit")(h), keras.layers.Dense(2, name="parity")(h)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, loss_weights=loss_weights)
    return model


def data(n=256):
    x, y = digits.load()
    return x[:n], [y[:n], y[:n] % 2]


@pytest.mark.parametrize("loss, weights", [
    (SCE, None),                                   # one loss: Keras applies it to each output
    ([SCE, SCE], [0.3, 2.0]),
    ({"digit": SCE, "parity": SCE}, {"digit": 1.0, "parity": 0.25}),
], ids=["one-loss", "list", "dict"])
def test_from_keras_maps_the_losses_and_equals_keras(loss, weights):
    x, y = data()
    model = two_output_model(loss, weights)
    opt = TFOptimizer.from_keras(model)
    ky = {"digit": y[0], "parity": y[1]} if isinstance(loss, dict) else y  # Keras takes a dict for a dict of losses
    keras_loss = model.evaluate(x, ky, batch_size=32, verbose=0, return_dict=True)["loss"]
    assert opt.evaluate((x, y))["loss"] == pytest.approx(keras_loss, rel=1e-5)
    # one epoch of SGD without shuffling equals Keras's fit
    model.fit(x, ky, batch_size=32, epochs=1, shuffle=False, verbose=0)
    opt.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0)
    by_name = {v.path: v.numpy() for v in model.trainable_variables}
    for name, w in opt.net.get_weights().items():
        np.testing.assert_allclose(w, by_name[name], rtol=1e-4, atol=1e-6)


def test_label_arrays_are_counted_and_shaped_before_the_first_step():
    x, y = data(64)
    opt = TFOptimizer.from_keras(two_output_model(SCE))
    before = opt.net.get_weights()
    with pytest.raises(optim.LabelShapeError, match=r"has 2 outputs \['digit:0', 'parity:0'\]; it needs one label "
                                                    r"array per output, a list in that order. Received: 3"):
        opt.optimize((x, [y[0], y[1], y[1]]), batch_size=32, verbose=0)
    with pytest.raises(optim.DataError, match=r"label column 'labels\[1\]' holds array<double> values \(a vector per "
                                              r"row\), and SparseCategoricalCrossentropy \(output parity:0\)"):
        opt.optimize((x, [y[0], np.zeros((64, 3))]), batch_size=32, verbose=0)
    assert all(np.array_equal(before[k], v) for k, v in opt.net.get_weights().items()), "nothing trained"
    with pytest.raises(ValueError, match=r"Unknown output 'colour' in the loss or loss_weights dict. Outputs: "
                                         r"\['digit:0', 'parity:0'\]"):
        TFOptimizer(opt.net, {"colour": "mse"}, optim.SGD(0.1))
    with pytest.raises(ValueError, match=r"one loss per output \(2: \['digit:0', 'parity:0'\]\). Received: 3"):
        TFOptimizer(opt.net, ["mse"] * 3, optim.SGD(0.1))
