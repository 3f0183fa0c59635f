"""Horovod's threads at idle priority (optim.training.comm_threads), in two real ranks over Gloo
without Spark: the threads hvd.init() starts run under SCHED_IDLE, the rank's own threads
(the caller's, TensorFlow's) do not, and the averages are right even while another thread of each
rank keeps its core busy (the collective then runs on the time the busy thread leaves)."""

import os
import textwrap

import pytest

from optim.training import comm_threads
from tests.horovod_utils import result_of, run_rank_pair

pytestmark = pytest.mark.parallel

RANK = textwrap.dedent("""
    import json, os, sys, threading, time
    import numpy as np
    import tensorflow as tf
    from optim.transport.client import GlooProxy
    from optim.training.horovod import HorovodSession, horovod_env

    rank, port, key, mode = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3]), sys.argv[4]
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    a = tf.random.uniform((256, 256))
    busy = threading.Event()

    def spin():  # a training step's compute, on a core of its own
        while not busy.is_set():
            tf.matmul(a, a).numpy()

    def policy(tid):
        try:
            return os.sched_getscheduler(tid)
        except ProcessLookupError:  # ended since the listing
            return None

    def name(tid):
        try:
            return open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:
            return ""

    proxy = GlooProxy(("127.0.0.1", port), key, timeout_s=30)
    env = horovod_env(rank, 2, proxy.address[0], proxy.address[1], "lo", 30)
    with HorovodSession(env, on_close=proxy.stop, threads=mode) as session:
        worker = threading.Thread(target=spin)
        worker.start()
        sums = [session.collective.allreduce_sum(np.arange(100_000, dtype=np.float64) * (rank + 1) + i)
                for i in range(5)]
        busy.set()
        worker.join()
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        idle_now = sorted(t for t in tids if policy(t) == os.SCHED_IDLE)
        # every thread hvd.init() started (but TensorFlow's) and still alive now; one that has ended reads as None
        started_policies = {t: policy(t) for t in session.idle.started if not name(t).startswith("tf_")}
        out = {"demoted": list(session.idle.demoted),
               "started": list(session.idle.started),
               "started_live_policies": sorted({p for p in started_policies.values() if p is not None}),
               "live_idle": sorted(session.idle_threads),  # after the listing: alive then too
               "idle_now": idle_now,
               "idle_names": sorted({name(t) for t in idle_now}),
               "main_policy": policy(threading.get_native_id()),
               "tf_policies": sorted({policy(t) for t in tids if name(t).startswith("tf_")}),
               "tf_threads": sum(name(t).startswith("tf_") for t in tids),
               "sums_ok": all(np.array_equal(s, np.arange(100_000) * 3.0 + 2 * i) for i, s in enumerate(sums))}
    print("RESULT " + json.dumps(out), flush=True)
""")


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
@pytest.mark.parametrize("mode", ["idle", "normal"])
def test_horovod_threads_run_at_idle_priority(tmp_path, mode):
    for rc, stdout, stderr in run_rank_pair(RANK, tmp_path, args=(mode,)):
        assert rc == 0, stderr[-3000:]
        out = result_of(stdout)
        assert out["sums_ok"], out
        assert out["main_policy"] == os.SCHED_OTHER and out["tf_threads"] >= 1
        assert out["tf_policies"] == [os.SCHED_OTHER], out  # TensorFlow's pools keep their priority
        if mode == "idle":
            # Horovod's background thread and Gloo's loop thread(s) were set idle when they started ...
            assert len(out["demoted"]) >= 2 and set(out["demoted"]) <= set(out["started"]), out
            # ... every one of them still alive is idle now (one that has ended is not required) ...
            assert out["started_live_policies"] in ([], [os.SCHED_IDLE]), out
            # ... and what the session reports as live and idle is live and idle
            assert set(out["live_idle"]) <= set(out["idle_now"]), out
            assert not any(n.startswith("tf_") for n in out["idle_names"]), out
        else:
            assert out["demoted"] == [] and out["live_idle"] == [] and out["idle_now"] == [], out
            assert os.SCHED_IDLE not in out["started_live_policies"], out


def test_mode_from_the_environment(monkeypatch):
    monkeypatch.delenv("TFNET_HOROVOD_THREADS", raising=False)
    assert comm_threads.mode_from_env() == "idle"
    monkeypatch.setenv("TFNET_HOROVOD_THREADS", " Normal ")
    assert comm_threads.mode_from_env() == "normal"
    monkeypatch.setenv("TFNET_HOROVOD_THREADS", "low")
    with pytest.raises(ValueError, match="TFNET_HOROVOD_THREADS must be one of idle, normal. Received: 'low'"):
        comm_threads.mode_from_env()


def test_demote_skips_tensorflow_threads_and_ended_ones():
    import threading

    import tensorflow as tf

    tf.constant(1.0) + 1.0  # TensorFlow's pools exist
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        tf_threads = {tid for tid in comm_threads.thread_ids() if comm_threads._name(tid).startswith("tf_")}
        done = comm_threads.demote({t.native_id, 2 ** 22 + 7, *tf_threads})  # the second has no thread
        assert done == [t.native_id]
        assert os.sched_getscheduler(t.native_id) == os.SCHED_IDLE
        assert all(os.sched_getscheduler(tid) == os.SCHED_OTHER for tid in tf_threads)
    finally:
        stop.set()
        t.join()


def test_the_idle_record_drops_a_thread_that_ends():
    """``IdleRecord.live()`` (``HorovodSession.idle_threads``) holds only threads that still run;
    ``demoted`` keeps the record made when they were set idle."""
    import threading
    import time

    stops = [threading.Event(), threading.Event()]
    threads = [threading.Thread(target=s.wait) for s in stops]
    for t in threads:
        t.start()
    ids = [t.native_id for t in threads]
    try:
        record = comm_threads.IdleRecord(set(ids))
        assert record.demoted == tuple(sorted(ids)) and record.live() == sorted(ids)
        assert all(os.sched_getscheduler(tid) == os.SCHED_IDLE for tid in ids)
        first = min(ids)
        stops[ids.index(first)].set()
        threads[ids.index(first)].join()
        # join() returns when Python is done with the thread; the OS thread (at idle priority, on a busy
        # machine) leaves /proc/self/task a little later
        deadline = time.monotonic() + 30
        while first in comm_threads.thread_ids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first not in comm_threads.thread_ids(), "the thread ended"
        assert record.live() == [max(ids)]  # the ended one is neither counted nor required
        assert record.demoted == tuple(sorted(ids))
        assert comm_threads.IdleRecord(set(ids), idle=False).demoted == ()
    finally:
        for s in stops:
            s.set()
        for t in threads:
            t.join()
