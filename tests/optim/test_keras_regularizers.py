"""Keras's weight regularizers (``kernel_regularizer``, ``bias_regularizer``, ...) in tfnet's training, as Keras's own
``fit`` and ``evaluate`` add them to the loss: for the trainable weights only, so a frozen base's regularizer counts
once it is unfrozen. The oracle is Keras itself: ``fit``'s weights and its history's ``loss`` and ``val_loss``, and
``model.losses``. Before, ``from_keras`` dropped every regularizer and tfnet trained 2.7e-2 away from ``fit`` on the
first such model tried. The model also has activity regularizers (their terms: ``tests/optim/test_keras_added_losses.py``).
A model that overrides ``train_step`` is refused by name."""

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer
from optim.errors import KerasMappingError
from tests.optim.keras_transfer import LR_FINE, LR_HEAD, data, max_diff, transfer_model, unfreeze_all_but_batch_norm
from tfnet import RegularizerError, TFNet, WeightError
from tfnet.serialize import net_from_bytes, net_to_bytes

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def keras_penalty(model) -> float:
    """What Keras's ``compute_loss`` adds for the weights' regularizers: those of ``model.losses`` (the trainable
    weights' ``regularizer(variable)``)."""
    return float(sum(float(keras.ops.sum(v.regularizer(v))) for v in model.trainable_weights if v.regularizer))


def fit_both(reference, net, x, y, lr: float, xv, yv):
    """Two epochs of Keras's ``fit`` and of tfnet's optimiser, plain SGD, no shuffling, with validation data: each's
    per-epoch ``loss`` and ``val_loss``, and Keras's weights by path."""
    reference.compile(optimizer=keras.optimizers.SGD(lr),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    theirs = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, validation_data=(xv, yv), verbose=0).history
    ours = TFOptimizer(net, SCE, optim.SGD(lr)).optimize((x, y), batch_size=8, epochs=2, shuffle=False,
                                                         validation_data=(xv, yv), verbose=0)
    return theirs, ours, {v.path: v.numpy() for v in reference.weights}


def test_weight_regularizers_train_as_keras_fit_in_both_phases_of_transfer_learning():
    x, y = data(48)
    xv, yv = data(24, seed=1)
    reference, _ = transfer_model(regularized=True)
    model, _ = transfer_model(regularized=True)
    net = TFNet.from_keras(model)
    assert sorted(net.regularizers) == ["base/conv/kernel", "head/bias", "head/kernel"]
    assert net.regularizers["head/bias"]["class_name"] == "L1"
    # phase one: the base frozen, so only the head's regularizers count (Keras: the trainable weights')
    assert keras_penalty(model) > 0.01
    np.testing.assert_allclose(float(net.regularization_loss()), keras_penalty(model), rtol=1e-6)
    theirs, ours, want = fit_both(reference, net, x, y, LR_HEAD, xv, yv)
    assert max_diff(net, want) < 1e-6
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5)
    np.testing.assert_allclose(ours["val_loss"], theirs["val_loss"], rtol=1e-5)
    # phase two: the base unfrozen (its batch norm not); its convolution's L2 now counts, in Keras and in tfnet
    for keras_model in (reference, model):
        unfreeze_all_but_batch_norm(keras_model.get_layer("base"))
    net.trainable = [v.path for v in model.trainable_variables]
    model.set_weights(reference.get_weights())
    np.testing.assert_allclose(float(net.regularization_loss()), keras_penalty(reference), rtol=1e-6)
    theirs, ours, want = fit_both(reference, net, x, y, LR_FINE, xv, yv)
    assert max_diff(net, want) < 1e-6
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5)
    np.testing.assert_allclose(ours["val_loss"], theirs["val_loss"], rtol=1e-5)
    # without them tfnet is that far from fit: the regularizers are what the comparison above checks
    unregularized, _ = transfer_model(regularized=True)
    plain = TFNet.from_keras(unregularized)
    plain.regularizers = {}
    TFOptimizer(plain, SCE, optim.SGD(LR_HEAD)).optimize((x, y), batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert float(np.abs(plain.get_weights(["head/kernel"])["head/kernel"] - model.get_layer("head").kernel.numpy()
                        ).max()) > 1e-3


def test_the_regularizers_go_wherever_the_net_goes(tmp_path):
    model, _ = transfer_model(regularized=True)
    net = TFNet.from_keras(model)
    net.trainable = ["base/conv/kernel", "head/kernel", "head/bias"]
    want = float(net.regularization_loss())
    conv = model.get_layer("base").get_layer("conv").kernel.numpy()
    head = model.get_layer("head")
    by_hand = (0.05 * np.square(conv).sum() + 0.02 * np.square(head.kernel.numpy()).sum()
               + 0.03 * np.abs(head.bias.numpy()).sum())
    np.testing.assert_allclose(want, by_hand, rtol=1e-6)
    net.save(str(tmp_path / "saved"))
    for other in (TFNet.load(str(tmp_path / "saved")), net_from_bytes(net_to_bytes(net))):
        assert other.regularizers == net.regularizers
        np.testing.assert_allclose(float(other.regularization_loss()), want, rtol=1e-7)
    features = net.cut("base")  # the head's weights go, the base's regularizer stays
    assert list(features.regularizers) == ["base/conv/kernel"]
    extended = features.add_head(keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.5), name="dense"),
                                 name="h2")
    assert extended.regularizers == {**features.regularizers, "h2/dense/kernel": keras.regularizers.serialize(
        keras.regularizers.L2(0.5))}
    lora = net.with_lora("head/kernel", rank=1, seed=0)  # only the adapters train: no regularizer counts
    assert lora.regularizers == net.regularizers and float(lora.regularization_loss()) == 0.0
    # set by hand, as keras.regularizers.get takes them
    net.regularizers = {"head/kernel": "l2", "base/conv/kernel": None}
    assert list(net.regularizers) == ["head/kernel"] and net.regularizers["head/kernel"]["config"] == {"l2": 0.01}
    np.testing.assert_allclose(float(net.regularization_loss()), 0.01 * np.square(head.kernel.numpy()).sum(), rtol=1e-6)
    with pytest.raises(WeightError, match="Unknown weight 'head/kernal'. Closest existing names: 'head/kernel'"):
        net.regularizers = {"head/kernal": "l2"}
    net.regularizers = {}
    assert float(net.regularization_loss()) == 0.0


@keras.saving.register_keras_serializable(package="tfnet_tests")
class SumOfCubes(keras.regularizers.Regularizer):
    """A user's own regularizer, registered as Keras asks for saving."""

    def __init__(self, factor=0.1):
        self.factor = factor

    def __call__(self, x):
        return self.factor * keras.ops.sum(keras.ops.abs(x) ** 3)

    def get_config(self):
        return {"factor": self.factor}


def small(regularizer):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,), name="x"),
                              keras.layers.Dense(4, activation="tanh", kernel_regularizer=regularizer, name="d"),
                              keras.layers.Dense(3, kernel_regularizer=keras.regularizers.OrthogonalRegularizer(0.3),
                                                 name="out")], name="m")
    model.compile(optimizer=keras.optimizers.Adam(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_registered_regularizer_of_the_user_s_own_trains_as_fit_and_an_unregistered_one_is_named():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 5)).astype(np.float32), rng.integers(0, 3, 32)
    reference = small(SumOfCubes(0.2))
    history = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history
    opt = TFOptimizer.from_keras(small(SumOfCubes(0.2)))
    assert opt.net.regularizers["m/d/kernel"]["registered_name"] == "tfnet_tests>SumOfCubes"
    ours = opt.optimize((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    got = opt.net.get_weights()
    for v in reference.weights:
        np.testing.assert_allclose(got[v.path], v.numpy(), atol=1e-5, err_msg=v.path)
    np.testing.assert_allclose(ours["loss"], history["loss"], rtol=1e-5)

    def cubes(w):  # a plain function: Keras takes it, but cannot save or rebuild it
        return 0.2 * keras.ops.sum(keras.ops.abs(w) ** 3)

    opt = TFOptimizer.from_keras(small(cubes))
    np.testing.assert_array_equal(opt.net.forward(x).shape, (32, 3))  # inference does not need it
    before = opt.net.get_weights()
    with pytest.raises(RegularizerError, match="Keras cannot rebuild the regularizer of weight 'm/d/kernel'.*"
                                               "register_keras_serializable"):
        opt.optimize((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert all(np.array_equal(before[k], v) for k, v in opt.net.get_weights().items())  # nothing trained
    with pytest.raises(RegularizerError, match="weight 'm/d/kernel'"):
        opt.net.regularizers = {"m/d/kernel": cubes}


class OwnStep(keras.Model):
    """A model that trains itself its own way (as Keras's GAN and VAE examples do)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        return {}


def test_a_model_with_its_own_train_step_is_refused_by_name():
    own = OwnStep()
    own(np.zeros((1, 4), np.float32))
    own.compile(optimizer="sgd", loss="mse")
    with pytest.raises(KerasMappingError, match="OwnStep overrides Model.train_step, which tfnet does not run"):
        TFOptimizer.from_keras(own)
