"""The parts of a training stage without barrier mode (dynamic allocation on) that need no cluster: reading Spark's
dynamic-allocation settings as Spark does, the gang's meeting in a real driver store (``SecureRendezvous``), a task
that Spark ran again, and the driver's reading of the failures the ranks left. The cluster runs are in
``test_cluster.py``."""

import threading
from types import SimpleNamespace

import pytest

from optim.errors import RendezvousError
from optim.launch.backends.classic import posted_failures
from optim.protocol import Channels, Limits, RankJob
from optim.rank.gang import GangBrokenError, GangContext
from optim.spark.dynamic_allocation import DynamicAllocation, dynamic_allocation
from optim.transport import client as kv
from optim.transport.failures import failures_in, from_exception
from optim.transport.store import SecureRendezvous

KEY = b"k" * 32


class Conf:
    def __init__(self, **values):
        self.values = {k.replace("_", "."): v for k, v in values.items()}

    def getConf(self):  # noqa: N802 - a SparkContext's
        return self

    def get(self, key, default=None):
        return self.values.get(key, default)


def test_dynamic_allocation_is_read_as_spark_reads_it():
    on = {"spark_dynamicAllocation_enabled": "true"}
    assert dynamic_allocation(Conf(spark_master="spark://m:7077")) is None
    assert dynamic_allocation(Conf(spark_master="local[2]", **on)) is None  # Spark ignores it on a local master
    assert dynamic_allocation(Conf(spark_master="local[2]", spark_dynamicAllocation_testing="true", **on)) == \
        DynamicAllocation(0, None, 1)
    got = dynamic_allocation(Conf(spark_master="yarn", spark_dynamicAllocation_maxExecutors="3",
                                  spark_dynamicAllocation_minExecutors="2", spark_executor_cores="4",
                                  spark_task_cpus="2", **on))
    assert got == DynamicAllocation(2, 3, 2) and got.capacity() == 6
    assert dynamic_allocation(Conf(spark_master="k8s://x", **on)).capacity() is None


def job(rdv, size, attempt=0, startup=5.0):
    channels = Channels(rendezvous=("127.0.0.1", rdv.address[1]), rendezvous_key=KEY)
    return RankJob(train=None, data=None, channels=channels, limits=Limits(startup_timeout_s=startup), size=size,
                   attempt=attempt, gang=True)


def task(rank, attempt=0, cpus=1):
    return SimpleNamespace(partitionId=lambda: rank, cpus=lambda: cpus, attemptNumber=lambda: attempt)


def test_the_ranks_meet_in_the_drivers_store_and_a_missing_one_is_a_bounded_error():
    with SecureRendezvous("127.0.0.1", 2, KEY) as rdv:
        j = job(rdv, 2)
        got = {}
        threads = [threading.Thread(target=lambda r=r: got.update({r: GangContext(j, task(r, cpus=2)).join()}))
                   for r in (1, 0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(got) == [0, 1]
        assert [i.address for i in got[0].getTaskInfos()] == ["127.0.0.1:0", "127.0.0.1:0"]
        assert got[1].partitionId() == 1 and got[1].cpus() == 2
    with SecureRendezvous("127.0.0.1", 2, KEY) as rdv:
        with pytest.raises(RendezvousError, match=r"Ranks \[1\] did not arrive within 1 s\. The training stage runs "
                                                  r"without barrier mode \(dynamic allocation is on\)"):
            GangContext(job(rdv, 2, startup=1.0), task(0)).join()


def test_a_task_spark_ran_again_joins_nothing_and_the_driver_reads_the_ranks_failures():
    with SecureRendezvous("127.0.0.1", 2, KEY) as rdv:
        j = job(rdv, 2)
        with pytest.raises(GangBrokenError, match=r"Spark ran rank 1's task again \(task attempt 2\)"):
            GangContext(j, task(1, attempt=1)).join()
        assert posted_failures(rdv) is None
        root = from_exception(ValueError("Column 'x' is null at row 3"), rank=1)
        assert kv.post_failure(j.channels.rendezvous, 1, root.to_json(), KEY)
        why = posted_failures(rdv)
        assert why.startswith("rank(s) 1 failed ")
        (found,) = failures_in(why)
        assert (found.cls, found.message, found.rank) == ("ValueError", "Column 'x' is null at row 3", 1)


def test_under_connect_a_failure_outlives_rank_0s_store_and_a_rerun_carries_it(tmp_path):
    """Spark Connect without barrier mode: the store is rank 0's, and the error Spark reports is the failed rank's
    last re-run's. The first run leaves its failure beside the store's address; the re-run (no store, no gang)
    carries it in its own error text, so the client rebuilds the rank's own error, not a retryable one."""
    from optim.config import TrainConfig
    from optim.protocol import TrainSpec
    from optim.rank.gang import leave_failure, left_failures
    from optim.rank.task import _peers

    channels = Channels(rendezvous=None, rendezvous_key=KEY, store_file=str(tmp_path / "store-0"))
    spec = TrainSpec(net=None, hooks=None, loss=None, method=None, metrics=[], config=TrainConfig())
    j = RankJob(train=spec, data=None, channels=channels, limits=Limits(), size=2, attempt=0, gang=True)
    assert left_failures(j, -1, 0.0) == []
    root = from_exception(ValueError("Column 'x' is null at row 3"), rank=0)
    assert _peers(j, 0, root) == []  # the rank's own failure (not retryable): it leaves it and waits for no other
    assert channels.failure_file(0) == str(tmp_path / "store-0.failure-r0") and (tmp_path / "store-0.failure-r0").exists()
    rerun = from_exception(GangBrokenError("Spark ran rank 0's task again"), rank=0)
    carried = _peers(j, 0, rerun, post=False)  # a re-run leaves nothing of its own
    assert [(f.cls, f.message, f.rank, f.retryable) for f in carried] == \
        [("ValueError", "Column 'x' is null at row 3", 0, False)]
    assert left_failures(j, 0, 0.0) == []  # a rank reads the others' only
    assert leave_failure(j, 1, b"not a failure") and left_failures(j, 0, 0.0) == [b"not a failure"]
    # a peer whose collective broke (retryable) carries the cause too (its own file is not read back)
    peer = _peers(j, 1, from_exception(ConnectionResetError("Connection reset by peer"), rank=1))
    assert [f.cls for f in peer] == ["ValueError"]
