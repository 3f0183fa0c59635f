"""The pieces of distributed training that need no Spark: the watchdog, the rendezvous exchange,
the equal-steps data rule, error classification and the progress channel."""

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from optim.data.arrays import ArrayDataset
from optim.training.reporting import Reporter
from optim.transport import client as kv
from optim.transport.progress import ProgressServer, RemoteReporter


def test_watchdog_ends_a_stuck_process():
    """A process stuck for good (it waits on an event nobody sets): only the watchdog's thread can
    end it, with exit code 70 and the phase it was stuck in."""
    code = textwrap.dedent("""
        import threading
        from optim.rank.watchdog import Watchdog
        dog = Watchdog(1.0, "tfnet rank 1").start()
        dog.kick("waiting in allreduce")
        print("stuck", flush=True)
        threading.Event().wait()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 70 and proc.stdout.split() == ["stuck"], proc.stderr[-2000:]
    assert "tfnet rank 1: nothing happened for" in proc.stderr and "while waiting in allreduce" in proc.stderr


@pytest.fixture
def rendezvous():
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    yield ("127.0.0.1", port)
    server.stop()


def test_all_gather_through_the_rendezvous_server(rendezvous):
    out = {}

    def rank(r):
        out[r] = kv.all_gather(rendezvous, "counts", r, 3, str(10 * r), timeout_s=10)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == {r: ["0", "10", "20"] for r in range(3)}


def test_all_gather_times_out_when_a_rank_never_comes(rendezvous, monkeypatch):
    """On a virtual clock (sleeping moves it on): rank 0 polls with a growing delay (10 ms, times
    1.5, at most 200 ms) and gives up at the first poll past its 1 s bound, not before."""
    from tests.clock import VirtualClock

    clock = VirtualClock()
    monkeypatch.setattr(kv, "time", clock)
    with pytest.raises(kv.RendezvousError, match=r"Ranks \[1\] did not arrive within 1 s"):
        kv.all_gather(rendezvous, "lonely", 0, 2, "5", timeout_s=1)
    waited = sum(clock.sleeps)
    assert 1.0 < waited <= 1.2 and clock.sleeps[:3] == pytest.approx([0.01, 0.015, 0.0225])
    assert max(clock.sleeps) == 0.2 and sum(clock.sleeps[:-1]) <= 1.0  # the poll before the last was in time


def test_unreachable_rendezvous_is_a_clear_error():
    with pytest.raises(kv.RendezvousError, match="Cannot reach the driver's rendezvous server at 127.0.0.1:9"):
        kv.get(("127.0.0.1", 9), "s", "k", timeout_s=2)


def test_fixed_steps_wrap_around_a_small_shard():
    data = ArrayDataset([np.arange(5)[:, None]], [np.arange(5)], presharded=True)
    batches = list(data.batches(4, steps=3, epoch=0, seed=1, shuffle=True, rank=1))
    assert len(batches) == 3 and all(len(b[1]) == 4 for b in batches)
    seen = np.concatenate([b[1] for b in batches])
    assert set(seen[:5]) == set(range(5)), "every row once before any repeats"
    again = list(data.batches(4, steps=3, epoch=0, seed=1, shuffle=True, rank=1, skip=2))
    np.testing.assert_array_equal(again[0][1], batches[2][1])


class Recorder(Reporter):
    def __init__(self):
        self.calls = []

    def step(self, step, epoch, logs):
        self.calls.append(("step", step, logs["loss"]))

    def epoch_end(self, epoch, step, logs):
        self.calls.append(("epoch_end", epoch, step))


def test_progress_reaches_the_driver():
    rec = Recorder()
    server = ProgressServer(rec, host="127.0.0.1", authkey=b"k" * 32)
    remote = RemoteReporter("127.0.0.1", server.port, authkey=b"k" * 32)
    remote.begin(1, 2, 0, 0)
    remote.step(1, 0, {"loss": 0.5})
    remote.step(2, 0, {"loss": 0.25})
    remote.epoch_end(0, 2, {"loss": 0.375})
    remote.end()
    deadline = time.time() + 10
    while len(rec.calls) < 3 and time.time() < deadline:
        time.sleep(0.05)
    server.close()
    assert rec.calls == [("step", 1, 0.5), ("step", 2, 0.25), ("epoch_end", 0, 2)]
    assert server.first_step_at is not None


@pytest.mark.spark
def test_warm_up_workers_imports_in_every_slot(spark):
    import optim

    warm = optim.warm_up_workers(spark, num_workers=2)
    reports = warm.wait(300)
    assert warm.done() and warm.error is None
    assert len(reports) == 2
    assert all(set(r) == {"python", "host"} for r in reports), reports  # nothing failed to import


def test_a_net_too_large_for_a_connect_plan_is_refused_before_evaluating():
    """evaluate() from a Connect client carries the net in the plan: past spark.tfnet.connect.maxPlanBytes it is a
    DistributedTrainingError that names the setting and the fix, before any job; within it, the plan carries it."""
    from optim.carriers import InPlan
    from optim.errors import DistributedTrainingError
    from optim.launch.backends.connect import ConnectBackend
    from optim.launch.stage import Cleanup

    class Conf:
        def __init__(self, values):
            self.conf, self.values = self, values

        def get(self, key, default=None):
            return self.values.get(key, default)

    backend = ConnectBackend(Conf({"spark.tfnet.connect.maxPlanBytes": "1k"}))
    with pytest.raises(DistributedTrainingError, match=r"spark.tfnet.connect.maxPlanBytes\); evaluate it from a classic"):
        backend.ship_evaluated_net(b"x" * 1025, Cleanup())
    carrier = backend.ship_evaluated_net(b"x" * 1024, Cleanup())
    assert isinstance(carrier, InPlan) and carrier.read() == b"x" * 1024
