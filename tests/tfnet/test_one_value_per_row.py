"""A batch of scalars for an input of per-row shape ``(1,)``, as Keras takes it: ``net.forward`` and a training step
take ``(n,)`` where the graph wants ``(None, 1)``, with the outputs and the step Keras gives for ``(n, 1)``; a shape
that cannot fit is refused before any step, saying what would fix it."""

import keras
import numpy as np
import pytest

import optim
from tfnet import TFNet
from tfnet.errors import InputSpecError


def line_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((1,), name="x"), keras.layers.Dense(3, name="y")])


def test_forward_and_a_step_take_one_value_per_row():
    model = line_model()
    net = TFNet.from_keras(model)
    x = np.linspace(-1, 1, 8).astype(np.float32)
    np.testing.assert_array_equal(net.forward(x), model.predict(x[:, None], verbose=0))
    twin = TFNet.from_keras(line_model())
    y = np.stack([x, 2 * x, -x], axis=1)
    opt, ref = optim.TFOptimizer(net, "mse", optim.SGD(0.1)), optim.TFOptimizer(twin, "mse", optim.SGD(0.1))
    opt.optimize((x, y), batch_size=8, shuffle=False, verbose=0)
    ref.optimize((x[:, None], y), batch_size=8, shuffle=False, verbose=0)
    for value, same in zip(net.get_weights().values(), twin.get_weights().values()):  # the same weights, in order
        np.testing.assert_array_equal(value, same)
    assert not np.array_equal(list(net.get_weights().values())[0], model.get_weights()[0]), "it trained"


def test_a_shape_that_cannot_fit_is_refused_naming_the_fix():
    net = TFNet.from_keras(keras.Sequential([keras.Input((3,), name="x"), keras.layers.Dense(1)]))
    opt = optim.TFOptimizer(net, "mse", optim.SGD(0.1))
    with pytest.raises(InputSpecError, match=r"Column 'features' has rows of shape \(\), and input 'x:0' takes rows of "
                                             r"shape \(3,\) .*the column holds one value per row: make it an array "
                                             r"column"):
        opt.optimize((np.zeros(8, np.float32), np.zeros(8, np.float32)), batch_size=4, verbose=0)
    with pytest.raises(InputSpecError, match=r"Input 'x:0' expects rank 2 with shape \(None, 3\); received rank 1"):
        net.forward(np.zeros(8, np.float32))
