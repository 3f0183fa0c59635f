"""One rank of the training stage under Spark Connect. Worker side.

The client of a Connect session may be out of the executors' reach, so the stage hosts its own
channels: rank 0 starts the secured rendezvous store (:mod:`optim.spark.rendezvous_store`, the
job's rendezvous key from the plan) on its host, and every rank learns its address through
``BarrierTaskContext.allGather``. Rank 0 also watches the ranks' heartbeats there and ends the
stage when one is stuck. The rest is the classic rank (:func:`optim.spark.worker.rank.run_rank`).
Rank 0's result leaves as rows of ``(piece, chunk)``; a failure leaves inside the task's error
text (:mod:`optim.spark.connect`), since no store outlives the stage.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator

log = logging.getLogger("tfnet.spark.worker")

RESULT_SCHEMA = "piece int, chunk binary"
MONITOR_S = 1.0


def run_connect_rank(job, batches: Iterable, chunk_size: int) -> Iterator:
    """The body of one barrier task of ``mapInArrow(..., barrier=True)``: yields Arrow record
    batches of rank 0's result in pieces of at most ``chunk_size`` bytes (nothing on other ranks)."""
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    from optim.errors import WorkerError
    from optim.spark.connect import failure_text, to_chunks
    from optim.spark.failures import from_exception
    from optim.spark.worker.rank import run_rank

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    store = monitor = None
    try:
        store, job = _rendezvous(job, ctx, rank)
        if store is not None:
            monitor = _Monitor(store, job).start()
        results = list(run_rank(job, batches))
        ctx.barrier()  # every rank is done with the store before rank 0 closes it
    except BaseException as exc:
        failure = from_exception(exc, rank)
        raise WorkerError(f"{failure_text(failure)} rank {rank}: {failure.cls}: {failure.message[:500]}") from exc
    finally:
        if monitor is not None:
            monitor.stop()
        if store is not None:
            store.stop()
    schema = pa.schema([("piece", pa.int32()), ("chunk", pa.binary())])
    for payload in results:
        for index, piece in to_chunks(payload, chunk_size):
            yield pa.RecordBatch.from_pydict({"piece": [index], "chunk": [piece]}, schema=schema)


def _rendezvous(job, ctx, rank: int):
    """``(store or None, job)``: rank 0 starts the store on its own host; every rank gets its
    address from rank 0 through ``allGather``."""
    from optim.spark.rendezvous_store import SecureRendezvous

    infos = ctx.getTaskInfos()
    host = infos[rank].address.rsplit(":", 1)[0] if infos else "127.0.0.1"
    store = SecureRendezvous(host, job.size, job.rendezvous_key) if rank == 0 else None
    try:
        gathered = ctx.allGather(f"{host}:{store.address[1]}" if store is not None else "")
        address, port = gathered[0].rsplit(":", 1)
    except BaseException:
        if store is not None:
            store.stop()
        raise
    return store, dataclasses.replace(job, rendezvous=(address, int(port)))


class _Monitor:
    """Rank 0's watch over the ranks' heartbeats in its store: the driver's stuck-rank rule
    (:func:`optim.spark.rendezvous_store.stuck_rank`). A stuck rank (a frozen process, a cut
    network) ends rank 0's process, which fails the barrier stage, so the client retries it."""

    def __init__(self, store, job):
        self._store, self._job = store, job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfnet-stuck-monitor", daemon=True)

    def start(self) -> _Monitor:
        self._thread.start()
        return self

    def _run(self) -> None:
        from optim.spark.rendezvous_store import stuck_rank

        started = time.monotonic()
        while not self._stop.wait(MONITOR_S):
            why = stuck_rank(self._store.heartbeats(), self._job.size, time.monotonic(), started,
                             self._job.startup_timeout_s)
            if why:
                sys.stderr.write(f"tfnet rank 0: the stage is stuck: {why}; ending it.\n")
                sys.stderr.flush()
                os._exit(70)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
