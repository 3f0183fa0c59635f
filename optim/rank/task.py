"""The body of one task of the training stage (:data:`optim.protocol.TRAIN_ENTRY`), in both modes and for
every kind of data: a barrier task over the rank's partition (Arrow batches of a DataFrame, or an RDD's
records). Worker side.

Around :func:`optim.rank.rank.run_rank` (the rank itself), a task:

* under Spark Connect, whose client the executors may not reach, hosts the stage's channels itself:
  rank 0 starts the secured rendezvous store (:mod:`optim.transport.store`, the job's
  rendezvous key) on its host, every rank finds its address (:mod:`optim.transport.store_address`),
  and rank 0 watches the ranks' heartbeats there and ends the stage when one is stuck (in a classic
  session the driver hosts the store and watches);
* yields rank 0's result as records of :data:`optim.protocol.RESULT_SCHEMA`: the path of the result file
  when the job has an exchange folder, else the payload in pieces of at most ``limits.chunk_bytes`` bytes;
* fails with the rank's failure inside the error text (:func:`optim.transport.failures.failure_text`): the
  one way a failure travels, in both modes, so that the driver finds it even where no store outlives the
  stage.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator

from pyspark import BarrierTaskContext

from optim.errors import RendezvousError, WorkerError
from optim.logs import quiet_worker
from optim.protocol import RankJob
from optim.rank.gang import GangBrokenError, GangContext, leave_failure, left_failures, store_by_file
from optim.rank.rank import run_rank
from optim.transport import client as kv
from optim.transport.failures import WorkerFailure, failure_text, from_exception, read_failures
from optim.transport.store import stuck_rank
from optim.transport.store_address import AddressGather, find_store, start_store

__all__ = ["run_task"]

log = logging.getLogger("tfnet.spark.worker")

MONITOR_S = 1.0
DONE_SCOPE = "tfnet_done"


def run_task(job: RankJob, rows: Iterable) -> Iterator[tuple]:
    """Yields rank 0's result as ``(piece, chunk, path)`` records (nothing on the other ranks); see the module."""
    quiet_worker(job.limits.log_level)
    ctx = GangContext(job) if job.gang else BarrierTaskContext.get()
    rank = ctx.partitionId()
    store = monitor = None
    hosted = job.channels.rendezvous is None  # Spark Connect: the stage hosts its own rendezvous
    gather = None
    try:
        if job.gang:  # no barrier mode (dynamic allocation on): the ranks meet in the store (the driver's, or rank 0's)
            if hosted:
                ctx.first_run()  # a task Spark ran again starts no store and reads no address
                store, address = store_by_file(job, rank)
                job = dataclasses.replace(job, channels=dataclasses.replace(job.channels, rendezvous=address))
            ctx.join(job)
        elif hosted:
            store, job, gather = _rendezvous(job, ctx, rank)
        if store is not None:
            monitor = _Monitor(store, job).start()
        results = list(run_rank(job, rows, ctx))
        if hosted:
            if gather is not None:
                gather.result(job.limits.startup_timeout_s)
            _finish(job, rank, store)  # every rank is done with rank 0's store before rank 0 closes it
    except BaseException as exc:
        failure = from_exception(exc, rank)
        # a task that Spark ran again leaves no failure of its own: its rank's first run left the cause
        spans = [failure_text(f) for f in [failure, *_peers(job, rank, failure, post=not isinstance(exc, GangBrokenError))]]
        raise WorkerError(f"{' '.join(spans)} rank {rank}: {failure.cls}: {failure.message[:500]}") from exc
    finally:
        if monitor is not None:
            monitor.stop()
        if store is not None:
            store.stop()
    for carrier in results:  # rank 0's result: a file in the exchange folder, or pieces in the rows
        yield from carrier.records(job.limits.chunk_bytes)


#: Seconds a rank whose error may be a peer's doing (a broken collective) waits for that peer's failure.
PEER_WAIT_S = 3.0


def _peers(job: RankJob, rank: int, failure: WorkerFailure, post: bool = True) -> list[WorkerFailure]:
    """Failures travel to the driver one way, in the task's error; which task's error Spark reports is a race.
    So every failing rank leaves its failure in the stage's store (and, under Spark Connect without barrier mode,
    in a file that outlives rank 0's store: :func:`~optim.rank.gang.leave_failure`), and a rank whose own
    error may be a peer's doing (a retryable one: a broken collective, a lost connection, a task Spark ran again)
    waits briefly for the others' and carries them in its error too. The driver then finds the cause
    (:func:`~optim.transport.failures.pick_root`) whichever error it gets."""
    addr, key = job.channels.rendezvous, job.channels.rendezvous_key
    if post:
        leave_failure(job, rank, failure.to_json())  # Spark Connect without barrier mode: it outlives rank 0's store
        if addr is not None:
            kv.post_failure(addr, rank, failure.to_json(), key)
    if not failure.retryable:
        return []
    found = read_failures(left_failures(job, rank if post else -1, 0.0 if addr is not None else PEER_WAIT_S))
    if addr is not None and not found:
        found = read_failures(kv.peer_failures(addr, rank if post else -1, job.size, key, PEER_WAIT_S))
    return found


def _rendezvous(job: RankJob, ctx, rank: int):
    """``(store or None, job, gather)``: rank 0 starts the store on its own host; every rank finds its
    address (:mod:`optim.transport.store_address`) while the ``allGather`` of it runs in ``gather``."""
    infos = ctx.getTaskInfos()
    hosts = [i.address.rsplit(":", 1)[0] for i in infos] if infos else ["127.0.0.1"] * job.size
    host, key = hosts[rank], job.channels.rendezvous_key
    store = start_store(host, job.size, key, job.attempt) if rank == 0 else None
    try:
        gather = AddressGather(ctx, f"{host}:{store.address[1]}" if store is not None else "")
        address = store.address if store is not None else \
            find_store(hosts[0], key, job.attempt, gather, job.limits.startup_timeout_s)
    except BaseException:
        if store is not None:
            store.stop()
        raise
    channels = dataclasses.replace(job.channels, rendezvous=(address[0], int(address[1])))
    return store, dataclasses.replace(job, channels=channels), gather


def _finish(job: RankJob, rank: int, store) -> None:
    """The stage's last meeting, in rank 0's store rather than Spark's barrier (which answers a task that
    arrives early at its next one-second tick): each other rank says it is done; rank 0 waits for all."""
    if store is None:
        kv.put(job.channels.rendezvous, DONE_SCOPE, f"rank{rank}", b"1", token=job.channels.rendezvous_key)
        return
    limit = job.limits.startup_timeout_s
    deadline = time.monotonic() + limit
    while len(store.keys(DONE_SCOPE)) < job.size - 1:
        if time.monotonic() > deadline:
            missing = sorted(set(range(1, job.size)) - {int(k.removeprefix("rank")) for k in store.keys(DONE_SCOPE)})
            raise RendezvousError(f"Ranks {missing} did not finish within {limit:.0f} s of rank 0.")
        time.sleep(0.01)


class _Monitor:
    """Rank 0's watch over the ranks' heartbeats in its store: the driver's stuck-rank rule
    (:func:`optim.transport.store.stuck_rank`). A stuck rank (a frozen process, a cut
    network) ends rank 0's process, which fails the barrier stage, so the client retries it."""

    def __init__(self, store, job):
        self._store, self._job = store, job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfnet-stuck-monitor", daemon=True)

    def start(self) -> _Monitor:
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(MONITOR_S):
            why = stuck_rank(self._store.heartbeats(), self._job.size, time.monotonic(), started,
                             self._job.limits.startup_timeout_s)
            if why:
                sys.stderr.write(f"tfnet rank 0: the stage is stuck: {why}; ending it.\n")
                sys.stderr.flush()
                os._exit(70)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
