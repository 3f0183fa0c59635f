"""The body of one task of the training stage, in both modes: ``mapInArrow(..., barrier=True)`` over
the rank's partition. Worker side.

Around :func:`optim.spark.worker.rank.run_rank` (the rank itself), a task:

* under Spark Connect, whose client the executors may not reach, hosts the stage's channels itself:
  rank 0 starts the secured rendezvous store (:mod:`optim.transport.store`, the job's
  rendezvous key) on its host, every rank finds its address (:mod:`optim.transport.store_address`),
  and rank 0 watches the ranks' heartbeats there and ends the stage when one is stuck (in a classic
  session the driver hosts the store and watches);
* sends rank 0's result as rows of :data:`RESULT_SCHEMA`: the path of the result file when the job
  has an exchange folder, else the payload in pieces of at most ``chunk_size`` bytes;
* fails with the rank's failure inside the error text (:func:`optim.transport.failures.failure_text`), so that the
  driver finds it even where no store outlives the stage.
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

RESULT_SCHEMA = "piece int, chunk binary, path string"
MONITOR_S = 1.0
DONE_SCOPE = "tfnet_done"


def run_arrow_task(job, batches: Iterable, chunk_size: int) -> Iterator:
    """Yields Arrow record batches of rank 0's result (nothing on the other ranks); see the module."""
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    from optim.errors import WorkerError
    from optim.spark.worker.rank import run_rank
    from optim.transport.chunks import to_chunks
    from optim.transport.failures import failure_text, from_exception

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    store = monitor = None
    hosted = job.rendezvous is None  # Spark Connect: the stage hosts its own rendezvous
    try:
        if hosted:
            store, job, gather = _rendezvous(job, ctx, rank)
            if store is not None:
                monitor = _Monitor(store, job).start()
        results = list(run_rank(job, batches))
        if hosted:
            gather.result(job.startup_timeout_s)
            _finish(job, rank, store)  # every rank is done with rank 0's store before rank 0 closes it
    except BaseException as exc:
        failure = from_exception(exc, rank)
        raise WorkerError(f"{failure_text(failure)} rank {rank}: {failure.cls}: {failure.message[:500]}") from exc
    finally:
        if monitor is not None:
            monitor.stop()
        if store is not None:
            store.stop()
    schema = pa.schema([("piece", pa.int32()), ("chunk", pa.binary()), ("path", pa.string())])
    for payload in results:
        if isinstance(payload, str):  # a file in the exchange folder
            yield pa.RecordBatch.from_pydict({"piece": [0], "chunk": [None], "path": [payload]}, schema=schema)
            continue
        for index, piece in to_chunks(payload, chunk_size):
            yield pa.RecordBatch.from_pydict({"piece": [index], "chunk": [piece], "path": [None]}, schema=schema)


def _rendezvous(job, ctx, rank: int):
    """``(store or None, job, gather)``: rank 0 starts the store on its own host; every rank finds its
    address (:mod:`optim.transport.store_address`) while the ``allGather`` of it runs in ``gather``."""
    from optim.transport.store_address import AddressGather, find_store, start_store

    infos = ctx.getTaskInfos()
    hosts = [i.address.rsplit(":", 1)[0] for i in infos] if infos else ["127.0.0.1"] * job.size
    host = hosts[rank]
    store = start_store(host, job.size, job.rendezvous_key, job.attempt) if rank == 0 else None
    try:
        gather = AddressGather(ctx, f"{host}:{store.address[1]}" if store is not None else "")
        address = store.address if store is not None else \
            find_store(hosts[0], job.rendezvous_key, job.attempt, gather, job.startup_timeout_s)
    except BaseException:
        if store is not None:
            store.stop()
        raise
    return store, dataclasses.replace(job, rendezvous=(address[0], int(address[1]))), gather


def _finish(job, rank: int, store) -> None:
    """The stage's last meeting, in rank 0's store rather than Spark's barrier (which answers a task that
    arrives early at its next one-second tick): each other rank says it is done; rank 0 waits for all."""
    from optim.errors import RendezvousError
    from optim.transport import client as kv

    if store is None:
        kv.put(job.rendezvous, DONE_SCOPE, f"rank{rank}", b"1", token=job.rendezvous_key)
        return
    deadline = time.monotonic() + job.startup_timeout_s
    while len(store.keys(DONE_SCOPE)) < job.size - 1:
        if time.monotonic() > deadline:
            missing = sorted(set(range(1, job.size)) - {int(k.removeprefix("rank")) for k in store.keys(DONE_SCOPE)})
            raise RendezvousError(f"Ranks {missing} did not finish within {job.startup_timeout_s:.0f} s of rank 0.")
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
        from optim.transport.store import stuck_rank

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
