"""A training stage without Spark's barrier mode: the ranks form their gang in the driver's store. Worker side.

Spark refuses a barrier stage while dynamic allocation is on (SPARK-24942), and dynamic allocation is the default
on EMR, Dataproc and most Kubernetes set-ups. There the training stage runs as an ordinary stage of ``n`` tasks:
its pending tasks are what makes dynamic allocation ask for executors. :class:`GangContext` gives a task what
:class:`pyspark.BarrierTaskContext` gives a barrier task (its rank, its CPUs, every rank's host) from an all-gather
in the attempt's rendezvous store (the driver's), bounded by ``startup_timeout``.

What barrier mode did and a plain stage does not, done here and by the driver's watch
(:mod:`optim.spark.driver.backends.classic`):

* Spark re-runs a failed or lost task by itself. A rank's gang is gone by then, so a re-run task (attempt number
  above 0) joins nothing: it fails at once with :class:`GangBrokenError`, carrying the failures the ranks left in
  the store, so that whichever error Spark reports names the cause.
* Spark does not end the other tasks when one fails; the driver's watch ends the stage as soon as a rank leaves
  its failure in the store.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

from optim.errors import RendezvousError
from optim.transport import client as kv

__all__ = ["GANG_SCOPE", "GangBrokenError", "GangContext", "own_address"]

#: The store's scope where the ranks of an attempt gather their hosts.
GANG_SCOPE = "tfnet_gang"


class GangBrokenError(RendezvousError):
    """Spark ran a rank's task again (its first run failed, or its executor was lost) in a stage without barrier
    mode: the other ranks' gang is gone, so the driver retries the whole stage instead."""


def own_address(toward: str) -> str:
    """This host's address on the route to ``toward`` (the rendezvous host): what the other ranks reach it by.
    (A plain task has no ``getTaskInfos``; the executor's address is the one its traffic leaves from.)"""
    if toward in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((toward, 9))  # a datagram socket's connect sends nothing: it only picks the route
        return s.getsockname()[0]


class GangContext:
    """A plain task's stand-in for ``BarrierTaskContext`` (see the module): ``partitionId``, ``cpus``,
    ``attemptNumber`` and ``getTaskInfos`` (every rank's address, gathered in the store)."""

    def __init__(self, job, task_context=None):
        from pyspark import TaskContext

        ctx = task_context or TaskContext.get()
        self._rank, self._cpus, self._attempt = ctx.partitionId(), ctx.cpus(), ctx.attemptNumber()
        self._job = job
        self._infos: list | None = None

    def partitionId(self) -> int:  # noqa: N802 - pyspark's names
        return self._rank

    def cpus(self) -> int:
        return self._cpus

    def attemptNumber(self) -> int:  # noqa: N802
        return self._attempt

    def join(self) -> GangContext:
        """Meets the other ranks in the store (their hosts); a task that Spark ran again fails at once."""
        job, rank = self._job, self._rank
        addr, token = job.channels.rendezvous, job.channels.rendezvous_key
        if self._attempt > 0:
            raise GangBrokenError(
                f"Spark ran rank {rank}'s task again (task attempt {self._attempt + 1}) after its first run failed or "
                "its executor was lost; the other ranks' gang is gone, so the driver retries the whole stage.")
        host = own_address(addr[0])
        try:
            hosts = kv.all_gather(addr, f"{GANG_SCOPE}{job.attempt}", rank, job.size, host,
                                  job.limits.startup_timeout_s, token=token)
        except RendezvousError as exc:
            raise RendezvousError(
                f"{exc} The training stage runs without barrier mode (dynamic allocation is on), so its ranks start "
                "as executors come: raise startup_timeout, spark.dynamicAllocation.maxExecutors or the cluster's "
                "capacity, or lower num_workers.") from None
        self._infos = [SimpleNamespace(address=f"{h}:0") for h in hosts]
        return self

    def getTaskInfos(self) -> list:  # noqa: N802
        if self._infos is None:
            raise RuntimeError("GangContext.join() first")
        return self._infos
