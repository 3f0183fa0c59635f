"""The sync modes' pieces without Spark: their arguments, the buckets, the byte counts, and local
SGD's server state across a checkpoint and from one optimize() call to the next (one process,
where the collective is the identity)."""

import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from optim.sync import Asynchronous, EveryStep, LocalSGD, check_sync
from optim.training.checkpoint import CheckpointManager, list_runs
from optim.training.horovod import buckets, exchange_bytes
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_arguments_are_checked():
    assert check_sync(None) == EveryStep()
    with pytest.raises(ValueError, match="`every` must be a positive integer"):
        LocalSGD(every=0)
    with pytest.raises(TypeError, match="`server` must be an optim method"):
        LocalSGD(every=4, server="sgd")
    with pytest.raises(ValueError, match="`staleness` must be a non-negative integer"):
        Asynchronous(staleness=-1)
    with pytest.raises(ValueError, match="`compression` must be None, 'fp16' or 'bf16'"):
        EveryStep(compression="int8")
    with pytest.raises(TypeError, match="`sync` must be None"):
        check_sync("local")
    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10)), SCE, optim.SGD(0.1))
    with pytest.raises(TypeError, match="`sync` must be None"):
        opt.optimize((x[:64], y[:64]), verbose=0, sync=4)


def test_buckets_go_from_the_last_layer_and_hold_about_the_bucket_size():
    tensors = [tf.zeros([256], tf.float32) for _ in range(5)]  # 1 KiB each
    assert buckets(tensors, 0) == [[0, 1, 2, 3, 4]]            # one call, after the backward pass
    assert buckets(tensors, 2048) == [[4, 3], [2, 1], [0]]      # the last layers' gradients first
    assert buckets(tensors, 1) == [[4], [3], [2], [1], [0]]
    assert buckets([], 2048) == []


def test_bytes_a_rank_sends():
    assert exchange_bytes(1000, 1, None) == 0
    assert exchange_bytes(1000, 2, None) == 1000          # ring: 2 (N - 1) / N of the payload
    assert exchange_bytes(1000, 8, None) == 1750
    assert exchange_bytes(1000, 8, "fp16") == 875
    assert exchange_bytes(1000, 8, "bf16") == 500 * 7     # an all-gather of the half-size payload


def test_local_sgd_resumes_with_the_server_momentum():
    """A run resumed from a mid-run checkpoint equals the uninterrupted run bit for bit only if the
    checkpoint carried the server method's momentum."""
    x, y = digits.load()
    x, y = x[:192], y[:192]
    sync = LocalSGD(every=3, server=optim.SGD(0.8, momentum=0.9))

    def run(model_dir, **kw):
        net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(model_dir))
        opt.optimize((x, y), epochs=2, batch_size=32, checkpoint_every=4, keep_checkpoints=10, verbose=0,
                     sync=sync, **kw)
        return net, opt

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        full, opt = run(f"{tmp}/a")
        assert opt.global_step == 12
        run_dir = f"{tmp}/a/checkpoints/{list_runs(f'{tmp}/a/checkpoints')[0]}"
        ckpt = CheckpointManager.load(f"{run_dir}/ckpt-000000004.npz")
        assert ckpt.extra["exchange_state"] > 0, "the server's momentum is in the checkpoint"
        resumed, opt2 = run(f"{tmp}/b", resume=ckpt.path)
        assert opt2.last_run["start_step"] == 4 and opt2.global_step == 12
        for a, b in zip(full.get_weights().values(), resumed.get_weights().values()):
            assert np.array_equal(a, b)


def test_local_sgd_carries_the_server_state_to_the_next_call(caplog):
    """Two optimize() calls of one epoch each equal one call of two epochs, bit for bit, only if the
    second call continues with the server method's momentum (the worker method, plain SGD, has no
    state to lose). Another server method in a later call starts fresh, with a warning."""
    x, y = digits.load()
    x, y = x[:160], y[:160]
    sync = LocalSGD(every=2, server=optim.SGD(0.8, momentum=0.9))

    def make():
        net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        return net, TFOptimizer(net, SCE, optim.SGD(0.05))

    once, opt1 = make()
    opt1.optimize((x, y), epochs=2, batch_size=32, shuffle=False, verbose=0, sync=sync)
    twice, opt2 = make()
    assert opt2.exchange_state == []
    opt2.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0, sync=sync)
    momentum = [np.array(a) for a in opt2.exchange_state]
    assert momentum and any(np.abs(a).max() > 0 for a in momentum), "the server's momentum after one call"
    opt2.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0, sync=sync)
    assert opt1.global_step == opt2.global_step == 10
    for a, b in zip(once.get_weights().values(), twice.get_weights().values()):
        assert np.array_equal(a, b)
    # a server method of other state (no momentum) cannot take it: fresh, and said
    with caplog.at_level("WARNING", logger="tfnet.training"):
        opt2.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0,
                      sync=LocalSGD(every=2, server=optim.Adam(0.01)))
    assert "server method's state from the previous optimize() call does not fit" in caplog.text
    # every-step training has no server state: the carried state is dropped without a word
    caplog.clear()
    opt2.optimize((x, y), epochs=1, batch_size=32, shuffle=False, verbose=0)
    assert opt2.exchange_state == [] and "server method" not in caplog.text


def test_the_bar_shows_the_megabytes_sent_per_step():
    from optim.training.reporting import _fmt

    assert _fmt({"loss": 0.5, "bytes_per_step": 2_500_000.0}) == {"loss": "0.5", "sent": "2.5MB/step"}
