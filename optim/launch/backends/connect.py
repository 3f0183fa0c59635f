"""The training stage from a Spark Connect client. Client side.

Nothing is hosted on the client, which the executors may not reach: rank 0 hosts the rendezvous store
and watches the heartbeats (:mod:`optim.rank.task`); the net, the hooks, the optimiser state
and numpy data travel in the plan, up to :func:`optim.spark.connect.plan_limit` bytes (48 MiB by
default); a larger net, or a rank 0 result larger than that, goes through ``model_dir``
(``model_dir/.exchange/<id>/``), and without one the call fails before the stage, naming ``model_dir``.
Progress is polled from ``model_dir`` (:mod:`optim.transport.progress_store`); without one, the
per-epoch lines are printed from the history when the run ends. It never touches ``sparkContext``.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import ExitStack, contextmanager, nullcontext

from optim.carriers import Carrier, InFile, InPlan
from optim.errors import DistributedTrainingError
from optim.launch.backends.base import Attempt, Backend, in_canonical_order
from optim.launch.stage import result_bytes
from optim.protocol import Channels
from optim.spark.connect import chunk_bytes, plan_limit, result_limit
from optim.spark.dynamic_allocation import dynamic_allocation
from optim.spark.slots import connect_slots
from optim.transport.auth import derive_key
from optim.transport.progress import EventSink
from tfnet import storage

__all__ = ["ConnectBackend", "num_workers", "quiet_connect_console"]


def num_workers(spark, requested: int | None) -> int:
    """``requested``, or the slots of the session's ``local[N]`` master.

    Raises:
        ValueError: ``requested`` is not positive, or the slots cannot be told and none was given.
    """
    if requested is not None:
        n = int(requested)
        if n < 1:
            raise ValueError(f"`num_workers` must be positive. Received: {requested}")
        return n
    n = connect_slots(spark)
    if n is None:
        from optim.spark.conf import setting

        master = setting(spark, "spark.master", "") or ""
        raise ValueError("Under Spark Connect the client cannot count the cluster's task slots: pass num_workers=N "
                         f"(at most the slots the cluster has; master: {master or 'unknown'}).")
    return n


#: pyspark's switch for a Connect client's own progress bar.
CLIENT_BAR_ENV = "SPARK_CONNECT_PROGRESS_BAR_ENABLED"


@contextmanager
def quiet_connect_console():
    """Spark's bars stay off the client's console while tfnet's jobs run: the client's own bar (when
    :data:`CLIENT_BAR_ENV` turned it on), and the ``[Stage 0:> (0 + 2) / 2]`` bar of a Connect server
    whose JVM runs in this process (``SparkSession.builder.remote("local[2]")``: its console is this
    one). ``spark.ui.showConsoleProgress`` cannot be changed from a client (Spark refuses it with
    ``CANNOT_MODIFY_CONFIG``); the server's JVM is reached through the in-process SparkContext instead.
    A remote server's bar is on the server's console, not here."""
    from pyspark import SparkContext

    from optim.logs import paused_console_progress

    saved = os.environ.get(CLIENT_BAR_ENV)
    os.environ[CLIENT_BAR_ENV] = "0"
    try:
        with ExitStack() as stack:
            local = SparkContext._active_spark_context
            if local is not None and _hosts_connect_server(local):
                stack.enter_context(paused_console_progress(local))
            yield
    finally:
        if saved is None:
            os.environ.pop(CLIENT_BAR_ENV, None)
        else:
            os.environ[CLIENT_BAR_ENV] = saved


def _hosts_connect_server(sc) -> bool:
    """Whether ``sc`` (this process's SparkContext) runs the Connect server (pyspark starts it with
    ``SparkConnectPlugin`` for ``remote("local[...]")``), as opposed to a classic session of the user's."""
    try:
        return "SparkConnectPlugin" in (sc.getConf().get("spark.plugins", "") or "")
    except Exception:  # noqa: BLE001 - a stopped context
        return False


#: Seconds each task of the slot probe holds its slot (:func:`concurrent_slots`).
PROBE_HOLD_S = 1.0


def concurrent_slots(spark, wanted: int, timeout_s: float = 20.0) -> int:
    """Task slots free now, as a Connect client can know them (it cannot ask the scheduler): ``wanted``
    small tasks each hold a slot for :data:`PROBE_HOLD_S` seconds, and the most of them that ran at once
    is the answer (tasks beyond the free slots wait for a later wave). 0 when they did not all finish
    within ``timeout_s`` (the job is cancelled)."""
    from optim.spark.jobs import run_job

    hold = PROBE_HOLD_S

    def hold_a_slot(batches):
        import time as clock

        import pyarrow as pa

        for _ in batches:  # the whole input: the worker stays reusable
            pass
        start = clock.time()
        clock.sleep(hold)
        yield pa.RecordBatch.from_pydict({"start": [start], "end": [clock.time()]})

    action = spark.range(wanted, numPartitions=wanted).mapInArrow(hold_a_slot, "start double, end double").collect
    try:
        rows = run_job(spark, "counting free task slots", action, kind="slots", timeout_s=timeout_s)
    except DistributedTrainingError:
        return 0
    edges = sorted([(r["start"], 1) for r in rows] + [(r["end"], -1) for r in rows])
    best = running = 0
    for _, step in edges:
        running += step
        best = max(best, running)
    return best


class ConnectBackend(Backend):
    mode = "connect"

    def __init__(self, spark):
        super().__init__(spark)
        # dynamic allocation on the server: no barrier mode (Spark refuses it), and executors come for pending tasks
        self.dynamic = dynamic_allocation(spark)

    @property
    def gang(self) -> bool:
        return self.dynamic is not None

    def quiet(self, verbose: int, own_bar: bool = True):
        return quiet_connect_console() if own_bar else nullcontext()

    def partitions(self, requested: int | None) -> int:
        return num_workers(self.spark, requested)

    def ranks(self, num_workers_: int | None) -> int:
        return num_workers(self.spark, num_workers_)

    def balance(self, df, n: int, per_rank: int, timeout_s: float):
        frame = df.repartition(n)
        return in_canonical_order(frame) if self.canonical_order else frame

    def balance_records(self, rdd, n: int, per_rank: int, timeout_s: float):
        return self.records(rdd)

    def records(self, rdd):
        raise TypeError("Cannot use an RDD over Spark Connect: it has no RDDs; pass a DataFrame "
                        "(TFDataset.from_dataframe), Parquet files, numpy arrays or TFDataset.from_tf_data.")

    def validation_limit(self) -> int:
        return plan_limit(self.spark)

    def ship(self, value, cleanup) -> Carrier:
        return InPlan(value)

    def ship_evaluated_net(self, net_bytes: bytes, cleanup) -> Carrier:
        limit = plan_limit(self.spark)
        if len(net_bytes) > limit:
            raise DistributedTrainingError(
                f"The net ({len(net_bytes) / 2**20:.0f} MiB) exceeds what a Spark Connect plan carries "
                f"({limit / 2**20:.0f} MiB, spark.tfnet.connect.maxPlanBytes); evaluate it from a classic SparkSession, "
                "or raise that setting.")
        return self.ship(net_bytes, cleanup)

    def wait_for_slots(self, n: int, wait_s: float) -> int:
        if self.dynamic is not None:  # the stage's pending tasks bring the executors, up to maxExecutors
            return self.dynamic.slots_for(n)
        local = connect_slots(self.spark)  # a local[N] master: N, always
        if local is not None:
            return local
        deadline = time.monotonic() + wait_s
        best = concurrent_slots(self.spark, n)
        while best < n and time.monotonic() < deadline:
            time.sleep(2.0)
            best = max(best, concurrent_slots(self.spark, n))
        return best

    def free_slots(self, wanted: int, running: int) -> int:
        if self.dynamic is not None:
            return self.dynamic.free_slots(wanted, running)
        local = connect_slots(self.spark)
        return max(0, local - running) if local is not None else concurrent_slots(self.spark, wanted)

    def ship_net(self, spec, net_bytes: bytes, carried: int, cleanup) -> tuple[Carrier, str | None]:
        config = spec.config
        limit = plan_limit(self.spark)
        result = result_bytes(spec, config)
        if carried > limit:
            raise DistributedTrainingError(
                f"The numpy data and optimiser state ({carried / 2**20:.0f} MiB) exceed what a Spark Connect plan carries "
                f"({limit / 2**20:.0f} MiB, spark.tfnet.connect.maxPlanBytes): pass the data as a DataFrame.")
        back = result_limit(self.spark)
        if len(net_bytes) + carried <= limit and result <= back:
            return InPlan(net_bytes), None
        if not config.model_dir:
            raise _too_large(len(net_bytes) + carried, limit, result, back)
        exchange = storage.join(config.model_dir, ".exchange", uuid.uuid4().hex[:12])
        storage.makedirs(exchange, config.storage_options)
        cleanup.add(storage.rmtree, exchange, config.storage_options)
        return InFile.written(storage.join(exchange, "net.npz"), net_bytes, config.storage_options), exchange

    def stage_defaults(self) -> dict:
        return {"chunk": chunk_bytes(self.spark)}

    def progress(self, reporter, config, secret: bytes, cleanup):
        if config.model_dir:
            from optim.transport.progress_store import ProgressPoller

            sink = ProgressPoller(reporter, config.storage_options)
            cleanup.add(sink.close)
            return sink
        return EventSink(reporter)

    @contextmanager
    def attempt(self, secret: bytes, n: int, attempt: int, sink, config, startup_timeout: float):
        from optim.transport.progress_store import progress_path

        path = progress_path(config.model_dir, config.run_id, attempt) if config.model_dir else None
        store_file = None
        if self.gang:  # no barrier allGather: rank 0 leaves its store's address in model_dir for the others
            if not config.model_dir:
                err = DistributedTrainingError(
                    "The Spark Connect server runs with dynamic allocation on, so the training stage runs without "
                    "barrier mode (SPARK-24942), and its ranks find rank 0 through model_dir: give TFOptimizer a "
                    "model_dir on storage the cluster reaches (s3://bucket/run, hdfs://..., a shared mount).")
                err.retryable = False  # type: ignore[attr-defined]
                raise err
            store_file = storage.join(config.model_dir, "control", config.run_id, f"store-{attempt}")
        if hasattr(sink, "watch"):
            sink.watch(path)
        channels = Channels(rendezvous=None, rendezvous_key=derive_key(secret, "rendezvous"), progress_path=path,
                            store_file=store_file)
        try:
            yield Attempt(channels)
        finally:
            if store_file is not None:  # the store's address and the failures the ranks left beside it
                for left in [store_file, *(channels.failure_file(r) for r in range(n))]:
                    if storage.exists(left, config.storage_options):
                        storage.remove(left, config.storage_options)

    def stopped(self) -> bool:
        return bool(getattr(self.spark, "is_stopped", False))


def _too_large(shipped: int, limit: int, result: int, back: int) -> DistributedTrainingError:
    """The error for a net (or a result) too large for a Connect plan (or ``collect()``) without ``model_dir``."""
    if shipped > limit:
        what = (f"The net and what goes with it ({shipped / 2**20:.0f} MiB) exceed what a Spark Connect plan carries "
                f"({limit / 2**20:.0f} MiB, spark.tfnet.connect.maxPlanBytes; a net of about {limit / 4 / 1e6:.0f}M "
                "float32 parameters, a third of that with Adam's state).")
    else:
        what = (f"Rank 0's result (the weights and the optimiser state, about {result / 2**20:.0f} MiB) exceeds what a "
                f"Spark Connect client takes back through collect() ({back / 2**20:.0f} MiB, "
                "spark.tfnet.connect.maxResultBytes; the pieces pass through the server's heap).")
    err = DistributedTrainingError(
        f"{what} Give TFOptimizer a model_dir on storage the cluster reaches (s3://bucket/run, hdfs://..., a shared "
        "mount): the net and the result then go through it.")
    err.retryable = False  # type: ignore[attr-defined]
    return err
