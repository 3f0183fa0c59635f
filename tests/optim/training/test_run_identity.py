"""Run identity in one process: every optimize() call is a run with its own checkpoint folder;
runs sharing a model_dir never prune or load each other's files unless asked; resume by run id or
checkpoint path; stale temporaries are swept; a checkpoint that cannot be written stops the run."""

import os
import time

import numpy as np
import pytest

import optim
import optim.training.checkpoint
from optim import TFOptimizer
from optim.training.checkpoint import CheckpointManager, list_runs, new_run_id, resolve_resume
from tests import digits
from tfnet import TFNet
from tfnet.atomic import sweep_stale_temporaries, write_bytes_atomic

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def small_net(seed=0):
    return TFNet.from_keras(digits.cnn(classes=10, seed=seed))


def data(n=128):
    x, y = digits.load()
    return x[:n], y[:n]


def test_runs_side_by_side_keep_their_own_and_resume_picks_by_name(tmp_path):
    x, y = data()
    root = str(tmp_path / "checkpoints")
    a = TFOptimizer(small_net(0), SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    a.optimize((x, y), epochs=3, batch_size=32, keep_checkpoints=1, verbose=0)
    b = TFOptimizer(small_net(1), SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    b.optimize((x, y), epochs=1, batch_size=32, keep_checkpoints=1, verbose=0)
    run_a, run_b = a.last_run["run_id"], b.last_run["run_id"]
    assert run_a != run_b and list_runs(root) == sorted([run_a, run_b])
    assert CheckpointManager(root, run_id=run_a).all_steps() == [12], "run b's keep=1 did not prune run a"
    assert CheckpointManager(root, run_id=run_b).all_steps() == [4]
    assert CheckpointManager.load(CheckpointManager(root, run_id=run_a).path_for(12)).extra["run_id"] == run_a

    # resume=True: the newest run (b, at step 4); resume=<run a>: run a (at step 12)
    newest = TFOptimizer(small_net(2), SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    newest.optimize((x, y), epochs=2, batch_size=32, resume=True, verbose=0)
    assert newest.last_run["resumed_from"].endswith(os.path.join(run_b, "ckpt-000000004.npz"))
    assert newest.last_run["start_step"] == 4 and newest.global_step == 8
    named = TFOptimizer(small_net(2), SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    named.optimize((x, y), epochs=4, batch_size=32, resume=run_a, verbose=0)
    assert named.last_run["start_step"] == 12 and named.global_step == 16
    # ... which equals run a made 4 epochs long in one go
    straight = TFOptimizer(small_net(0), SCE, optim.SGD(0.05))
    straight.optimize((x, y), epochs=4, batch_size=32, verbose=0)
    for k, w in straight.net.get_weights().items():
        np.testing.assert_array_equal(named.net.get_weights()[k], w)
    # a checkpoint path, also without model_dir
    path = CheckpointManager(root, run_id=run_b).path_for(4)
    by_path = TFOptimizer(small_net(3), SCE, optim.SGD(0.05))
    by_path.optimize((x, y), epochs=2, batch_size=32, resume=path, verbose=0)
    assert by_path.last_run["resumed_from"] == path and by_path.global_step == 8
    for k, w in newest.net.get_weights().items():
        np.testing.assert_array_equal(by_path.net.get_weights()[k], w)


def test_resume_errors_name_what_exists(tmp_path):
    x, y = data(64)
    opt = TFOptimizer(small_net(), SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    opt.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    run = opt.last_run["run_id"]
    with pytest.raises(optim.CheckpointError, match=rf"resume='20200101-000000-000000-abcd': no checkpoint of that run .*{run}"):
        opt.optimize((x, y), resume="20200101-000000-000000-abcd", verbose=0)
    with pytest.raises(optim.CheckpointError, match=rf"resume='nope' is neither a run id .* nor a checkpoint file.*{run}"):
        opt.optimize((x, y), resume="nope", verbose=0)
    with pytest.raises(TypeError, match=r"`resume` must be a bool, a run id or a checkpoint path. Received: resume=3"):
        opt.optimize((x, y), resume=3, verbose=0)
    assert resolve_resume(str(tmp_path / "empty"), True) == (None, f"a fresh start (resume=True, but "
                                                                  f"{tmp_path / 'empty'} holds no run's checkpoint)")


def test_a_retry_prefers_its_own_run():
    """The rule a retried stage relies on: the run's own newest checkpoint first, whatever resume says."""
    import tempfile

    root = tempfile.mkdtemp()
    own, other = new_run_id(), "20200101-000000-000000-abcd"
    for run in (own, other):
        os.makedirs(os.path.join(root, run))
        open(os.path.join(root, run, "ckpt-000000001.npz"), "wb").close()
    assert resolve_resume(root, True, own)[0] == own
    assert resolve_resume(root, False, own)[0] == own
    assert resolve_resume(root, other, own)[0] == own
    later = new_run_id()  # a retry of a run with no checkpoint yet: resume=True takes the newest other run
    assert resolve_resume(root, True, later)[0] == own and resolve_resume(root, False, later)[0] is None


def test_stale_temporaries_are_swept_at_the_next_write(tmp_path):
    import socket
    import subprocess

    host = socket.gethostname().replace(".", "_")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".tmp-{host}.{dead.pid}.abc"  # a killed writer on this host
    old = tmp_path / ".tmp-otherhost.1.abc"  # another host's, 20 minutes old
    live = tmp_path / f".tmp-{host}.{os.getpid()}.abc"  # a writer still running
    fresh = tmp_path / ".tmp-otherhost.2.abc"
    for p in (stale, old, live, fresh):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 1200, time.time() - 1200))
    assert sorted(sweep_stale_temporaries(str(tmp_path))) == sorted([str(stale), str(old)])
    assert live.exists() and fresh.exists()
    write_bytes_atomic(str(tmp_path / "x.bin"), b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, fresh.name, "x.bin"])

    run = new_run_id()
    folder = tmp_path / "checkpoints" / run
    folder.mkdir(parents=True)
    (folder / f".tmp-{host}.{dead.pid}.zzz").write_bytes(b"half a checkpoint")
    x, y = data(64)
    net = small_net()
    manager = CheckpointManager(str(tmp_path / "checkpoints"), run_id=run)
    manager.save(optim.training.checkpoint.Checkpoint(2, 1, 0, net.get_weights(), []))
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-000000002.npz"]


def test_a_checkpoint_that_cannot_be_written_stops_the_run(tmp_path):
    x, y = data(64)
    (tmp_path / "checkpoints").write_text("a file where the checkpoint folder should be")
    opt = TFOptimizer(small_net(), SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    with pytest.raises(optim.CheckpointError, match=r"Cannot write the checkpoint .*ckpt-000000002.npz \((FileExistsError|NotADirectoryError)"):
        opt.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    assert not optim.CheckpointError.retryable
