"""The training stage in a classic SparkSession (one with a SparkContext). Driver side.

The driver hosts the stage's channels: the secured rendezvous store (a fresh one per attempt, whose
heartbeats the driver watches) and the authenticated progress channel. Numpy data goes out as
broadcasts; the net and rank 0's result go through an exchange folder (a private temporary folder on
a local master, ``model_dir/.exchange/<id>`` on a cluster) or, without one, through the driver's heap
(checked first: :func:`check_driver_memory`).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager

from optim.carriers import Carrier, InBroadcast, InFile
from optim.errors import DistributedTrainingError
from optim.launch.backends.base import Attempt, Backend, in_canonical_order
from optim.launch.preflight import check_driver_horovod
from optim.launch.stage import result_bytes
from optim.protocol import Channels
from optim.spark.conf import pinned_port, setting, size_setting
from optim.spark.decommission import decommission_enabled, decommissioning_tasks
from optim.spark.dynamic_allocation import dynamic_allocation
from optim.spark.jobs import run_job
from optim.spark.slots import task_slots, wait_for_slots
from optim.transport.auth import derive_key
from optim.transport.client import FAILURE_SCOPE
from optim.transport.failures import failure_text, read_failures
from optim.transport.progress import ProgressServer
from optim.transport.store import SecureRendezvous, stuck_rank
from tfnet import storage

__all__ = ["ClassicBackend", "DRIVER_HEADROOM_BYTES", "balance_dataframe", "balance_rdd", "check_driver_memory",
           "posted_failures"]

#: The most a ``tf.data.Dataset`` object given as distributed validation data may hold once collected to the
#: driver as arrays (a classic session; under Spark Connect the plan's limit): the arrays go to every rank.
VALIDATION_ARRAYS_LIMIT = 512 << 20

#: The driver's JVM holds the broadcast net and the collected result while the stage runs; this
#: much more stays free for Spark itself.
DRIVER_HEADROOM_BYTES = 256 << 20


class ClassicBackend(Backend):
    mode = "classic"
    counts_slots = True

    def __init__(self, spark):
        super().__init__(spark)
        self.sc = spark.sparkContext
        # dynamic allocation on: no barrier mode (Spark refuses it), and executors come for pending tasks
        self.dynamic = dynamic_allocation(self.sc)
        self.sees_decommission = decommission_enabled(self.sc)
        self.shares_console = self.sc.master.startswith("local")

    @property
    def gang(self) -> bool:
        return self.dynamic is not None

    @contextmanager
    def quiet(self, verbose: int, own_bar: bool = True):
        from optim.logs import quiet_task_failures
        from optim.spark.session import shared_python_workers

        with ExitStack() as stack:
            stack.enter_context(quiet_task_failures(self.sc, verbose, pause_progress=own_bar))
            stack.enter_context(shared_python_workers(self.spark))
            yield

    def decommissioning_tasks(self) -> int:
        return decommissioning_tasks(self.sc) if self.sees_decommission else 0

    def partitions(self, requested: int | None) -> int:
        return int(requested or self.sc.defaultParallelism)

    def ranks(self, num_workers: int | None) -> int:
        check_driver_horovod()
        n = int(num_workers or self.sc.defaultParallelism)
        if n < 1:
            raise ValueError(f"`num_workers` must be positive. Received: {num_workers}")
        return n

    def wait_for_slots(self, n: int, wait_s: float) -> int:
        if self.dynamic is not None:  # the stage's pending tasks bring the executors, up to maxExecutors
            return self.dynamic.slots_for(n)
        # a local master cannot grow: its slots are what it has now, so there is nothing to wait for
        return wait_for_slots(self.sc, n, 0.0 if self.sc.master.startswith("local") else wait_s)

    def slots_now(self) -> int | None:
        # with dynamic allocation, executors come and go between stages: fewer now is not a loss
        return None if self.dynamic is not None else task_slots(self.sc)

    def free_slots(self, wanted: int, running: int) -> int:
        if self.dynamic is not None:
            return self.dynamic.free_slots(wanted, running)
        return max(0, task_slots(self.sc) - running)

    def balance(self, df, n: int, per_rank: int, timeout_s: float):
        frame = balance_dataframe(df, n, per_rank, timeout_s)[0]
        return in_canonical_order(frame) if self.canonical_order else frame

    def balance_records(self, rdd, n: int, per_rank: int, timeout_s: float):
        return balance_rdd(rdd, n, per_rank, timeout_s)[0]

    def records(self, rdd):
        return rdd

    def validation_limit(self) -> int:
        return VALIDATION_ARRAYS_LIMIT

    def ship(self, value, cleanup) -> Carrier:
        return InBroadcast(cleanup.broadcast(self.sc.broadcast(value)))

    def ship_net(self, spec, net_bytes: bytes, carried: int, cleanup) -> tuple[Carrier, str | None]:
        config = spec.config
        exchange = _exchange_dir(self.sc, config.model_dir, config.storage_options)
        if exchange is None:
            check_driver_memory(self.sc, len(net_bytes), result_bytes(spec, config))
            return self.ship(net_bytes, cleanup), None
        cleanup.add(storage.rmtree, exchange, config.storage_options)
        return InFile.written(storage.join(exchange, "net.npz"), net_bytes, config.storage_options), exchange

    def stage_defaults(self) -> dict:
        host = setting(self.sc, "spark.driver.host", "127.0.0.1")
        # rank 0's result in one row when it comes back as the job's result (no exchange folder)
        return {"host": host, "bind_host": setting(self.sc, "spark.driver.bindAddress", host), "chunk": 1 << 30}

    def progress(self, reporter, config, secret: bytes, cleanup):
        hosts = self.stage_defaults()
        server = ProgressServer(reporter, host=hosts["bind_host"], authkey=derive_key(secret, "progress"),
                                port=pinned_port(self.sc, "progress"), advertise=hosts["host"])
        cleanup.add(server.close)
        return server

    @contextmanager
    def attempt(self, secret: bytes, n: int, attempt: int, sink, config, startup_timeout: float):
        hosts = self.stage_defaults()
        key = derive_key(secret, "rendezvous")
        with SecureRendezvous(hosts["bind_host"], n, key, port=pinned_port(self.sc, "rendezvous")) as rdv:
            started = time.monotonic()

            def watch() -> str | None:
                why = stuck_rank(rdv.heartbeats(), n, time.monotonic(), started, startup_timeout)
                return why or (posted_failures(rdv) if self.gang else None)

            yield Attempt(
                Channels(rendezvous=(hosts["host"], rdv.address[1]), rendezvous_key=key,
                         progress=(hosts["host"], sink.port), progress_key=derive_key(secret, "progress")),
                watch=watch,
            )

    def stopped(self) -> bool:
        try:
            return bool(self.sc._jsc.sc().isStopped())
        except Exception:  # noqa: BLE001 - the JVM is gone
            return True


def posted_failures(rdv) -> str | None:
    """Why a stage without barrier mode must end: the failures its ranks left in the store (Spark ends such a
    stage's other tasks only after a task failed ``spark.task.maxFailures`` times), as spans the retry policy reads
    (:func:`optim.transport.failures.failures_in`); None while there are none."""
    posted = rdv.entries(FAILURE_SCOPE)
    if not posted:
        return None
    found = read_failures(posted.values())
    ranks = ", ".join(str(f.rank) for f in found) or "?"
    return f"rank(s) {ranks} failed " + " ".join(failure_text(f) for f in found)


# ---------------------------------------------------------------- data


def balance_dataframe(df, n: int, per_rank_batch: int, timeout_s: float = 600.0):
    """The DataFrame with ``n`` partitions. Left as it is when it has ``n`` non-empty partitions
    whose sizes differ by at most one batch; otherwise repartitioned (round robin).

    Returns ``(df, rows per partition before, repartitioned)``."""
    from pyspark.sql import functions as F

    grouped = df.groupBy(F.spark_partition_id().alias("p")).count()
    counts = {r["p"]: r["count"] for r in run_job(df.sparkSession, "counting the training rows", grouped.collect,
                                                   kind="count", timeout_s=timeout_s)}
    parts = df.rdd.getNumPartitions()
    sizes = [counts.get(i, 0) for i in range(parts)]
    total = sum(sizes)
    if total < n:
        raise ValueError(f"The training data has {total} rows, fewer than the {n} workers; each rank needs rows.")
    if parts == n and min(sizes) > 0 and max(sizes) - min(sizes) <= per_rank_batch:
        return df, sizes, False
    return df.repartition(n), sizes, True


def balance_rdd(rdd, n: int, per_rank_batch: int, timeout_s: float = 600.0):
    """:func:`balance_dataframe` for an RDD of records."""
    sizes = run_job(rdd.context, "counting the training rows",
                    rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect, kind="count",
                    timeout_s=timeout_s)
    total = sum(sizes)
    if total < n:
        raise ValueError(f"The training data has {total} rows, fewer than the {n} workers; each rank needs rows.")
    if len(sizes) == n and min(sizes) > 0 and max(sizes) - min(sizes) <= per_rank_batch:
        return rdd, sizes, False
    return rdd.repartition(n), sizes, True


# ---------------------------------------------------------------- the net and the result


def _exchange_dir(sc, model_dir: str | None, storage_options=None) -> str | None:
    """A folder the driver and every rank can read and write, to move the net and the results
    without passing them through Spark's JVM heap: a private temporary folder when the master is
    local, ``model_dir/.exchange/<id>`` otherwise (a URI, or a path every host sees: checked by
    :func:`~optim.launch.preflight.check_model_dir`). None: use a broadcast and the job result
    instead. The caller removes it."""
    if sc.master.startswith("local"):
        return tempfile.mkdtemp(prefix="tfnet-exchange-")
    if model_dir:
        path = storage.join(model_dir, ".exchange", uuid.uuid4().hex[:12])
        storage.makedirs(path, storage_options)
        return path
    return None


def check_driver_memory(sc, net_bytes: int, result_bytes: int) -> None:
    """Without shared storage the net goes out as a broadcast and rank 0's result comes back as the
    job's result, both through the driver's JVM heap: ``net_bytes + result_bytes`` plus
    :data:`DRIVER_HEADROOM_BYTES` must fit in it, and the result in ``spark.driver.maxResultSize``.
    For a net of N float32 parameters trained with Adam that is about 4N + 12N bytes (16N: 1.6 GB
    for 100M parameters). Raises DistributedTrainingError (not retried) before the stage starts."""
    heap = _driver_heap(sc)
    limit = size_setting(setting(sc, "spark.driver.maxResultSize", "1g"))
    need = net_bytes + result_bytes + DRIVER_HEADROOM_BYTES
    too_big = (heap and need > heap) or (limit and result_bytes > limit)
    if too_big:
        err = DistributedTrainingError(
            f"Without shared storage the net ({net_bytes / 2**20:.0f} MiB) and rank 0's result "
            f"({result_bytes / 2**20:.0f} MiB) move through the driver, which has a heap of "
            f"{(heap or 0) / 2**20:.0f} MiB and spark.driver.maxResultSize={limit / 2**20 if limit else 0:.0f} MiB; "
            f"this needs about {need / 2**20:.0f} MiB. Give TFOptimizer a model_dir on shared storage (a URI such "
            "as s3://bucket/run, or a mount every host sees), or raise spark.driver.memory and "
            "spark.driver.maxResultSize before the session starts."
        )
        err.retryable = False  # type: ignore[attr-defined]
        raise err


def _driver_heap(sc) -> int | None:
    try:
        return int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory())
    except Exception:  # noqa: BLE001 - no JVM view
        return None
