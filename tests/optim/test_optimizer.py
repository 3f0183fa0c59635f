"""TFOptimizer on one worker: transfer learning on real data, reproducibility, checkpoints and
resume, NaN handling, TensorBoard, Keras compatibility and bad arguments."""

import glob
import os
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFDataset, TFOptimizer
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(scope="module")
def pretrained_pb(tmp_path_factory):
    """A small CNN trained on digits 0-4 (with TFOptimizer.from_keras), frozen to a .pb file."""
    x, y = digits.load(range(5))
    model = digits.cnn(classes=5)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    opt = TFOptimizer.from_keras(model)
    history = opt.optimize((x, y), epochs=8, batch_size=32, verbose=0)
    assert history["accuracy"][-1] > 0.9
    path = tmp_path_factory.mktemp("pretrained") / "digits_0_4.pb"
    path.write_bytes(opt.net.frozen_graph_def().SerializeToString())
    return str(path)


def small_net(seed=0):
    return TFNet.from_keras(digits.cnn(classes=10, seed=seed))


def data(n=300):
    x, y = digits.load()
    return x[:n], y[:n]


def test_transfer_learning_on_digits(pretrained_pb):
    body = TFNet.from_frozen_graph(pretrained_pb, "image", "logits").cut("features")
    keras.utils.set_random_seed(1)
    net = body.add_head(keras.layers.Dense(10, name="digit"), name="head")
    (xtr, ytr), (xte, yte) = digits.split(*digits.load(range(5, 10)))
    # A faster rate for the new head than for the pretrained body: per-group methods.
    methods = {"head/": optim.Adam(0.01), re.compile("^(digits|sequential)/"): optim.Adam(0.002)}
    opt = TFOptimizer(net, SCE, methods, metrics=["accuracy"])
    assert set(net.trainable) == set(net.weight_names)
    history = opt.optimize((xtr, ytr), epochs=8, batch_size=32, validation_data=(xte, yte), verbose=0)
    result = opt.evaluate((xte, yte))
    assert result["accuracy"] >= 0.95, history
    assert history["val_accuracy"][-1] == pytest.approx(result["accuracy"])
    assert np.array_equal(opt.predict(xte[:8]).argmax(1), net.forward(xte[:8]).argmax(1))


def test_same_seed_same_weights_bit_for_bit():
    x, y = data()
    runs = []
    for seed in (3, 3, 4):
        net = small_net()
        TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9)).optimize((x, y), epochs=2, batch_size=32, seed=seed, verbose=0)
        runs.append(net.get_weights())
    for k in runs[0]:
        assert np.array_equal(runs[0][k], runs[1][k]), k
    assert any(not np.array_equal(runs[0][k], runs[2][k]) for k in runs[0]), "another seed shuffles differently"


def test_resume_equals_an_uninterrupted_run(tmp_path):
    x, y = data()
    straight = small_net()
    h_straight = TFOptimizer(straight, SCE, optim.Adam(0.01), metrics=["accuracy"]).optimize(
        (x, y), epochs=2, batch_size=32, verbose=0)

    net = small_net()
    opt = TFOptimizer(net, SCE, optim.Adam(0.01), metrics=["accuracy"], model_dir=str(tmp_path))
    opt.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    again = small_net(seed=9)  # a fresh process would rebuild the net; its start does not matter
    h = TFOptimizer(again, SCE, optim.Adam(0.01), metrics=["accuracy"], model_dir=str(tmp_path)).optimize(
        (x, y), epochs=2, batch_size=32, resume=True, verbose=0)
    for k, v in straight.get_weights().items():
        assert np.array_equal(again.get_weights()[k], v), k
    assert h == h_straight


def test_resume_mid_epoch(tmp_path):
    x, y = data()
    straight = small_net()
    TFOptimizer(straight, SCE, optim.SGD(0.05, momentum=0.9), metrics=["accuracy"]).optimize(
        (x, y), epochs=2, batch_size=32, verbose=0)
    net = small_net()
    first = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), metrics=["accuracy"], model_dir=str(tmp_path))
    first.optimize((x, y), epochs=1, batch_size=32, checkpoint_every=4, keep_checkpoints=5, verbose=0)
    manager = CheckpointManager(str(tmp_path / "checkpoints"), run_id=first.last_run["run_id"])
    assert manager.all_steps() == [4, 8, 10]
    os.unlink(manager.path_for(10))  # as if the run died after step 8 of 10
    again = small_net()
    TFOptimizer(again, SCE, optim.SGD(0.05, momentum=0.9), metrics=["accuracy"], model_dir=str(tmp_path)).optimize(
        (x, y), epochs=2, batch_size=32, resume=True, verbose=0)
    for k, v in straight.get_weights().items():
        assert np.array_equal(again.get_weights()[k], v), k


def test_checkpoint_of_another_optimiser_is_refused(tmp_path):
    """Adam's moments resumed into SGD with momentum: a clear error, never a silent zip-truncation."""
    x, y = data(64)
    TFOptimizer(small_net(), SCE, optim.Adam(0.01), model_dir=str(tmp_path)).optimize(
        (x, y), epochs=1, batch_size=32, verbose=0)
    n = len(small_net().trainable)
    sgd = TFOptimizer(small_net(), SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(tmp_path))
    with pytest.raises(optim.CheckpointError,
                       match=rf"holds optimiser state of another shape \({2 * n + 2} arrays, this optimiser has {n + 2}\)"):
        sgd.optimize((x, y), epochs=2, batch_size=32, resume=True, verbose=0)


def test_corrupt_checkpoint_is_skipped(tmp_path):
    x, y = data(128)
    net = small_net()
    opt = TFOptimizer(net, SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    opt.optimize((x, y), epochs=3, batch_size=32, verbose=0)
    manager = CheckpointManager(str(tmp_path / "checkpoints"), run_id=opt.last_run["run_id"])
    assert manager.all_steps() == [4, 8, 12]
    assert not glob.glob(str(tmp_path / "checkpoints" / "*" / ".*")), "no temporary files are left behind"
    newest = manager.path_for(12)
    data_bytes = open(newest, "rb").read()
    open(newest, "wb").write(data_bytes[: len(data_bytes) // 2])  # truncated
    with pytest.warns(optim.CheckpointWarning, match=r"ckpt-000000012.npz: unreadable"):
        ckpt = manager.latest_valid()
    assert ckpt.step == 8
    # a flipped byte inside an array is caught by the checksum (or the zip CRC)
    middle = manager.path_for(8)
    raw = bytearray(open(middle, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(middle, "wb").write(bytes(raw))
    with pytest.warns(optim.CheckpointWarning):
        assert manager.latest_valid().step == 4


def torn_run(model_dir: str) -> tuple[str, str]:
    """A finished local run in ``model_dir`` (2 epochs of 4 steps: checkpoints at steps 4 and 8) whose newest
    checkpoint is then cut to half its length, as a crash in the middle of a write without atomic renames leaves
    it. Returns ``(older, truncated)``: the paths of the step-4 and step-8 checkpoints."""
    x, y = data(128)
    opt = TFOptimizer(small_net(), SCE, optim.SGD(0.05, momentum=0.9), model_dir=model_dir)
    opt.optimize((x, y), epochs=2, batch_size=32, verbose=0)
    manager = CheckpointManager(os.path.join(model_dir, "checkpoints"), run_id=opt.last_run["run_id"])
    assert manager.all_steps() == [4, 8]
    older, newest = manager.path_for(4), manager.path_for(8)
    with open(newest, "rb") as f:
        whole = f.read()
    with open(newest, "wb") as f:
        f.write(whole[: len(whole) // 2])
    return older, newest


def test_optimize_resume_passes_over_a_truncated_newest_checkpoint(tmp_path, monkeypatch):
    """``optimize(resume=True)`` in this process, the run's newest checkpoint truncated: it resumes from the one
    before (its step, and its weights and momentum bit for bit, by digest: not the new net's own weights), and one
    CheckpointWarning names the truncated file and says why."""
    from optim import optimizer as optimizer_module
    from tests.elastic_checks import checkpoint_digest

    older, truncated = torn_run(str(tmp_path))
    runs = []  # the loop's result: a local run's start digest is there (a distributed one's is in attempt_log)
    loop = optimizer_module.train
    monkeypatch.setattr(optimizer_module, "train", lambda *a, **k: runs.append(loop(*a, **k)) or runs[-1])
    x, y = data(128)
    again = TFOptimizer(small_net(seed=7), SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(tmp_path))
    with pytest.warns(optim.CheckpointWarning) as warned:
        again.optimize((x, y), epochs=3, batch_size=32, resume=True, verbose=0)
    said = [str(w.message) for w in warned if issubclass(w.category, optim.CheckpointWarning)]
    assert len(said) == 1 and f"Skipping checkpoint {truncated}: unreadable" in said[0], said
    assert again.last_run["resumed_from"] == older and again.last_run["start_step"] == 4, again.last_run
    assert runs[0].start_sha256 == checkpoint_digest(older)
    assert again.global_step == 12


def test_checkpoint_cannot_run_code(tmp_path):
    """A checkpoint is loaded with allow_pickle=False: a pickled object inside is refused."""
    path = tmp_path / "checkpoints" / "ckpt-000000001.npz"
    path.parent.mkdir()
    np.savez(path, header=np.frombuffer(b"{}", np.uint8), w00000=np.array([object()], dtype=object))
    with pytest.warns(optim.CheckpointWarning, match="unreadable"):
        assert CheckpointManager(str(tmp_path / "checkpoints")).latest_valid() is None


def _poisoned_loss(t, o):
    """Cross-entropy whose gradient is NaN (the loss itself finite) on a batch holding label 99:
    d/do sqrt(0 * o) at 0."""
    marked = tf.reduce_any(tf.equal(t, 99))
    base = SCE(tf.where(tf.equal(t, 99), tf.zeros_like(t), t), o)
    return base + tf.where(marked, tf.sqrt(tf.reduce_sum(o * 0.0)), 0.0)


def test_nan_loss_stops_with_weights_at_last_good_step():
    x, y = data(128)
    y = y.copy()
    y[70] = 99  # in the third batch of 32 when not shuffled (NaN features are refused before any step now)
    net = small_net()
    ref = small_net()
    TFOptimizer(ref, SCE, optim.SGD(0.05)).optimize((x[:64], y[:64]), epochs=1, batch_size=32, shuffle=False, verbose=0)
    opt = TFOptimizer(net, _poisoned_loss, optim.SGD(0.05))
    with pytest.raises(optim.NonFiniteLossError, match=r"Step 3 \(epoch 1, batch 3\): a gradient is NaN or infinite.*after step 2"):
        opt.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0)
    for k, v in ref.get_weights().items():
        assert np.array_equal(net.get_weights()[k], v), k
    with pytest.warns(RuntimeWarning, match="Skipped step 3"):
        history = opt.optimize((x, y), epochs=1, batch_size=32, shuffle=False, on_nonfinite="skip", verbose=0)
    assert history["skipped_steps"] == [1]
    assert all(np.isfinite(v).all() for v in net.get_weights().values())
    nan_loss = TFOptimizer(small_net(), lambda t, o: tf.reduce_mean(o) * np.float32("inf") * 0.0, optim.SGD(0.05))
    with pytest.raises(optim.NonFiniteLossError, match=r"Step 1 \(epoch 1, batch 1\): the loss is nan"):
        nan_loss.optimize((x, y), epochs=1, batch_size=32, verbose=0)


def test_tensorboard_events_are_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y = data(128)
    opt = TFOptimizer(small_net(), SCE, optim.SGD(optim.schedules.cosine(0.1, 8)), metrics=["accuracy"],
                      model_dir=str(tmp_path))
    opt.optimize((x, y), epochs=2, batch_size=32, validation_data=(x[:64], y[:64]), validate_every=2, verbose=0)
    run = tmp_path / "tensorboard" / opt.last_run["run_id"]
    train = EventAccumulator(str(run / "train"), size_guidance={"tensors": 0})
    train.Reload()
    tags = set(train.Tags()["tensors"])
    assert {"loss", "accuracy", "learning_rate", "samples_per_sec", "epoch_loss"} <= tags
    lrs = [float(tf.make_ndarray(e.tensor_proto)) for e in train.Tensors("learning_rate")]
    assert len(lrs) == 8 and lrs[0] == pytest.approx(0.1) and lrs[-1] < lrs[0]
    val = EventAccumulator(str(run / "validation"), size_guidance={"tensors": 0})
    val.Reload()
    assert [e.step for e in val.Tensors("loss")] == [2, 4, 4, 6, 8, 8]


def test_from_keras_trains_like_keras_fit():
    x, y = data(256)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="tanh", name="h"), keras.layers.Dense(10, name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    opt = TFOptimizer.from_keras(model)
    assert isinstance(opt.method, optim.SGD) and isinstance(opt.loss, optim.losses.SparseCategoricalCrossentropy)
    opt.optimize((x, y), epochs=2, batch_size=32, shuffle=False, verbose=0)
    model.fit(x, y, epochs=2, batch_size=32, shuffle=False, verbose=0)
    for v in model.trainable_variables:
        ours = opt.net.get_weights()[v.path]
        assert np.linalg.norm(ours - v.numpy()) <= 1e-4 * np.linalg.norm(v.numpy()), v.path


def test_tf_data_input_and_tfdataset():
    x, y = data(128)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    opt = TFOptimizer(small_net(), SCE, optim.Adam(0.01), metrics=["accuracy"])
    h1 = opt.optimize(ds, epochs=2, verbose=0)
    assert len(h1["loss"]) == 2 and h1["loss"][1] < h1["loss"][0]
    h2 = opt.optimize(TFDataset.from_ndarrays((x, y)), epochs=1, batch_size=16, verbose=0)
    assert set(h2) == {"loss", "accuracy"}
    assert opt.evaluate(ds)["accuracy"] == pytest.approx(opt.evaluate((x, y))["accuracy"])
    assert opt.predict(x, batch_size=50).shape == (128, 10)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(optim_method=optim.SGD(0.1), loss="crossentropy"), ValueError, r"Unknown loss 'crossentropy'"),
        (dict(optim_method=-0.1, loss=SCE), ValueError, r"`learning_rate` must be a non-negative number. Received: learning_rate=-0.1"),
        (dict(optim_method="sgd", loss=SCE), TypeError, r"`optim_method` must be an optim method"),
        (dict(optim_method={"nothing/": optim.SGD(0.1)}, loss=SCE), ValueError, r"No weight matches the `optim_method` keys"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        TFOptimizer(small_net(), metrics=None, **kwargs)


def test_bad_optimize_arguments(tmp_path):
    x, y = data(64)
    opt = TFOptimizer(small_net(), SCE, optim.SGD(0.1))
    # one-hot labels for a class-id loss: the driver's check of the label type, as for a DataFrame's column
    with pytest.raises(optim.DataError, match=r"label column 'labels' holds array<double> values \(a vector per row\), "
                                              r"and SparseCategoricalCrossentropy .* use categorical_crossentropy"):
        opt.optimize((x, np.eye(10)[y]), batch_size=32, verbose=0)
    with pytest.raises(ValueError, match=r"`epochs` must be a positive integer. Received: epochs=0"):
        opt.optimize((x, y), epochs=0)
    with pytest.raises(ValueError, match=r"`on_nonfinite` must be 'raise' or 'skip'"):
        opt.optimize((x, y), on_nonfinite="ignore")
    with pytest.raises(ValueError, match=r"`resume=True` needs a `model_dir`"):
        opt.optimize((x, y), resume=True)
    with pytest.raises(ValueError, match=r"same number of examples; received lengths \[64\] \(features\) and \[10\]"):
        opt.optimize((x, y[:10]))
    with pytest.raises(TypeError, match=r"Data must be a tuple of numpy arrays"):
        opt.optimize("data.csv")


def test_progress_bar_and_quiet_mode(capsys, monkeypatch):
    x, y = data(128)
    opt = TFOptimizer(small_net(), SCE, optim.SGD(0.05), metrics=["accuracy"])
    with monkeypatch.context() as terminal:
        terminal.setattr(sys.stderr, "isatty", lambda: True)  # as in a terminal: the bar
        opt.optimize((x, y), epochs=1, batch_size=32, verbose=1)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "4/4" in err
    assert re.search(r"loss=[\d.]+", err) and "accuracy=" in err and "samples_per_sec=" in err
    assert re.search(r"<00:00|\d+:\d+<", err), "the bar shows an ETA"
    opt.optimize((x, y), epochs=2, batch_size=32, verbose=1)  # no terminal (a log file): a line per epoch
    err = capsys.readouterr().err
    assert "\r" not in err and [line[:9] for line in err.strip().splitlines()] == ["epoch 1/2", "epoch 2/2"]
    opt.optimize((x, y), epochs=2, batch_size=32, verbose=2)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("epoch 2/2 (step")
    opt.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    assert capsys.readouterr().err == ""


def test_state_carries_over_between_local_calls_and_per_group_rate_is_logged(tmp_path):
    """Two optimize() calls of one epoch equal one call of two epochs (Adam's moments and the
    schedule's step carry over), and the logged learning rate of a per-group method is a number."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y = data(128)
    method = lambda: optim.Adam(optim.schedules.exponential(0.01, 2, 0.5))  # noqa: E731
    once = TFOptimizer(small_net(), SCE, method())
    once.optimize((x, y), epochs=2, batch_size=32, shuffle=False, verbose=0)
    twice = TFOptimizer(small_net(), SCE, method())
    for _ in range(2):
        twice.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0)
    assert once.global_step == twice.global_step == 8
    assert int(twice.state[0]) == 8, "the schedule's step count is part of the state"
    for a, b in zip(once.state, twice.state):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    for name, w in once.net.get_weights().items():
        np.testing.assert_allclose(twice.net.get_weights()[name], w, rtol=1e-5, atol=1e-6)

    net = small_net()
    head = [n for n in net.weight_names if n.startswith(net.weight_names[-1].split("/")[0])]
    grouped = TFOptimizer(net, SCE, {head[0].split("/")[0]: optim.SGD(optim.schedules.cosine(0.1, 4))},
                          model_dir=str(tmp_path))
    grouped.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    events = EventAccumulator(str(tmp_path / "tensorboard" / grouped.last_run["run_id"] / "train"),
                              size_guidance={"tensors": 0})
    events.Reload()
    lrs = [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("learning_rate")]
    assert len(lrs) == 4 and all(np.isfinite(lrs)) and lrs[0] == pytest.approx(0.1) and lrs[-1] < lrs[0]
