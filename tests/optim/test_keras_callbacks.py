"""Every callback in ``keras.callbacks`` works as in ``fit`` or is refused before the first step (issue 51):
``ModelCheckpoint`` writes files Keras itself loads (``save_best_only`` and ``monitor`` as Keras decides them),
``BackupAndRestore`` resumes from its ``backup_dir``, Keras's ``TensorBoard`` gets tfnet's event files in its ``log_dir``,
``ReduceLROnPlateau`` leaves ``learning_rate`` in the history as Keras's ``fit`` does, and the rest are refused in one
line naming them."""

import glob
import os

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer
from optim.training.keras_callbacks import UnsupportedCallbackError
from tests.optim.keras_transfer import data, transfer_model
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def _optimizer(model_dir=None, net=None, method=None):
    return TFOptimizer(net or TFNet.from_keras(transfer_model()[0]), SCE, method or optim.SGD(0.1), model_dir=model_dir)


def test_model_checkpoint_writes_files_keras_loads(tmp_path):
    x, y = data()
    best, weights = str(tmp_path / "best.keras"), str(tmp_path / "last.weights.h5")
    opt = _optimizer()
    history = opt.optimize((x, y), epochs=3, batch_size=8, shuffle=False, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(best, monitor="loss", save_best_only=True),
        keras.callbacks.ModelCheckpoint(weights, save_weights_only=True)])
    assert history["loss"][-1] < history["loss"][0]  # the last epoch is the best: the file holds it
    loaded = keras.models.load_model(best)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), opt.net.forward(x), rtol=1e-5, atol=1e-6)
    assert [v.path for v in loaded.trainable_variables] == ["head/kernel", "head/bias"]  # Keras's flags kept
    original, _ = transfer_model()
    original.load_weights(weights)  # the user's own model takes the weights file
    np.testing.assert_allclose(original.predict(x, verbose=0), opt.net.forward(x), rtol=1e-5, atol=1e-6)


def test_model_checkpoint_of_a_net_without_keras_behind_it_is_refused_up_front(tmp_path):
    x, y = data()
    keras_net = TFNet.from_keras(transfer_model()[0])
    frozen = TFNet.from_frozen_graph(keras_net.frozen_graph_def(), keras_net.input_names, keras_net.output_names)
    opt = _optimizer(net=frozen)
    with pytest.raises(UnsupportedCallbackError, match=r"^keras.callbacks.ModelCheckpoint writes Keras's own files, "
                                                       r"and this net has no Keras model behind it"):
        opt.optimize((x, y), batch_size=8, verbose=0,
                     callbacks=[keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))])
    assert opt.global_step == 0 and not os.path.exists(tmp_path / "m.keras")


@pytest.mark.parametrize("callback, says", [
    (lambda tmp: keras.callbacks.ProgbarLogger(), r"ProgbarLogger does not run with tfnet: .*verbose=1"),
    (lambda tmp: keras.callbacks.RemoteMonitor(), r"RemoteMonitor does not run with tfnet: .*MLflowLogger"),
    (lambda tmp: keras.callbacks.SwapEMAWeights(), r"SwapEMAWeights swaps in .* needs use_ema=True"),
    (lambda tmp: keras.callbacks.SwapEMAWeights(swap_on_epoch=True), r"swap_on_epoch=True"),
    (lambda tmp: keras.callbacks.TensorBoard(str(tmp), histogram_freq=1), r"TensorBoard with histogram_freq"),
    (lambda tmp: keras.callbacks.TensorBoard(str(tmp), profile_batch=2), r"TensorBoard with profile_batch"),
])
def test_callbacks_tfnet_cannot_run_are_refused_before_the_first_step(tmp_path, callback, says):
    x, y = data(16)
    opt = _optimizer(method=optim.SGD(0.1, use_ema="swap_on_epoch" in says))
    with pytest.raises(UnsupportedCallbackError, match=says) as caught:
        opt.optimize((x, y), batch_size=8, verbose=0, callbacks=[callback(tmp_path)])
    assert len(str(caught.value).splitlines()) == 1 and opt.global_step == 0


def test_backup_and_restore_resumes_from_its_backup_dir(tmp_path):
    x, y = data()
    backup = str(tmp_path / "backup")
    whole = _optimizer()
    whole.optimize((x, y), epochs=3, batch_size=8, shuffle=False, verbose=0)
    first = _optimizer()
    first.optimize((x, y), epochs=2, batch_size=8, shuffle=False, verbose=0,
                   callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert glob.glob(os.path.join(backup, "checkpoints", "*", "ckpt-*.npz"))
    again = _optimizer()  # a new process's objects: the weights come from the backup
    again.optimize((x, y), epochs=3, batch_size=8, shuffle=False, verbose=0,
                   callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert again.last_run["resumed_from"].startswith(backup) and again.last_run["start_step"] == 16
    for k, v in whole.net.get_weights().items():
        np.testing.assert_allclose(again.net.get_weights([k])[k], v, rtol=1e-6, atol=1e-7)
    with pytest.raises(UnsupportedCallbackError, match=r"are two places for the run's checkpoints"):
        _optimizer(model_dir=str(tmp_path / "elsewhere")).optimize(
            (x, y), batch_size=8, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup)])


def test_keras_tensorboard_gets_tfnets_event_files_in_its_log_dir(tmp_path):
    import tensorflow as tf

    x, y = data(32)
    _optimizer().optimize((x, y), epochs=2, batch_size=8, verbose=0,
                          callbacks=[keras.callbacks.TensorBoard(str(tmp_path / "logs"))])
    files = glob.glob(str(tmp_path / "logs" / "**" / "events.out.tfevents.*"), recursive=True)
    tags = {v.tag for f in files for event in tf.compat.v1.train.summary_iterator(f) for v in event.summary.value}
    assert files and any("loss" in t for t in tags), (files, tags)


def test_reduce_lr_on_plateau_leaves_the_learning_rate_in_the_history_as_fit_does():
    x, y = data()

    def plateau():  # min_delta so large that every epoch after the first is a plateau: the rate halves after each
        return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0)

    reference, _ = transfer_model()
    reference.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    want = reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[plateau()]).history
    got = _optimizer().optimize((x, y), epochs=3, batch_size=8, shuffle=False, verbose=0, callbacks=[plateau()])
    assert want["learning_rate"] == pytest.approx([0.1, 0.1, 0.05])  # each epoch's rate, halved after the second
    assert got["learning_rate"] == pytest.approx(want["learning_rate"])
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)


def test_swap_ema_weights_validates_on_the_moving_average_as_fit_does():
    """``SwapEMAWeights()`` with ``use_ema``: each epoch's validation on the moving average, training going on from the
    weights themselves, and the run ending on the average, as ``fit`` gives them (history and weights within 1e-6).
    Before: refused."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(32, 4)).astype(np.float32), rng.normal(size=(32, 1)).astype(np.float32)

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(8, activation="relu", name="d1"),
                              keras.layers.Dense(1, name="d2")], name="m")
        m.compile(keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.7), "mse")
        return m

    reference = model()
    theirs = reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, validation_data=(x[:16], y[:16]),
                           callbacks=[keras.callbacks.SwapEMAWeights()]).history
    opt = TFOptimizer.from_keras(model())
    ours = opt.optimize((x, y), batch_size=8, epochs=3, shuffle=False, verbose=0, validation_data=(x[:16], y[:16]),
                        callbacks=[keras.callbacks.SwapEMAWeights()])
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, err_msg=key)
    got = opt.net.get_weights()
    for v in reference.weights:
        np.testing.assert_allclose(got[v.path], v.numpy(), atol=1e-6, err_msg=v.path)
    plain = TFOptimizer.from_keras(model()).optimize((x, y), batch_size=8, epochs=3, shuffle=False, verbose=0,
                                                     validation_data=(x[:16], y[:16]))
    assert np.abs(np.array(plain["val_loss"]) - theirs["val_loss"]).max() > 1e-3  # without it: the weights' own
