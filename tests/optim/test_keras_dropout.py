"""Keras's dropout and noise layers while tfnet trains, as Keras's ``fit`` runs them: in training mode, drawing at the
``k``-th step the noise ``fit`` draws at its ``k``-th (tfnet.keras_training), and off in ``forward`` and evaluation.
The oracle is Keras itself: ``fit``'s weights and history, and ``model(x, training=True)``. Before, the frozen graph
was the model in inference mode and tfnet trained without them: the transfer-learning guide's head (its
``Dropout(0.2)``) ended 3.0e-2 from ``fit``'s weights after two epochs (a subclassed CNN's 0.5, 3.6e-2 after one), with no word said."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from optim.errors import KerasTrainingWarning
from tests.models import _randomise_bn
from tests.optim.keras_transfer import LR_FINE, LR_HEAD, data, max_diff, unfreeze_all_but_batch_norm
from tfnet import TFNet
from tfnet.serialize import net_from_bytes, net_to_bytes

SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def guide_model(seed=0):
    """Keras's transfer-learning guide: a frozen base (``transfer_model``'s) called with ``training=False``, then
    ``Dropout(0.2)`` and a new head."""
    keras.utils.set_random_seed(seed)
    base = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv"),
                             keras.layers.BatchNormalization(name="bn"), keras.layers.Activation("relu"),
                             keras.layers.GlobalAveragePooling2D()], name="base")
    _randomise_bn(base, seed)
    base.trainable = False
    inputs = keras.Input((8, 8, 3), name="images")
    x = keras.layers.Dropout(0.2, name="drop")(base(inputs, training=False))
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x)), base


def test_the_transfer_guides_dropout_trains_as_fit_in_both_phases():
    x, y = data(48)
    xv, yv = data(16, seed=1)
    reference, ref_base = guide_model()
    model, base = guide_model()
    fits = dict(batch_size=8, epochs=2, shuffle=False, validation_data=(xv, yv), verbose=0)
    for m in (reference, model):
        m.compile(optimizer=keras.optimizers.SGD(LR_HEAD), loss=SCE)
    theirs = reference.fit(x, y, **fits).history
    opt = TFOptimizer.from_keras(model)
    ours = opt.optimize((x, y), **fits)
    assert max_diff(opt.net, {v.path: v.numpy() for v in reference.weights}) < 1e-6
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
    assert int(opt.net.state.seed_step.numpy()) == 12
    # phase two on the same net: the base unfrozen (its batch norm not); the noise goes on from the 12 steps taken, as
    # the reference's seed generator does
    unfreeze_all_but_batch_norm(ref_base)
    unfreeze_all_but_batch_norm(base)
    reference.compile(optimizer=keras.optimizers.SGD(LR_FINE), loss=SCE)
    theirs = reference.fit(x, y, **fits).history
    opt.net.trainable = [v.path for v in model.trainable_variables]
    ours = TFOptimizer(opt.net, optim.losses.get(SCE), optim.SGD(LR_FINE)).optimize((x, y), **fits)
    assert max_diff(opt.net, {v.path: v.numpy() for v in reference.weights}) < 1e-6
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)


def every_kind():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((4, 4, 2), name="x")
    x = keras.layers.Conv2D(3, 2, activation="relu", name="conv")(inputs)
    x = keras.layers.SpatialDropout2D(0.3, name="spatial")(x)
    x = keras.layers.GaussianNoise(0.2, name="noise")(keras.layers.Reshape((3, 9))(x))
    x = keras.layers.MultiHeadAttention(2, 4, dropout=0.25, name="mha")(x, x)
    x = keras.layers.GaussianDropout(0.2, name="gdrop")(keras.layers.Flatten()(x))
    x = keras.layers.AlphaDropout(0.2, name="adrop")(keras.layers.Dense(5, activation="selu", name="d")(x))
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(keras.layers.Dropout(0.5, noise_shape=(None, 1))(x)))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def test_every_dropout_and_noise_layer_draws_fits_noise():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 4, 4, 2)).astype(np.float32), rng.normal(size=(24, 2)).astype(np.float32)
    reference = every_kind()
    theirs = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    model = every_kind()
    net = TFNet.from_keras(model)
    assert net.phase_values == {"keras_training:0": (True, False)} and net.graph.seed_inputs == ("keras_seed_offset:0",)
    np.testing.assert_allclose(net.forward(x, training=True), model(x, training=True).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.forward(x), model(x).numpy(), rtol=1e-5, atol=1e-6)  # off in forward
    assert not np.allclose(net.forward(x, training=True), net.forward(x), atol=1e-3)
    opt = TFOptimizer.from_keras(every_kind())
    ours = opt.optimize((x, y), batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert max_diff(opt.net, {v.path: v.numpy() for v in reference.weights}) < 2e-6
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5)


def test_the_step_count_travels_and_the_served_graph_needs_no_feed(tmp_path):
    x, y = data(16)
    model, _ = guide_model()
    model.compile(optimizer=keras.optimizers.SGD(LR_HEAD), loss=SCE)
    opt = TFOptimizer.from_keras(model)
    opt.optimize((x, y), batch_size=8, verbose=0)
    net = opt.net
    opt.net.save(str(tmp_path / "saved"))
    # a new head's dropout draws from its own start, as a new Keras layer's seed generator
    headed = net.cut("base").add_head([keras.layers.Dropout(0.5), keras.layers.Dense(2)])
    for other, steps in ((net_from_bytes(net_to_bytes(net)), 2), (TFNet.load(str(tmp_path / "saved")), 2),
                         (net.with_lora("head/kernel"), 2), (net.cut("drop"), 2), (headed, 0)):
        assert int(other.state.seed_step.numpy()) == steps
        assert other.forward(x, training=True).shape[0] == 16
        np.testing.assert_array_equal(other.forward(x, training=True), other.forward(x, training=True))
    np.testing.assert_allclose(TFNet.load(str(tmp_path / "saved")).forward(x, training=True),
                               net.forward(x, training=True), rtol=1e-6)
    # the graph as served: plain TensorFlow, nothing fed but the images, is the inference graph
    graph, graph_def = tf.Graph(), net.frozen_graph_def()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        served = sess.run(net.output_names[0], {net.input_names[0]: x})
    np.testing.assert_allclose(served, net.forward(x), rtol=1e-5, atol=1e-6)


def test_randomness_tfnet_does_not_draw_is_said():
    """A recurrent layer's dropout and a random augmentation layer draw in ``fit``'s training mode, and a batch norm
    with ``renorm`` renormalizes there; tfnet's step does not: a ``KerasTrainingWarning`` names them. Dropout layers,
    which it draws, and batch norms, which it trains as fit does (tests/optim/test_keras_batch_norm.py), are not
    named."""
    inputs = keras.Input((5, 3))
    lstm = keras.layers.LSTM(4, dropout=0.2, name="lstm")(keras.layers.Dropout(0.1, name="drop")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(lstm))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(KerasTrainingWarning, match=r"tfnet trains the layers \['lstm'\] in inference mode"):
        TFOptimizer.from_keras(model)
    images = keras.Input((8, 8, 3))
    flipped = keras.layers.RandomFlip(name="flip")(images)
    model = keras.Model(images, keras.layers.Dense(2)(keras.layers.Flatten()(flipped)))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(KerasTrainingWarning, match=r"\['flip'\]"):
        TFOptimizer.from_keras(model)
    model, base = guide_model()
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():  # its base frozen, its batch norm too
        warnings.simplefilter("error", KerasTrainingWarning)
        TFOptimizer.from_keras(model)
    base.trainable = True  # fit normalizes by each batch's statistics now, and so does tfnet's step (no word)
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KerasTrainingWarning)
        assert sorted(TFOptimizer.from_keras(model).net.updates.values()) == ["base/bn/moving_mean",
                                                                               "base/bn/moving_variance"]
    renorm = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(renorm=True, name="rn")])
    renorm.compile(optimizer="sgd", loss="mse")  # fit renormalizes it, which tfnet's step does not
    with pytest.warns(KerasTrainingWarning, match=r"BatchNormalization layers \['rn'\] in inference mode"):
        TFOptimizer.from_keras(renorm)


def test_a_resumed_run_goes_on_drawing_where_the_checkpoint_stopped(tmp_path):
    """A run stopped mid-epoch (``max_steps=3``) and resumed from its checkpoint by a new optimiser on a new net (a
    new process would have that): the resumed steps draw the noise of steps 3, 4, ..., as the uninterrupted ``fit``."""
    x, y = data(48)
    reference, _ = guide_model()
    reference.compile(optimizer=keras.optimizers.SGD(LR_HEAD, momentum=0.9), loss=SCE)
    reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    runs = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    for resume, stop in ((False, 3), (True, None)):
        model, _ = guide_model()
        model.compile(optimizer=keras.optimizers.SGD(LR_HEAD, momentum=0.9), loss=SCE)
        opt = TFOptimizer.from_keras(model, str(tmp_path))
        opt.optimize((x, y), max_steps=stop, resume=resume, **runs)
    assert opt.last_run["start_step"] == 3 and int(opt.net.state.seed_step.numpy()) == 12
    assert max_diff(opt.net, {v.path: v.numpy() for v in reference.weights}) < 1e-6
