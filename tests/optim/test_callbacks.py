"""Keras callbacks in ``optimize(..., callbacks=[...])``, as ``model.fit`` calls them (optim.training.callbacks):
Keras's own ``EarlyStopping`` (and its ``restore_best_weights``), ``ReduceLROnPlateau``, ``TerminateOnNaN`` and
``LambdaCallback``, and a user's subclass, against what they do under ``fit``: the same epoch logs, a stop that
leaves the weights of a run planned for that many epochs, a halved rate that trains as a run at that rate."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def data(n=128):
    x, y = digits.load()
    return x[:n], y[:n]


def opt_(lr=0.05, metrics=("accuracy",)):
    return TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(lr), metrics=list(metrics))


def test_epoch_hooks_see_the_epochs_logs_as_under_fit():
    x, y = data()
    seen = []

    class Recorder(keras.callbacks.Callback):  # a user's own subclass
        def on_train_begin(self, logs=None):
            seen.append(("begin", self.params["epochs"]))

        def on_epoch_begin(self, epoch, logs=None):
            seen.append(("epoch_begin", epoch))

        def on_train_end(self, logs=None):
            seen.append(("end", sorted(logs)))

    lam = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(("epoch_end", epoch, dict(logs))))
    opt = opt_()
    history = opt.optimize((x, y), epochs=3, batch_size=32, validation_data=(x[:64], y[:64]), verbose=0,
                           callbacks=[Recorder(), lam])
    ends = [s for s in seen if s[0] == "epoch_end"]
    assert [e[1] for e in ends] == [0, 1, 2]
    for k in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert [e[2][k] for e in ends] == history[k], k
    assert seen[0] == ("begin", 3) and seen[1] == ("epoch_begin", 0)
    assert seen[-1] == ("end", ["accuracy", "loss", "val_accuracy", "val_loss"])


def test_early_stopping_leaves_the_weights_of_a_run_planned_for_that_many_epochs():
    x, y = data()
    # patience 0 and a huge min_delta: epoch 0 improves on nothing, epoch 1 cannot improve, so fit stops after it
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    early, planned = opt_(), opt_()
    history = early.optimize((x, y), epochs=6, batch_size=32, verbose=0, callbacks=[stop])
    planned.optimize((x, y), epochs=2, batch_size=32, verbose=0)
    assert len(history["loss"]) == 2 and stop.stopped_epoch == 1 and early.global_step == 8
    for name, value in early.net.get_weights().items():
        np.testing.assert_array_equal(value, planned.net.get_weights()[name])


def test_one_callback_not_in_a_list_is_taken_as_keras_fit_takes_it():
    x, y = data()
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    history = opt_().optimize((x, y), epochs=6, batch_size=32, verbose=0, callbacks=stop)
    assert len(history.history["loss"]) == 2 and stop.stopped_epoch == 1
    with pytest.raises(TypeError, match=r"^`callbacks` must be a list of keras.callbacks.Callback. Received: 'stop'$"):
        opt_().optimize((x, y), epochs=1, batch_size=32, verbose=0, callbacks="stop")


def test_restore_best_weights_returns_the_best_epochs_weights():
    x, y = data()
    kept = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: kept.append(
        (logs["val_loss"], [w.copy() for w in record.model.get_weights()])))
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    opt = opt_(lr=2.0)  # too high: the validation loss goes up and down
    opt.optimize((x, y), epochs=6, batch_size=32, validation_data=(x[:64], y[:64]), verbose=0,
                 callbacks=[record, stop])
    best = min(kept, key=lambda k: k[0])[1]
    assert stop.best_weights is not None
    for value, want in zip(opt.net.get_weights().values(), best):
        np.testing.assert_array_equal(value, want)


def test_reduce_lr_on_plateau_trains_as_a_run_at_the_reduced_rate():
    x, y = data()
    # an epoch that can never improve by 1e9: ReduceLROnPlateau halves the rate after every epoch
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e9, min_lr=0.0)
    rates = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: rates.append(
        float(record.model.optimizer.learning_rate)))
    reduced = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.1))
    reduced.optimize((x, y), epochs=3, batch_size=32, shuffle=False, verbose=0, callbacks=[plateau, record])
    # as under fit: epoch 0 improves on nothing; after epochs 1 and 2 the rate is halved
    assert rates == pytest.approx([0.1, 0.05, 0.025])
    by_hand = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.1))
    by_hand.optimize((x, y), epochs=2, batch_size=32, shuffle=False, verbose=0)
    by_hand.method = optim.SGD(0.05)  # plain SGD keeps no state: the next call goes on at the halved rate
    by_hand.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0)
    for value, want in zip(reduced.net.get_weights().values(), by_hand.net.get_weights().values()):
        np.testing.assert_array_equal(value, want)


def test_terminate_on_nan_stops_at_the_first_nan_loss_when_steps_are_skipped():
    x, y = data()
    y = y.copy()
    y[70] = 99  # batch 3 of epoch 1 (rows 64..95): the loss below makes it NaN

    def loss(labels, outputs):
        labels = tf.cast(labels, tf.int64)
        value = SCE(tf.minimum(labels, 9), outputs)
        return tf.where(tf.reduce_any(tf.equal(labels, 99)), tf.constant(np.nan), value)

    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), loss, optim.SGD(0.05))
    with pytest.warns(RuntimeWarning, match="Skipped step 3"):
        history = opt.optimize((x, y), epochs=4, batch_size=32, shuffle=False, on_nonfinite="skip",
                               verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])
    assert opt.global_step == 3 and len(history["loss"]) == 1


def test_a_callback_that_raises_stops_the_run_with_its_own_error():
    x, y = data(64)

    def boom(epoch, logs):
        raise ZeroDivisionError(f"boom at epoch {epoch}")

    with pytest.raises(ZeroDivisionError, match="boom at epoch 0"):
        opt_().optimize((x, y), epochs=3, batch_size=32, verbose=0,
                        callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=boom)])
    with pytest.raises(TypeError, match=r"`callbacks` entries must be keras.callbacks.Callback objects"):
        opt_().optimize((x, y), batch_size=32, verbose=0, callbacks=[print])
