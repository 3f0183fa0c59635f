"""How often ranks exchange (``optimize(sync=...)``): every step (bucketed, compressed), local SGD
with a server method, asynchronous; on a real local[2] Spark with Horovod over Gloo, and on four
ranks of a local[4] Spark of their own (``ranks_job.py``)."""

import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.spark_utils import BIT_FOR_BIT, kill_rank_after_checkpoints, own_python_workers
from tests.tfnet import transfer
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def _weights(net):
    """The weights in order (nets built one after another get other Keras names)."""
    return list(net.get_weights().values())


def _max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(_weights(a), _weights(b)))


def replica(x, y, *, staleness=0, compression=None, lr=0.05, epochs=2, batch=32, ranks=2):
    """The documented update rules in plain TensorFlow, without tfnet: the Keras model of the same
    seed, each rank's gradient on its shard (numpy rows r, r + ranks, ...) by ``tf.GradientTape``,
    the ranks' average (each gradient cast to float16 or bfloat16 first with ``compression``: fp16
    summed in float16 then halved, bf16 summed in float32), and SGD applying the average of the step
    ``staleness`` steps before; what is pending is applied at each epoch's end. Returns the weights
    in Keras's order."""
    import collections

    import tensorflow as tf

    model = digits.cnn(classes=10, seed=0)
    variables = model.trainable_variables
    shards = [(x[r::ranks], y[r::ranks]) for r in range(ranks)]
    per = batch // ranks
    half = {"fp16": tf.float16, "bf16": tf.bfloat16}.get(compression)

    def average(per_rank):
        if compression == "bf16":  # each rank's bfloat16 values, summed in float32
            per_rank = [tf.cast(tf.cast(g, tf.bfloat16), tf.float32) for g in per_rank]
        elif half is not None:
            per_rank = [tf.cast(g, half) for g in per_rank]
        return tf.cast(tf.add_n(per_rank) / ranks, tf.float32)

    pending = collections.deque()
    for _ in range(epochs):
        for step in range(len(shards[0][0]) // per):
            grads = []
            for xs, ys in shards:
                rows = slice(step * per, (step + 1) * per)
                with tf.GradientTape() as tape:
                    logits = model(xs[rows])
                    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(ys[rows], logits))
                grads.append(tape.gradient(loss, variables))
            pending.append([average([g[i] for g in grads]) for i in range(len(variables))])
            while len(pending) > staleness:
                for v, g in zip(variables, pending.popleft()):
                    v.assign_sub(lr * g)
        while pending:  # settled at the epoch's end
            for v, g in zip(variables, pending.popleft()):
                v.assign_sub(lr * g)
    return [v.numpy() for v in variables]


def _from(net, weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(_weights(net), weights))


def test_modes_on_two_ranks(spark):
    """256 rows, global batch 32: 8 steps per epoch on each of two ranks, plain SGD. Every-step,
    asynchronous (staleness 0 and 1) and compressed (fp16, bf16) runs equal the plain-TensorFlow
    replica of their update rule (:func:`replica`) to 1e-5; each replica is further than that from
    the other modes' runs, so each comparison tells the rules apart."""
    x, y = digits.load()
    x, y = x[:256], y[:256]

    def run(sync):
        net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        opt = TFOptimizer(net, SCE, optim.SGD(0.05))
        history = opt.optimize((x, y), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0, sync=sync)
        assert opt.global_step == 16 and np.isfinite(history["loss"]).all()
        return net, history

    with own_python_workers(spark, BIT_FOR_BIT):  # the bit-for-bit comparisons below: workers with one pool size
        every, h_every = run(None)
        one_call, _ = run(optim.EveryStep(overlap=False))
        async0, h_async0 = run(optim.Asynchronous(staleness=0))
    local1, h_local1 = run(optim.LocalSGD(every=1, server=optim.SGD(1.0)))
    local4, h_local4 = run(optim.LocalSGD(every=4))
    fp16, h_fp16 = run(optim.EveryStep(compression="fp16"))
    bf16, h_bf16 = run(optim.EveryStep(compression="bf16"))
    async1, h_async1 = run(optim.Asynchronous(staleness=1))
    async1_bf16, h_async1_bf16 = run(optim.Asynchronous(staleness=1, compression="bf16"))
    # the oracle: plain TensorFlow, one replica per rule
    rules = {"every": {}, "async1": {"staleness": 1}, "fp16": {"compression": "fp16"},
             "bf16": {"compression": "bf16"}, "async1_bf16": {"staleness": 1, "compression": "bf16"}}
    oracle = {name: replica(x, y, **kw) for name, kw in rules.items()}
    runs = {"every": every, "async0": async0, "async1": async1, "fp16": fp16, "bf16": bf16, "async1_bf16": async1_bf16}
    rule_of = {"async0": "every"}  # staleness 0 applies each step's own average: the every-step rule
    for name, net in runs.items():
        rule = rule_of.get(name, name)
        assert _from(net, oracle[rule]) < 1e-5, (name, _from(net, oracle[rule]))
        for other in oracle:
            if other != rule:
                assert _from(net, oracle[other]) > 1e-4, (name, other, _from(net, oracle[other]))
    # buckets reduced as the backward pass makes them: the same average, bit for bit
    assert _max_diff(every, one_call) == 0.0
    # local SGD with K=1 and a server SGD at rate 1.0 is every-step SGD, to float32 rounding
    assert _max_diff(every, local1) < 1e-6
    # asynchronous with staleness 0 applies each step's own average: every-step training
    assert _max_diff(every, async0) == 0.0
    # local SGD with K=4 trains differently, and still trains
    assert _max_diff(every, local4) > 1e-6 and h_local4["loss"][-1] < h_every["loss"][0]
    # the bytes each rank sends per step, as the run counted them: two ranks send the payload once
    params = sum(w.nbytes for w in _weights(every))
    assert h_every["bytes_per_step"] == [params + 4] * 2                  # the gradients and the loss
    assert h_local1["bytes_per_step"] == [params] * 2                     # the weights' moves
    assert h_local4["bytes_per_step"] == [params / 4] * 2                 # ... every fourth step
    assert h_fp16["bytes_per_step"] == h_bf16["bytes_per_step"] == [(params + 4) // 2] * 2
    # asynchronous: every step's gradients and loss, exchanged in the background (in 16 bits when compressed)
    assert h_async0["bytes_per_step"] == h_async1["bytes_per_step"] == [params + 4] * 2
    assert h_async1_bf16["bytes_per_step"] == [(params + 4) // 2] * 2


def test_local_sgd_carries_the_server_momentum_to_the_next_call(spark):
    """Two ranks: two optimize() calls of one epoch each equal one call of two epochs only if rank
    0 hands the server method's momentum back and the next call's ranks start from it."""
    x, y = digits.load()
    x, y = x[:128], y[:128]
    sync = optim.LocalSGD(every=2, server=optim.SGD(0.8, momentum=0.9))

    def make():
        net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        return net, TFOptimizer(net, SCE, optim.SGD(0.05))

    with own_python_workers(spark, BIT_FOR_BIT):  # compared bit for bit: workers with one pool size
        once, opt1 = make()
        opt1.optimize((x, y), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0, sync=sync)
        twice, opt2 = make()
        for _ in range(2):
            opt2.optimize((x, y), epochs=1, batch_size=32, shuffle=False, num_workers=2, verbose=0, sync=sync)
            assert opt2.exchange_state and any(np.abs(a).max() > 0 for a in opt2.exchange_state)
    assert opt1.global_step == opt2.global_step == 8
    assert _max_diff(once, twice) == 0.0


def test_local_sgd_equals_keras_models_trained_apart_and_averaged(spark):
    """The oracle Keras gives: each rank's shard (numpy rows r, r+2, ...) trained by its own Keras
    model with Keras's SGD for 4 steps, the two models' weights averaged, twice. Local SGD with K=4
    and the default server (plain averaging) must land on the same weights."""
    import keras

    x, y = digits.load()
    x, y = x[:256], y[:256]
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    TFOptimizer(net, SCE, optim.SGD(0.05)).optimize((x, y), epochs=1, batch_size=32, shuffle=False, num_workers=2,
                                                    verbose=0, sync=optim.LocalSGD(every=4))
    models = [digits.cnn(classes=10, seed=0) for _ in range(2)]
    for m in models:
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for cycle in range(2):  # 8 steps of 16 rows per rank: two exchanges
        for r, m in enumerate(models):
            rows = slice(cycle * 64, (cycle + 1) * 64)
            m.fit(x[r::2][rows], y[r::2][rows], batch_size=16, epochs=1, shuffle=False, verbose=0)
        averaged = [(a + b) / 2 for a, b in zip(models[0].get_weights(), models[1].get_weights())]
        for m in models:
            m.set_weights(averaged)
    for ours, theirs in zip(_weights(net), averaged):
        assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 1e-4
    assert _max_diff(net, TFNet.from_keras(digits.cnn(classes=10, seed=0))) > 1e-3, "the weights moved"


def test_local_sgd_server_momentum_over_two_calls_equals_keras(spark):
    """The oracle Keras gives for a server method with state, across optimize() calls: each rank's
    shard trained by its own Keras model (Keras's SGD) for 4 steps; the models' average move from
    the anchor applied to the anchor by a Keras SGD with momentum 0.9 (the server), whose momentum
    lives on; both models restarted from the new anchor. Four exchanges, two in each of two
    optimize() calls: tfnet must land on the same weights, which it does only if the second call
    continues the server's momentum."""
    import keras

    x, y = digits.load()
    x, y = x[:256], y[:256]
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    opt = TFOptimizer(net, SCE, optim.SGD(0.05))
    for _ in range(2):
        opt.optimize((x, y), epochs=1, batch_size=32, shuffle=False, num_workers=2, verbose=0,
                     sync=optim.LocalSGD(every=4, server=optim.SGD(0.8, momentum=0.9)))
    models = [digits.cnn(classes=10, seed=0) for _ in range(2)]
    for m in models:
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    anchor = [keras.Variable(w) for w in models[0].get_weights()]
    server = keras.optimizers.SGD(0.8, momentum=0.9)
    for cycle in [0, 1, 0, 1]:  # each call: 8 steps of 16 rows per rank, the same rows in the second call
        for r, m in enumerate(models):
            rows = slice(cycle * 64, (cycle + 1) * 64)
            m.fit(x[r::2][rows], y[r::2][rows], batch_size=16, epochs=1, shuffle=False, verbose=0)
        moved = [a.numpy() - (w0 + w1) / 2 for a, w0, w1 in zip(anchor, models[0].get_weights(), models[1].get_weights())]
        server.apply_gradients(zip(moved, anchor))
        for m in models:
            m.set_weights([a.numpy() for a in anchor])
    for ours, theirs in zip(_weights(net), anchor):
        assert np.linalg.norm(ours - theirs.numpy()) / np.linalg.norm(theirs.numpy()) < 1e-4


def test_local_sgd_and_async_reach_the_accuracy_of_every_step(spark):
    """The digits transfer-learning task (tests/tfnet/transfer.py) on two ranks."""
    import re

    (xtr, ytr), (xte, yte) = transfer.data()
    for sync in (optim.LocalSGD(every=4), optim.Asynchronous(staleness=1)):
        net = transfer.new_net()
        opt = TFOptimizer(net, SCE, {"head/": optim.Adam(0.01), re.compile("^(?!head/)"): optim.Adam(0.002)},
                          metrics=["accuracy"])
        history = opt.optimize((xtr, ytr), epochs=4, batch_size=32, num_workers=2, verbose=0, sync=sync)
        accuracy = transfer.accuracy(net.forward(xte), yte)
        assert accuracy >= 0.95, (sync, accuracy, history)


@pytest.mark.parametrize("sync", [optim.LocalSGD(every=3, server=optim.SGD(0.8, momentum=0.5)),
                                  optim.Asynchronous(staleness=1)], ids=["local-sgd", "async"])
def test_resume_after_a_killed_rank(spark, tmp_path, sync):
    """A rank killed mid-run: the retry resumes from this run's checkpoint (the server method's
    momentum included) and finishes with the planned steps, equal, bit for bit, to an uninterrupted
    run of the same seed, data and ranks (its weights, the worker method's momentum and the server
    method's state): a resume that lost any state would differ from it."""
    with own_python_workers(spark, BIT_FOR_BIT):
        x, y = digits.load()
        x, y = x[:384], y[:384]
        model_dir = tmp_path / "run"
        net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(model_dir))
        killed = kill_rank_after_checkpoints(str(model_dir), checkpoints=3)  # after step 12 of 36
        with pytest.warns(RuntimeWarning, match="Training stage attempt 1 failed"):
            opt.optimize((x, y), epochs=3, batch_size=32, num_workers=2, checkpoint_every=4, keep_checkpoints=100,
                         verbose=0, timeout=60, max_retries=2, sync=sync)
        killed["thread"].join(5)
        assert "pid" in killed
        run = opt.last_run
        assert run["attempts"] == 2 and opt.global_step == 36
        start = CheckpointManager.load(run["resumed_from"]).step
        assert run["attempt_log"][-1]["start_step"] == start >= 12
        whole = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        unbroken = TFOptimizer(whole, SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(tmp_path / "other"))
        unbroken.optimize((x, y), epochs=3, batch_size=32, num_workers=2, checkpoint_every=4, verbose=0, sync=sync)
        assert unbroken.last_run["attempts"] == 1 and unbroken.global_step == 36
        assert _max_diff(net, whole) == 0.0
        assert len(opt.state) == len(unbroken.state) > 0 and len(opt.exchange_state) == len(unbroken.exchange_state)
        for ours, theirs in zip([*opt.state, *opt.exchange_state], [*unbroken.state, *unbroken.exchange_state]):
            np.testing.assert_array_equal(ours, theirs)
        # each rank ran Horovod's threads (its background thread and Gloo's) at idle priority
        infos = [json.loads(open(f).read()) for f in glob.glob(str(tmp_path / "other" / "ranks" / "*" / "rank-*.json"))]
        assert len(infos) == 2 and all(i["horovod_idle_threads"] >= 2 for i in infos), infos
        # the bytes sent per step reach TensorBoard (rank 0's events), per step and per epoch
        import tensorflow as tf

        tags = {v.tag for f in glob.glob(str(model_dir / "tensorboard" / run["run_id"] / "train" / "*"))
                for e in tf.compat.v1.train.summary_iterator(f) for v in e.summary.value}
        assert {"bytes_per_step", "epoch_bytes_per_step"} <= tags, tags


def test_four_ranks_every_mode_with_empty_and_uneven_partitions():
    """Four ranks of a local[4] Spark (its own process): two of the DataFrame's four partitions are
    empty and one holds 12 rows against 500; every mode takes the same steps on every rank."""
    from tests.optim.spark.ranks_job import RANKS, SIZES

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tests.optim.spark.ranks_job"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")))
    assert out["partitions"] == SIZES
    params = out["params_bytes"]
    ring = 2 * (RANKS - 1) / RANKS  # a ring allreduce sends 2(N-1)/N of the payload per rank
    for name in ("every", "local1", "local4", "async"):
        run = out[name]
        rows = run["rows"]
        assert len(rows) == RANKS and sum(rows) == 512 and max(rows) - min(rows) <= 2, run
        steps = math.ceil(max(rows) / (64 // RANKS))  # a global batch of 64
        assert run["steps_per_epoch"] == steps and run["global_step"] == 2 * steps, run
        assert np.isfinite(run["loss"]).all() and run["loss"][1] < run["loss"][0], run
    assert out["local1"]["max_abs_diff"] < 1e-6            # an N-way average, not a pairwise one
    assert out["local4"]["max_abs_diff"] > 1e-6 and out["async"]["max_abs_diff"] > 1e-6
    assert out["every"]["bytes_per_step"][0] == pytest.approx((params + 4) * ring, abs=1)
    assert out["local1"]["bytes_per_step"][0] == pytest.approx(params * ring, abs=1)
    exchanges = 2 * math.ceil(out["local4"]["steps_per_epoch"] / 4)  # every fourth step, and at each epoch end
    assert sum(out["local4"]["bytes_per_step"]) * out["local4"]["steps_per_epoch"] == pytest.approx(
        exchanges * int(params * ring), abs=2)
