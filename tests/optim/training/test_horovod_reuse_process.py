"""A process that already ran Horovod (a reused Spark Python worker) joins a fresh one, without
Spark: two plain processes over Gloo on loopback, meeting through tfnet's secured rendezvous store.

Rank 1 first runs a one-rank Horovod session in its own process and shuts Horovod down; then both
ranks run a two-rank session and average 4.1 MiB of gradients in one grouped allreduce (more than
1 MiB) through tfnet's reducer, three times. Both processes inherit ``HOROVOD_CYCLE_TIME=20``, which
tfnet's launcher used to give the ranks of large nets.

Why (docs/distributed.md, "Horovod's response cache"): Horovod 0.28.1 keeps its ``ParameterManager``
across ``hvd.shutdown()``/``hvd.init()``. A cycle time fixed by ``HOROVOD_CYCLE_TIME`` makes the
next ``hvd.init()`` in that process write its default cycle time (1) into the slot of the tensor
fusion threshold: the reused process fuses at 1 MiB and sizes its fusion buffer by 1 MiB, the fresh
one uses 128 MiB. With the response cache off rank 0's 4.1 MiB responses overflow rank 1's buffer
(wrong averages or a segfault); with it on the ranks fuse differently and Gloo aborts.
``HorovodSession`` keeps ``HOROVOD_CYCLE_TIME`` from ``hvd.init()``.
"""

import json
import os
import textwrap

import pytest

from tests.horovod_utils import result_of, run_rank_pair

pytestmark = pytest.mark.parallel

RANK = textwrap.dedent("""
    import json, sys
    rank, port, key = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    extra, guard = json.loads(sys.argv[4]), sys.argv[5] == "1"
    import tensorflow as tf
    import optim.training.horovod as tfhvd
    from optim.transport.store import SecureRendezvous
    from optim.transport.client import GlooProxy

    if not guard:  # tfnet's session without its guard: what Horovod does with the inherited setting
        tfhvd.UNSAFE_ACROSS_INIT = ()
    SHAPES = [(300, 300)] * 12  # 12 x 352 KiB: 4.1 MiB

    def session(r, size, address, steps):
        proxy = GlooProxy(address, key, timeout_s=30)
        env = tfhvd.horovod_env(r, size, proxy.address[0], proxy.address[1], "lo", 30)
        env.update(extra)
        out = []
        with tfhvd.HorovodSession(env, on_close=proxy.stop) as s:
            reduce = s.collective.reducer()  # tfnet's names: tfnet_grads_0, tfnet_loss
            for step in range(steps):
                grads = {f"g{i}": tf.fill(shape, float((r + 1) * (i + 1) + step)) for i, shape in enumerate(SHAPES)}
                avg, loss = reduce(grads, tf.constant(float(r + step)))
                # the mean of (i+1)+step and 2(i+1)+step for gradient i, of step and 1+step for the loss
                wrong = sum(int(tf.reduce_sum(tf.cast(avg[f"g{i}"] != (1.5 * (i + 1) + step if size == 2 else i + 1 + step),
                                                      tf.int32))) for i in range(len(SHAPES)))
                out.append({"wrong": wrong, "loss": float(loss), "firsts": [float(avg[f"g{i}"][0, 0]) for i in range(3)]})
        return out

    if rank == 1:  # the reused worker: a one-rank run in this process first
        with SecureRendezvous("127.0.0.1", 1, key) as alone:
            assert all(s["wrong"] == 0 for s in session(0, 1, alone.address, 2))
    print("RESULT " + json.dumps(session(rank, 2, ("127.0.0.1", port), 3)), flush=True)
""")


def _run_pair(tmp_path, extra: dict, guard: bool) -> list[tuple[int, str, str]]:
    return run_rank_pair(RANK, tmp_path, [json.dumps(extra), "1" if guard else "0"],
                         env={"TF_CPP_MIN_LOG_LEVEL": "2", "HOROVOD_CYCLE_TIME": "20"}, timeout_s=180)


def test_reused_process_joins_a_fresh_one(tmp_path):
    """tfnet's settings: the reused rank 1 and the fresh rank 0 average every value right."""
    outs = _run_pair(tmp_path, {}, guard=True)
    for rank, (rc, stdout, stderr) in enumerate(outs):
        assert rc == 0, (rank, stderr[-3000:])
        steps = result_of(stdout)
        assert [s["wrong"] for s in steps] == [0, 0, 0], (rank, steps)
        assert [s["loss"] for s in steps] == [0.5, 1.5, 2.5]
    assert all("Ignoring HOROVOD_CYCLE_TIME for Horovod" in stderr for _, _, stderr in outs)


def test_fixed_cycle_time_breaks_a_reused_process(tmp_path):
    """What the guard prevents, shown with the response cache on, where it fails the same way every
    time: from the second step (the first whose tensors are all cached) each rank fuses by its own
    threshold, and the reused rank is sent more bytes than it posted for. (With the cache off, rank
    1's fusion buffer overflows instead: wrong averages or a segfault, as the heap has it.) If this
    passes, Horovod no longer carries the fixed setting over, and the guard can go."""
    outs = _run_pair(tmp_path, {"HOROVOD_CACHE_CAPACITY": "1024"}, guard=False)
    assert any(rc != 0 for rc, _, _ in outs), "the two-rank run passed"
    assert any("op.preamble.length <= op.nbytes" in stderr for _, _, stderr in outs), \
        "\n".join(stderr[-1500:] for _, _, stderr in outs)


def test_session_keeps_unsafe_settings_from_horovod(monkeypatch, caplog):
    import horovod.tensorflow as hvd

    import optim.training.horovod as tfhvd

    seen = {}
    monkeypatch.setattr(hvd, "init", lambda: seen.update({k: os.environ.get(k) for k in
                                                          ("HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE", "HOROVOD_RANK")}))
    monkeypatch.setattr(hvd, "shutdown", lambda: None)
    monkeypatch.setattr(tfhvd, "HorovodCollective", lambda: None)
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "20")
    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    env = tfhvd.horovod_env(1, 2, "127.0.0.1", 1234, None, 30)
    assert not set(env) & set(tfhvd.UNSAFE_ACROSS_INIT)
    with caplog.at_level("WARNING", logger="tfnet.training"):
        with tfhvd.HorovodSession({**env, "HOROVOD_AUTOTUNE": "1"}):
            pass
    assert seen == {"HOROVOD_CYCLE_TIME": None, "HOROVOD_AUTOTUNE": None, "HOROVOD_RANK": "1"}
    assert "Ignoring HOROVOD_CYCLE_TIME, HOROVOD_AUTOTUNE for Horovod" in caplog.text
    assert os.environ["HOROVOD_CYCLE_TIME"] == "20"  # the process environment is given back
    assert "HOROVOD_AUTOTUNE" not in os.environ and "HOROVOD_RANK" not in os.environ
