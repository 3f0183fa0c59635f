"""A training stage without Spark's barrier mode: the ranks form their gang in the driver's store. Worker side.

Spark refuses a barrier stage while dynamic allocation is on (SPARK-24942), and dynamic allocation is the default
on EMR, Dataproc and most Kubernetes set-ups. There the training stage runs as an ordinary stage of ``n`` tasks:
its pending tasks are what makes dynamic allocation ask for executors. :class:`GangContext` gives a task what
:class:`pyspark.BarrierTaskContext` gives a barrier task (its rank, its CPUs, every rank's host) from an all-gather
in the attempt's rendezvous store (the driver's), bounded by ``startup_timeout``.

What barrier mode did and a plain stage does not, done here and by the driver's watch
(:mod:`optim.launch.backends.classic`):

* Spark re-runs a failed or lost task by itself. A rank's gang is gone by then, so a re-run task (attempt number
  above 0) joins nothing: it fails at once with :class:`GangBrokenError`, carrying the failures the ranks left in
  the store, so that whichever error Spark reports names the cause.
* Spark does not end the other tasks when one fails; the driver's watch ends the stage as soon as a rank leaves
  its failure in the store (under Spark Connect, which has no such watch, Spark ends it when the failed rank's
  re-runs, each failing at once, reach ``spark.task.maxFailures``).
* Under Spark Connect the store is rank 0's and goes with it, and which task's error Spark reports is the last
  re-run's: so a failing rank also leaves its failure in a file beside the store's address
  (:func:`leave_failure`), and a re-run or a rank whose peer went away carries the files' failures in its own
  error (:func:`left_failures`): the client gets the cause, and retries only what a rerun can mend.

Under Spark Connect the store is rank 0's (the client may be out of the executors' reach) and there is no barrier
``allGather`` to spread its address: rank 0 leaves it in a file of the run's ``model_dir``
(``Channels.store_file``) and the others read it there (:func:`store_by_file`), each checking that the store
answers with this attempt's proof.
"""

from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

from optim.errors import RendezvousError
from optim.transport import client as kv

__all__ = ["GANG_SCOPE", "GangBrokenError", "GangContext", "leave_failure", "left_failures", "own_address",
           "store_by_file"]

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

    def first_run(self) -> GangContext:
        """Fails at once in a task that Spark ran again (its rank's gang is gone)."""
        if self._attempt > 0:
            raise GangBrokenError(
                f"Spark ran rank {self._rank}'s task again (task attempt {self._attempt + 1}) after its first run "
                "failed or its executor was lost; the other ranks' gang is gone, so the driver retries the whole "
                "stage.")
        return self

    def join(self, job=None) -> GangContext:
        """Meets the other ranks in the store of ``job`` (default: the one given at the start; their hosts); a
        task that Spark ran again fails at once."""
        self.first_run()
        job, rank = job or self._job, self._rank
        addr, token = job.channels.rendezvous, job.channels.rendezvous_key
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


def _own_host() -> str:
    """The address the other executors reach this one by, with no peer to route toward: the executor's
    ``SPARK_LOCAL_IP``, else the address of the default route."""
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    try:
        return own_address("192.0.2.1")  # TEST-NET-1: only the route is looked up, nothing is sent
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def store_by_file(job, rank: int):
    """``(store or None, (host, port))`` under Spark Connect without barrier mode: rank 0 starts the attempt's
    store and leaves its address in ``job.channels.store_file``; the others read it there, bounded by the
    start-up timeout, and take it once the store answers with this attempt's proof."""
    from optim.transport.store_address import proves, start_store
    from tfnet import storage

    path, key, options = job.channels.store_file, job.channels.rendezvous_key, job.train.config.storage_options
    if rank == 0:
        store = start_store(_own_host(), job.size, key, job.attempt)
        host, port = store.address[0], store.address[1]
        storage.write_bytes_atomic(path, f"{host}:{port}".encode(), options)
        return store, (host, int(port))
    limit = job.limits.startup_timeout_s
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            text = storage.read_bytes(path, options).decode()
        except OSError:  # FileNotFoundError until rank 0 has written it
            text = ""
        if text:
            host, port = text.rsplit(":", 1)
            if proves(host, int(port), key, job.attempt):
                return None, (host, int(port))
        time.sleep(0.1)
    raise RendezvousError(
        f"Rank 0 did not leave its rendezvous store's address in {path} within {limit:.0f} s. The training stage "
        "runs without barrier mode (dynamic allocation is on), so its ranks start as executors come: raise "
        "startup_timeout, spark.dynamicAllocation.maxExecutors or the cluster's capacity, or lower num_workers.")


def leave_failure(job, rank: int, data: bytes) -> bool:
    """Leaves this rank's failure (:class:`~optim.transport.failures.WorkerFailure` JSON) beside the attempt's store
    address, where it outlives rank 0's store (Spark Connect without barrier mode; else nothing). Best effort: True if
    it was written."""
    from tfnet import storage

    path = job.channels.failure_file(rank)
    if path is None:
        return False
    try:
        storage.write_bytes_atomic(path, data, job.train.config.storage_options)
        return True
    except OSError:
        return False


def left_failures(job, rank: int, wait_s: float) -> list[bytes]:
    """The failures the attempt's other ranks left in files (:func:`leave_failure`; ``rank`` -1: every rank's),
    waiting up to ``wait_s`` seconds for the first; best effort (storage that fails gives none)."""
    from tfnet import storage

    if job.channels.store_file is None:
        return []
    options = job.train.config.storage_options

    def read(r: int) -> bytes | None:
        try:
            return storage.read_bytes(job.channels.failure_file(r), options)
        except OSError:  # none from that rank (FileNotFoundError), or storage that does not answer
            return None

    return kv.others_left(read, rank, job.size, wait_s)
