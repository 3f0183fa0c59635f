"""Distributed training on Spark: one barrier stage, one Horovod rank per task. Driver side.

``optimize_distributed`` checks the cluster (task slots, the workers' Python), balances the data,
ships the net once (a broadcast), hosts Horovod's Gloo rendezvous and the progress channel, runs
the stage, and retries it from the newest checkpoint when a task dies. The ranks run
:func:`optim.spark_worker.run_rank`.
"""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
import warnings

from optim.data import ArrayDataset, TFDataDataset, TFDataset
from optim.loop import NonFiniteLossError, TrainConfig
from optim.reporting import MultiReporter, ProgressBar
from optim.spark_env import SparkSetupError, get_spark
from tfnet.errors import TFNetError

__all__ = [
    "DistributedTrainingError",
    "optimize_distributed",
    "scale_learning_rate",
    "task_slots",
    "warm_up_workers",
]


class DistributedTrainingError(TFNetError, RuntimeError):
    """The training stage failed on every attempt, or could not start."""


def scale_learning_rate(learning_rate: float, num_workers: int, rule: str = "linear") -> float:
    """The learning rate for ``num_workers`` ranks, from one tuned for one rank with the same
    per-rank batch: ``lr * n`` (``"linear"``, Goyal et al. 2017) or ``lr * sqrt(n)`` (``"sqrt"``).

    tfnet never scales the rate by itself: the global batch is split across ranks, and whether to
    scale is the user's choice.

    >>> scale_learning_rate(0.1, 4)
    0.4
    """
    if num_workers < 1:
        raise ValueError(f"`num_workers` must be positive. Received: {num_workers}")
    if rule == "linear":
        return learning_rate * num_workers
    if rule == "sqrt":
        return learning_rate * math.sqrt(num_workers)
    raise ValueError(f"`rule` must be 'linear' or 'sqrt'. Received: rule={rule!r}")


def task_slots(sc) -> int:
    """How many tasks the cluster can run at once (a barrier stage needs one slot per rank)."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - py4j surface differs across versions
        return int(sc.defaultParallelism)


def _wait_for_slots(sc, needed: int, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    slots = task_slots(sc)
    while slots < needed and time.monotonic() < deadline:
        time.sleep(1.0)
        slots = task_slots(sc)
    return slots


# ---------------------------------------------------------------- checks


def _timing(label: str, t0: float) -> None:
    import os
    import sys

    if os.environ.get("TFNET_DEBUG_TIMING"):
        sys.stderr.write(f"tfnet driver {time.time():.3f} +{time.monotonic() - t0:.2f}s {label}\n")


def _check_driver_horovod() -> None:
    try:
        import horovod.tensorflow as hvd  # noqa: F401
        from horovod.runner.http.http_server import RendezvousServer  # noqa: F401
    except ImportError as exc:
        raise SparkSetupError(
            f"Horovod is not installed in this Python ({exc}). Distributed training needs Horovod 0.28.1 "
            "built with TensorFlow and Gloo: run `bash scripts/build_horovod.sh .venv/bin/python` "
            "(make install does it)."
        ) from None


def _import_report_fn():
    """The probe task: imports what the ranks need in a Python worker and reports what failed.
    Made here, not at module level, so that cloudpickle ships it by value: a worker whose Python
    lacks tfnet must still run it and say so, not fail to unpickle it."""

    def import_report(_) -> list[dict]:
        import sys

        report = {"python": sys.executable}
        for module in ("tfnet", "optim", "tensorflow", "horovod.tensorflow"):
            try:
                __import__(module)
            except Exception as exc:  # noqa: BLE001 - reported back to the driver
                report[module] = f"{type(exc).__name__}: {exc}"
        if "horovod.tensorflow" not in report:
            import horovod.tensorflow as hvd

            if not hvd.gloo_built():
                report["horovod.tensorflow"] = "built without Gloo"
        return [report]

    return import_report


class WarmUp:
    """A running :func:`warm_up_workers` job: ``wait(timeout)`` blocks until it is done and
    returns the workers' reports (``{"python": executable, module: error, ...}``), or None if it
    is still running."""

    def __init__(self, sc, n: int):
        self.reports: list[dict] = []
        self.error: BaseException | None = None
        self._sc, self._n = sc, n
        self._thread = threading.Thread(target=self._run, name="tfnet-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._sc.setJobGroup(f"tfnet-warm-up-{uuid.uuid4().hex[:8]}", "tfnet: warming up the workers' Python",
                                 interruptOnCancel=True)
            self.reports = self._sc.parallelize(range(self._n), self._n).mapPartitions(_import_report_fn()).collect()
        except Exception as exc:  # noqa: BLE001 - optimize() checks the workers and says what is wrong
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> list[dict] | None:
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self.reports


def warm_up_workers(spark=None, num_workers: int | None = None) -> WarmUp:
    """Starts, in the background, one small Spark job per task slot that imports TensorFlow,
    Horovod and tfnet in the Python workers, and returns at once.

    The first distributed ``optimize()`` of a Spark application otherwise waits for every
    worker to import TensorFlow (most of its start-up time: about 12 s on 2 cores). Call this
    right after making the session and go on preparing data or a model on the driver;
    ``optimize()`` then finds the workers warm (with Spark's default
    ``spark.python.worker.reuse``). Errors are not raised here: ``optimize()`` checks the
    workers and reports them.

    Example:
        >>> session = SparkSession.builder.getOrCreate()        # doctest: +SKIP
        >>> optim.warm_up_workers(session)                      # doctest: +SKIP
        >>> ...  # build the model and the data on the driver
        >>> opt.optimize(data, num_workers=2)                   # doctest: +SKIP
    """
    spark = spark or get_spark()
    sc = spark.sparkContext if hasattr(spark, "sparkContext") else spark
    return WarmUp(sc, num_workers or task_slots(sc))


def _probe_workers(sc, n: int, timeout_s: float) -> None:
    """Runs one small task per slot that imports what the ranks need; turns failures into clear
    errors. Also warms the Python workers (TensorFlow gets imported once)."""
    probe = _import_report_fn()

    group = f"tfnet-probe-{uuid.uuid4().hex[:8]}"
    results: list = []
    error: list = []

    def run():
        try:
            sc.setJobGroup(group, "tfnet: checking the workers' Python", interruptOnCancel=True)
            results.extend(sc.parallelize(range(n), n).mapPartitions(probe).collect())
        except Exception as exc:  # noqa: BLE001
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        thread.join(10)
        raise DistributedTrainingError(f"The Spark workers did not answer within {timeout_s:.0f} s.")
    if error:
        raise _classify(error[0], prefix="Checking the Spark workers failed")
    for report in results:
        bad = {k: v for k, v in report.items() if k != "python"}
        if bad:
            module, why = next(iter(bad.items()))
            if module in ("tfnet", "optim"):
                raise SparkSetupError(
                    f"The Spark workers' Python ({report['python']}) cannot import {module}: {why}. Install "
                    "tfnet there (pip install tfnet, or the same .venv) or point PYSPARK_PYTHON at a Python "
                    "that has it."
                )
            if module.startswith("horovod"):
                raise SparkSetupError(
                    f"Horovod is not usable in the Spark workers' Python ({report['python']}): {why}. Build it "
                    "there with scripts/build_horovod.sh."
                )
            raise SparkSetupError(f"The Spark workers' Python ({report['python']}) cannot import {module}: {why}.")


# ---------------------------------------------------------------- errors from the workers

_NOT_RETRYABLE = {
    "NonFiniteLossError": NonFiniteLossError,
    "BadRowError": None,
    "DataError": None,
    "ColumnError": None,
    "LabelShapeError": None,
    "InputSpecError": None,
    "InputTypeError": None,
    "CheckpointError": None,
    "TFNetError": None,
    "ValueError": ValueError,
    "TypeError": TypeError,
    "ModuleNotFoundError": SparkSetupError,
    "ImportError": SparkSetupError,
}
_PY_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.*)$", re.MULTILINE)


def _python_error(exc: BaseException) -> tuple[str | None, str]:
    """The last Python exception named in a Spark/Py4J error: ``(class name, message)``."""
    text = str(exc)
    found = [m for m in _PY_ERROR.finditer(text)
             if m.group(1) not in ("Py4JJavaError", "SparkException", "PythonException", "TaskKilledException")]
    if not found:
        return None, text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    m = found[-1]
    return m.group(1), m.group(2).strip()


def _classify(exc: BaseException, prefix: str = "Training failed") -> Exception:
    text = str(exc)
    if "OutOfMemoryError" in text:
        where = "driver" if "executor driver" in text or "awaitResult" in text else "executor"
        err = DistributedTrainingError(
            f"{prefix}: a Spark JVM ran out of heap (java.lang.OutOfMemoryError, {where}). The net is shipped "
            "as a broadcast and rank 0 returns the weights and optimiser state through the driver, so give "
            "Spark room for a few copies of the model: e.g. spark.driver.memory=4g (set before the session "
            "starts), spark.executor.memory and spark.driver.maxResultSize."
        )
        err.retryable = False  # type: ignore[attr-defined]
        return err
    name, message = _python_error(exc)
    if name in _NOT_RETRYABLE:
        cls = _NOT_RETRYABLE[name]
        if cls is None:
            cls = _error_class(name)
        err = cls(message) if cls is not SparkSetupError else SparkSetupError(f"A Spark worker failed to import: {message}")
        err.retryable = False  # type: ignore[attr-defined]
        return err
    err = DistributedTrainingError(f"{prefix}: {name + ': ' if name else ''}{message}")
    err.retryable = True  # type: ignore[attr-defined]
    return err


def _error_class(name: str):
    from optim.checkpoint import CheckpointError
    from optim.data import DataError
    from optim.losses import LabelShapeError
    from optim.shard import BadRowError
    from optim.spark_data import ColumnError
    from tfnet.errors import InputSpecError, InputTypeError

    return {"BadRowError": BadRowError, "DataError": DataError, "ColumnError": ColumnError,
            "LabelShapeError": LabelShapeError, "InputSpecError": InputSpecError, "InputTypeError": InputTypeError,
            "CheckpointError": CheckpointError}.get(name, TFNetError)


# ---------------------------------------------------------------- data


def balance_dataframe(df, n: int, per_rank_batch: int):
    """The DataFrame with ``n`` partitions. Left as it is when it has ``n`` non-empty partitions
    whose sizes differ by at most one batch; otherwise repartitioned (round robin).

    Returns ``(df, rows per partition before, repartitioned)``."""
    from pyspark.sql import functions as F

    counts = {r["p"]: r["count"] for r in df.groupBy(F.spark_partition_id().alias("p")).count().collect()}
    parts = df.rdd.getNumPartitions()
    sizes = [counts.get(i, 0) for i in range(parts)]
    total = sum(sizes)
    if total < n:
        raise ValueError(f"The training data has {total} rows, fewer than the {n} workers; each rank needs rows.")
    if parts == n and min(sizes) > 0 and max(sizes) - min(sizes) <= per_rank_batch:
        return df, sizes, False
    return df.repartition(n), sizes, True


def balance_rdd(rdd, n: int, per_rank_batch: int):
    sizes = rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()
    total = sum(sizes)
    if total < n:
        raise ValueError(f"The training data has {total} rows, fewer than the {n} workers; each rank needs rows.")
    if len(sizes) == n and min(sizes) > 0 and max(sizes) - min(sizes) <= per_rank_batch:
        return rdd, sizes, False
    return rdd.repartition(n), sizes, True


def _local_validation(val: TFDataset | None):
    if val is None:
        return None
    if isinstance(val, ArrayDataset):
        return val
    to_local = getattr(val, "to_local", None)
    if to_local is not None:
        return to_local()
    raise TypeError(
        "Distributed validation data must be numpy arrays, TFDataset.from_ndarrays or a DataFrame "
        f"(collected to the driver). Received: {type(val).__name__}"
    )


# ---------------------------------------------------------------- the launcher


def optimize_distributed(opt, dataset: TFDataset, config: TrainConfig, validation: TFDataset | None, *,
                         num_workers: int | None = None, verbose: int = 1, max_retries: int = 2,
                         timeout: float = 300.0, startup_timeout: float = 600.0, slot_wait: float = 30.0,
                         steps_per_epoch: int | None = None) -> dict[str, list]:
    """Trains ``opt.net`` on ``num_workers`` Horovod ranks in one Spark barrier stage.

    Args:
        num_workers: Ranks. Default: Spark's default parallelism.
        max_retries: Times to rerun the stage after a failure (a dead task, a lost executor, a
            timeout), resuming from the newest checkpoint in ``model_dir``. Default 2.
        timeout: Seconds without a training step (or a collective) before a rank gives up, and the
            driver cancels the stage. Default 300.
        startup_timeout: Seconds allowed from launch to the first step. Default 600.
        slot_wait: Seconds to wait for enough task slots (executors still registering). Default 30.
        steps_per_epoch: Steps per epoch for tf.data input of unknown length. Default: agreed from
            the data.
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    t_call = time.monotonic()
    _check_driver_horovod()
    spark = get_spark()
    sc = spark.sparkContext
    n = int(num_workers or sc.defaultParallelism)
    if n < 1:
        raise ValueError(f"`num_workers` must be positive. Received: {num_workers}")
    slots = _wait_for_slots(sc, n, slot_wait)
    if slots < n:
        raise DistributedTrainingError(
            f"num_workers={n}, but the cluster has {slots} task slot(s): a barrier stage must run all its "
            f"tasks at once. Use num_workers <= {slots}, or add executors or cores."
        )
    if not isinstance(dataset, TFDataDataset) and config.batch_size % n:
        raise ValueError(
            f"`batch_size` is the global batch and must split evenly over the {n} workers. "
            f"Received: batch_size={config.batch_size}"
        )
    per_rank = config.batch_size // n if not isinstance(dataset, TFDataDataset) else config.batch_size
    _timing("checked slots", t_call)
    _probe_workers(sc, n, startup_timeout)
    _timing("probed workers", t_call)

    # ---- the data, one partition per rank
    kind, reader, data_bc, source = _prepare_data(sc, dataset, n, per_rank)
    val = _local_validation(validation)
    val_bc = sc.broadcast(val) if val is not None else None

    # ---- the net, shipped once
    from tfnet.serialize import net_to_bytes

    _timing("prepared data", t_call)
    exchange = _exchange_dir(sc, config.model_dir)
    net_bc = _ship(sc, net_to_bytes(opt.net), exchange)
    _timing("shipped net", t_call)
    hooks = _pickle_hooks(opt.net)
    worker_config = copy.copy(config)
    worker_config.batch_size = per_rank

    progress_bar = ProgressBar(verbose) if verbose else None
    from optim.progress_channel import ProgressServer

    server = ProgressServer(MultiReporter([progress_bar]))
    driver_host = sc.getConf().get("spark.driver.host", "127.0.0.1")
    history = None
    failures: list[str] = []
    try:
        for attempt in range(max_retries + 1):
            if attempt:
                worker_config = copy.copy(worker_config)
                worker_config.resume = bool(worker_config.model_dir)
                _wait_for_slots(sc, n, max(slot_wait, 60.0))
            rendezvous = RendezvousServer()
            port = rendezvous.start()
            rendezvous.init(get_host_assignments(parse_hosts(",".join(f"rank{r}:1" for r in range(n))), n))
            from optim.spark_worker import RankJob

            job = RankJob(
                exchange=exchange, net=net_bc, hooks=hooks, loss=opt.loss, method=opt.method, metrics=opt.metrics,
                config=worker_config, size=n, kind=kind, reader=reader, data=data_bc, validation=val_bc,
                rendezvous=(driver_host, port), progress=(driver_host, server.port), timeout_s=timeout,
                startup_timeout_s=startup_timeout, state=getattr(opt, "_dist_state", None) if opt._started else None,
                start_step=opt.global_step, steps_per_epoch=steps_per_epoch, attempt=attempt,
                extra_env=horovod_tuning(opt.net),
            )
            try:
                payloads = _run_stage(sc, source, kind, job, server, timeout, startup_timeout)
                history = _apply(opt, payloads)
                break
            except Exception as exc:  # noqa: BLE001 - classified below
                err = exc if isinstance(exc, TFNetError) and not isinstance(exc, DistributedTrainingError) \
                    else _classify(exc)
                if getattr(err, "retryable", False) and _spark_stopped(sc):
                    raise DistributedTrainingError(
                        f"The SparkContext stopped during training, so the stage cannot be retried: {err}"
                    ) from None
                if not getattr(err, "retryable", False):
                    raise err from None
                failures.append(str(err))
                if attempt == max_retries:
                    raise DistributedTrainingError(
                        f"Distributed training failed {len(failures)} time(s), the last time with: {failures[-1]}"
                    ) from None
                warnings.warn(f"Training stage attempt {attempt + 1} failed ({str(err)[:300]}); retrying "
                              f"{'from the newest checkpoint' if config.model_dir else 'from the start (no model_dir)'}.",
                              RuntimeWarning, stacklevel=2)
            finally:
                rendezvous.stop()
    finally:
        server.close()
        if exchange and exchange.startswith(tempfile.gettempdir()):
            shutil.rmtree(exchange, ignore_errors=True)
    opt.last_run = {
        "num_workers": n, "attempts": len(failures) + 1, "failures": failures,
        "startup_s": (server.first_step_at - t_call) if server.first_step_at else None,
        "wall_s": time.monotonic() - t_call,
        "step_times": [e["logs"].get("step_time") for e in server.events if e.get("event") == "step"],
        "allreduce_seconds": [e["logs"].get("allreduce_seconds") for e in server.events if e.get("event") == "step"],
    }
    return history


# Horovod's background thread negotiates with the other ranks every cycle (1 ms by default), even
# while the ranks compute: measured on 2 cores, 10-13% of a core per idle rank at the default,
# 1.3% at 20 ms. For models whose steps take far longer than a cycle, a longer cycle gives that
# CPU back to the computation at no cost in latency that matters.
LARGE_MODEL_VALUES = 5_000_000
LARGE_MODEL_CYCLE_MS = "20"


def horovod_tuning(net) -> dict[str, str]:
    """Extra Horovod settings for the ranks: ``HOROVOD_CYCLE_TIME`` from the driver's environment
    if set, else 20 ms for nets with 5M or more trainable values (Horovod's default otherwise)."""
    if os.environ.get("HOROVOD_CYCLE_TIME"):
        return {"HOROVOD_CYCLE_TIME": os.environ["HOROVOD_CYCLE_TIME"]}
    values = sum(int(v.shape.num_elements() or 0) for v in net.trainable_variables)
    return {"HOROVOD_CYCLE_TIME": LARGE_MODEL_CYCLE_MS} if values >= LARGE_MODEL_VALUES else {}


def _exchange_dir(sc, model_dir: str | None) -> str | None:
    """A folder the driver and every rank can read and write, to move the net and the results
    without passing them through Spark's JVM heap: a temporary folder when the master is local,
    ``model_dir/.exchange`` otherwise (``model_dir`` must be shared storage on a cluster). None:
    use a broadcast and the job result instead."""
    if sc.master.startswith("local"):
        return tempfile.mkdtemp(prefix="tfnet-exchange-")
    if model_dir:
        path = os.path.join(model_dir, ".exchange", uuid.uuid4().hex[:12])
        os.makedirs(path, exist_ok=True)
        return path
    return None


def _ship(sc, data: bytes, exchange: str | None):
    """The serialized net, as a file path in ``exchange`` or as a broadcast."""
    if exchange is None:
        return sc.broadcast(data)
    from tfnet.graph_io import write_bytes_atomic

    path = os.path.join(exchange, "net.npz")
    write_bytes_atomic(path, data)
    return path


def _spark_stopped(sc) -> bool:
    try:
        return bool(sc._jsc.sc().isStopped())
    except Exception:  # noqa: BLE001 - the JVM is gone
        return True


def _prepare_data(sc, dataset: TFDataset, n: int, per_rank: int):
    from optim.spark_data import DataFrameDataset, RDDDataset

    if isinstance(dataset, DataFrameDataset):
        df, _, _ = balance_dataframe(dataset.df.select(*dataset.columns()), n, per_rank)
        return "arrow", dataset.shard_reader(), None, df
    if isinstance(dataset, RDDDataset):
        rdd, _, _ = balance_rdd(dataset.rdd, n, per_rank)
        return "records", dataset.shard_reader(), None, rdd
    if isinstance(dataset, ArrayDataset):
        if len(dataset) < n:
            raise ValueError(f"The training data has {len(dataset)} rows, fewer than the {n} workers.")
        return "arrays", None, sc.broadcast(dataset), sc.parallelize(range(n), n)
    if isinstance(dataset, TFDataDataset):
        return "tf_data", None, dataset, sc.parallelize(range(n), n)
    raise TypeError(f"Cannot train on {type(dataset).__name__} over Spark.")


def _run_stage(sc, source, kind: str, job, server, timeout: float, startup_timeout: float) -> list[bytes]:
    """Runs the barrier stage in a thread; cancels it when progress stops."""
    from optim.spark_worker import run_rank

    group = f"tfnet-train-{uuid.uuid4().hex[:8]}"
    out: list = []
    error: list = []

    def run():
        try:
            sc.setJobGroup(group, f"tfnet: training on {job.size} ranks (attempt {job.attempt + 1})",
                           interruptOnCancel=True)
            if kind == "arrow":
                import pyarrow as pa

                schema = "payload binary, path string"

                def fn(batches):
                    for payload in run_rank(job, batches):
                        row = {"payload": [None], "path": [payload]} if isinstance(payload, str) else \
                            {"payload": [payload], "path": [None]}
                        yield pa.RecordBatch.from_pydict(row, schema=pa.schema(
                            [("payload", pa.binary()), ("path", pa.string())]))

                out.extend(r["path"] or r["payload"]
                           for r in source.mapInArrow(fn, schema, barrier=True).collect())
            else:
                out.extend(source.barrier().mapPartitions(lambda it: run_rank(job, it)).collect())
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            error.append(exc)

    started = time.monotonic()
    server.last_event = started
    server.first_step_at = None
    thread = threading.Thread(target=run, name="tfnet-stage", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(1.0)
        now = time.monotonic()
        waited = now - (server.last_event if server.first_step_at else started)
        limit = timeout if server.first_step_at else startup_timeout
        if thread.is_alive() and waited > limit + 30:
            sc.cancelJobGroup(group)
            thread.join(60)
            raise DistributedTrainingError(
                f"No progress from the ranks for {waited:.0f} s (limit {limit:.0f} s); the stage was cancelled."
            )
    if error:
        raise error[0]
    if len(out) != 1:
        raise DistributedTrainingError(f"Expected one result from rank 0; got {len(out)}.")
    return out


def _apply(opt, payloads: list) -> dict[str, list]:
    from optim.spark_worker import read_payload

    data = payloads[0]
    if isinstance(data, str):  # a file in the exchange folder
        with open(data, "rb") as f:
            data = f.read()
        os.unlink(payloads[0])
    weights, state, meta = read_payload(data)
    opt.net.set_weights(weights)
    opt._dist_state = state
    opt._started = True
    opt.global_step = meta["step"]
    return meta["history"]


def _pickle_hooks(net) -> bytes | None:
    hooks = (list(net._forward_hooks), list(net._gradient_hooks), list(net._update_hooks))
    if not any(hooks):
        return None
    import cloudpickle

    try:
        return cloudpickle.dumps(hooks)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"The net's hooks cannot be sent to the Spark workers: {exc}") from None
