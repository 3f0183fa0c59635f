"""uint8 pixels into a float input: forward and a training step take them into the graph as they are and cast
them there (a quarter of the bytes cross to the graph), with the results of the float32 pixels bit for bit, and
Keras's own model and ``model.fit`` as the oracle."""

import numpy as np
import pytest
import tensorflow as tf

from tfnet import TFNet
from tfnet.inputs import NARROW_DTYPES

pytestmark = pytest.mark.timeout(300)


def pixel_model():
    """A CNN as Keras users write one for 0-255 pixels: its first layer rescales them."""
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Conv2D(4, 3),
                             keras.layers.ReLU(), keras.layers.Flatten(),
                             keras.layers.Dense(3)])


def pixels(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 3)).astype(np.uint8)


def graph_input_dtypes(fn, *args) -> list:
    """The dtypes of the placeholders of ``fn``'s graph for ``args`` (a tf.function), and whether it casts."""
    graph = fn.get_concrete_function(*args).graph
    ops = graph.get_operations()
    return [op.outputs[0].dtype for op in ops if op.type == "Placeholder"], \
        [(op.inputs[0].dtype, op.outputs[0].dtype) for op in ops if op.type == "Cast"]


def test_forward_takes_uint8_into_the_graph_and_casts_it_there():
    model = pixel_model()
    net = TFNet.from_keras(model)
    name = net.input_names[0]
    assert net.input_dtypes == {name: ("float32",) + NARROW_DTYPES}
    x = pixels(37)
    got = net.forward(x)
    np.testing.assert_array_equal(got, net.forward(x.astype(np.float32)))  # the same arithmetic after the cast
    np.testing.assert_allclose(got, model(x.astype(np.float32)).numpy(), rtol=1e-5, atol=1e-5)  # Keras's own
    compiled = [k for k in net.state.compiled if k[0] == "pure"]
    assert ("pure", False, (tf.uint8,)) in compiled, compiled
    placeholders, casts = graph_input_dtypes(net.pure_function(False, [tf.uint8]), [tf.constant(x)],
                                             net.state.weight_values())
    assert placeholders[0] == tf.uint8 and (tf.uint8, tf.float32) in casts

    # chunks (batch_size) and the same call twice reuse the one uint8 function; int32 is converted before (no
    # narrow dtype: int32 is not exact in float32)
    np.testing.assert_array_equal(net.forward(x, batch_size=10)[:10], net.forward(x[:10]))
    np.testing.assert_array_equal(net.forward(x.astype(np.int32)), got)
    assert [k for k in net.state.compiled if k[0] == "pure"] == compiled

    # backward and the Keras layer road convert as before: a float gradient for the input
    grad_input, _ = net.backward(x[:4])  # one input: its gradient
    assert grad_input.dtype == np.float32 and grad_input.shape == (4, 8, 8, 3) and np.abs(grad_input).max() > 0
    np.testing.assert_array_equal(grad_input, net.backward(x[:4].astype(np.float32))[0])


def test_a_training_step_on_uint8_equals_the_float32_one_and_keras_fit():
    import keras

    import optim

    x, y = pixels(64, seed=1), np.random.default_rng(2).integers(0, 3, 64)
    nets = {kind: TFNet.from_keras(pixel_model()) for kind in ("uint8", "float32")}
    steps = {kind: net.train_step(optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05))
             for kind, net in nets.items()}
    for b in range(0, 64, 16):
        for kind, step in steps.items():
            step.run(x[b:b + 16].astype(kind), y[b:b + 16])
    trained = list(nets["uint8"].weight_variables.values())
    assert not np.array_equal(trained[0].numpy(), pixel_model().weights[0].numpy())  # the steps moved the kernel
    for var, other in zip(trained, nets["float32"].weight_variables.values()):
        np.testing.assert_array_equal(var.numpy(), other.numpy(), err_msg=var.name)
    signature = steps["uint8"]._compiled(True).pretty_printed_concrete_signatures()
    assert "dtype=tf.uint8" in signature and "dtype=tf.float32, name=None)" not in signature.split("\n")[0], signature

    # Keras's own fit on the float pixels, one epoch of the same batches in order: the same weights
    model = pixel_model()
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x.astype(np.float32), y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    want = TFNet.from_keras(model).weight_variables.values()
    for var, other in zip(trained, want):
        np.testing.assert_allclose(var.numpy(), other.numpy(), rtol=1e-4, atol=1e-5, err_msg=var.name)
