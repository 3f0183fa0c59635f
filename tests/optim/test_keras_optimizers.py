"""Keras's optimisers through ``TFOptimizer.from_keras`` against ``fit``: ``Adamax``, ``Nadam``, ``Lion`` and
``gradient_accumulation_steps`` and ``use_ema`` (before: refused), and ``optimizer.exclude_from_weight_decay`` (``var_names``, ``var_list``):
the weights Keras's optimiser leaves out of its decoupled weight decay (a transformer's biases and norms, as
is usual) stay out of tfnet's, decided by Keras's own rule. Before, tfnet decayed every weight: a LayerNormalization's
``gamma`` ended 0.05 (AdamW) to 0.1 (SGD with momentum) away from ``fit``'s after one epoch."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from optim import TFOptimizer


def model(optimizer, exclude):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(8, activation="relu", name="d1"),
                          keras.layers.LayerNormalization(name="ln"), keras.layers.Dense(1, name="d2")], name="m")
    exclude(optimizer, m)
    m.compile(optimizer, "mse")
    return m


def assert_trains_as_fit(make, exclude, x, y, batch_size):
    """Two epochs of Keras's fit and of tfnet from the same compiled model (``make()``'s optimiser, ``exclude``'s
    weight-decay exclusions) on the same batches: every weight within 1e-6."""
    reference = model(make(), exclude)
    reference.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    opt = TFOptimizer.from_keras(model(make(), exclude))
    opt.optimize((x, y), batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    got = opt.net.get_weights()
    for v in reference.weights:
        np.testing.assert_allclose(got[v.path], v.numpy(), atol=1e-6, err_msg=v.path)


CASES = {
    "AdamW, var_names": (lambda: keras.optimizers.AdamW(0.05, weight_decay=0.5),
                         lambda opt, m: opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])),
    "SGD with momentum, var_list": (lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.5),
                                    lambda opt, m: opt.exclude_from_weight_decay(
                                        var_list=[m.get_layer("ln").gamma, m.get_layer("d2").kernel])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_weights_keras_excludes_from_weight_decay_are_not_decayed(case):
    make, exclude = CASES[case]
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32)
    assert_trains_as_fit(make, exclude, x, y, batch_size=8)


@pytest.mark.parametrize("make", [lambda: keras.optimizers.Adamax(0.05, weight_decay=0.1),
                                  lambda: keras.optimizers.Nadam(0.05, clipnorm=1.0),
                                  lambda: keras.optimizers.Lion(0.01, weight_decay=0.5),
                                  lambda: keras.optimizers.Adadelta(1.0),
                                  lambda: keras.optimizers.Lamb(0.05, weight_decay=0.1),
                                  lambda: keras.optimizers.Adafactor(0.1, weight_decay=0.1),
                                  lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
                                  lambda: keras.optimizers.Muon(0.05, exclude_layers=["d2"]),
                                  lambda: keras.optimizers.Adam(0.05, gradient_accumulation_steps=3),
                                  lambda: keras.optimizers.SGD(0.1, momentum=0.9, use_ema=True, ema_momentum=0.8),
                                  lambda: keras.optimizers.Adam(0.05, use_ema=True, ema_overwrite_frequency=3),
                                  lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.05))],
                         ids=["Adamax", "Nadam", "Lion", "Adadelta", "Lamb", "Adafactor", "Ftrl",
                              "Muon",
                              "Adam, gradient_accumulation_steps=3", "SGD, use_ema",
                              "Adam, use_ema, ema_overwrite_frequency=3", "LossScaleOptimizer(Adam)"])
def test_every_keras_optimizer_and_gradient_accumulation_train_as_fit(make):
    """Four steps an epoch: the accumulation of 3 steps runs across the epochs' boundary, as in Keras; with use_ema the
    weights end as the moving average, as fit's end gives them."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32)
    assert_trains_as_fit(make, lambda opt, m: None, x, y, batch_size=4)


def test_use_ema_where_ranks_or_groups_would_keep_different_averages_is_refused():
    import optim
    from tfnet import TFNet

    net = TFNet.from_keras(model(keras.optimizers.SGD(0.1), lambda opt, m: None))
    x, y = np.zeros((8, 4), np.float32), np.zeros((8, 1), np.float32)
    with pytest.raises(ValueError, match=r"`use_ema` keeps one moving average of the weights, which every rank must "
                                         r"agree on: train with sync=None \(every step\), not LocalSGD"):
        TFOptimizer(net, "mse", optim.SGD(0.1, use_ema=True)).optimize((x, y), batch_size=4, verbose=0,
                                                                       sync=optim.LocalSGD(every=2))
    with pytest.raises(ValueError, match="give one method for all weights, not a dict of them"):
        TFOptimizer(net, "mse", {"m/d1/": optim.SGD(0.1, use_ema=True), "m/d2/": optim.SGD(0.1)})
    with pytest.raises(ValueError, match="Give `use_ema` or `gradient_accumulation_steps`, not both"):
        optim.Adam(use_ema=True, gradient_accumulation_steps=2)


@pytest.mark.parametrize("make", [lambda: keras.optimizers.Adafactor(0.1), lambda: keras.optimizers.Ftrl(0.1),
                                  lambda: keras.optimizers.Lamb(0.05, weight_decay=0.1)],
                         ids=["Adafactor", "Ftrl", "Lamb, weight_decay"])
def test_a_callback_cannot_set_the_rate_of_a_rule_that_is_not_rate_times_direction(make):
    """Adafactor's step is ``min(lr, 1/sqrt(t))`` times its own, FTRL solves for the weights, Lamb reads the weights
    after the rate's decay: scaling their update is not Keras's new rate, so ReduceLROnPlateau is refused up front."""
    from optim.training.keras_callbacks import UnsupportedCallbackError

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    opt = TFOptimizer.from_keras(model(make(), lambda opt, m: None))
    with pytest.raises(UnsupportedCallbackError, match="schedule"):
        opt.optimize((x, y), batch_size=4, verbose=0, callbacks=[keras.callbacks.ReduceLROnPlateau(monitor="loss")])
    assert opt.global_step == 0
    opt.optimize((x, y), batch_size=4, verbose=0, callbacks=[keras.callbacks.EarlyStopping(monitor="loss")])
    assert opt.global_step == 2


def test_schedule_free_adamw_starts_from_the_weights_as_keras_optimizer_does():
    """Keras's ScheduleFreeAdamW starts its iterate ``z`` at the weights when it is built on them (its ``build``), and
    tfnet's does so, equal to Keras's optimiser stepping the model batch by batch. Under Keras's ``fit`` ``z`` starts
    at zero (seen, not explained here), so its first step sets every weight to about ``-lr * sign(g)``, the model's
    weights lost (docs/keras.md): tfnet does not follow ``fit`` there."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32)
    make = lambda: keras.optimizers.ScheduleFreeAdamW(0.05, warmup_steps=2, weight_decay=0.1)  # noqa: E731
    reference = model(make(), lambda opt, m: None)
    reference.optimizer.build(reference.trainable_variables)
    for _ in range(2):
        for i in range(0, 16, 4):
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(y[i:i + 4], reference(x[i:i + 4]))
            grads = tape.gradient(loss, reference.trainable_variables)
            reference.optimizer.apply_gradients(zip(grads, reference.trainable_variables))
    opt = TFOptimizer.from_keras(model(make(), lambda opt, m: None))
    opt.optimize((x, y), batch_size=4, epochs=2, shuffle=False, verbose=0)
    got = opt.net.get_weights()
    for v in reference.weights:  # x is recovered by a division by beta_1 every step: float32 roundings of ~1e-6
        np.testing.assert_allclose(got[v.path], v.numpy(), atol=5e-6, err_msg=v.path)


@pytest.mark.parametrize("choose", ["map", "function"])
def test_a_multi_optimizer_trains_each_group_as_fit(choose):
    """Keras's ``MultiOptimizer`` (discriminative rates: the layers near the input slower, with another optimiser):
    an ``OptimizerMap`` of path patterns with a default, or a function of the variable, as tfnet's per-group methods,
    each sub-optimiser mapped (before: a KerasMappingError)."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32)

    def optimizer():
        slow, fast = keras.optimizers.SGD(0.02, momentum=0.9), keras.optimizers.Adam(0.05, weight_decay=0.1)
        if choose == "map":
            return keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(fast, {"m/d1/.*": slow}))
        def optimizer_selector(variable):  # as Keras's docstring writes one
            return slow if variable.path.startswith("m/d1/") else fast

        return keras.optimizers.MultiOptimizer(optimizer_selector)

    assert_trains_as_fit(optimizer, lambda opt, m: None, x, y, batch_size=4)
