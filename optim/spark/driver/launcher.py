"""Distributed training on Spark: one barrier stage, one Horovod rank per task. Driver side.

``optimize_distributed`` checks the cluster (:mod:`~optim.spark.driver.preflight`), balances the
data, ships the net once, hosts the secured rendezvous and progress channel (a fresh secret per
call, a key per channel derived from it), runs the stage, watches the ranks' heartbeats, and
retries it from the run's own newest checkpoint when the failure allows it
(:mod:`~optim.spark.driver.retry`). Whatever happens, it destroys its broadcasts and removes its
exchange folder before it returns. It returns a :class:`DistributedResult`; the optimiser applies
it. The ranks run :func:`optim.spark.worker.rank.run_rank`.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import secrets
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field

import numpy as np

from optim.errors import DistributedTrainingError, NonFiniteLossError, SparkSetupError  # noqa: F401 (re-exported)
from optim.spark.auth import derive_key
from optim.spark.driver.preflight import (
    bounded_job,
    check_driver_horovod,
    check_model_dir,
    probe_workers,
    task_slots,
    wait_for_slots,
    warm_up_workers,
)
from optim.spark.driver.retry import RetryPolicy, stage_error
from optim.spark.progress import ProgressServer
from optim.spark.rendezvous_store import STUCK_GRACE_S, SecureRendezvous, stuck_rank  # noqa: F401 (re-exported)
from optim.spark.session import get_spark
from optim.spark.worker.rank import RankJob, read_payload, run_rank
from optim.sync import LocalSGD
from optim.training import comm_threads
from optim.training.checkpoint import new_run_id
from optim.training.datasets import ArrayDataset, TFDataDataset, TFDataset
from optim.training.loop import TrainConfig
from optim.training.reporting import MultiReporter, ProgressBar
from tfnet import storage
from tfnet.serialize import net_to_bytes

__all__ = [
    "DistributedResult",
    "DistributedTrainingError",
    "optimize_distributed",
    "scale_learning_rate",
    "task_slots",
    "warm_up_workers",
]

log = logging.getLogger("tfnet.spark.driver")


@dataclass
class DistributedResult:
    """What a distributed run hands back to the optimiser: rank 0's final weights, optimiser
    state and step, the history, and what the run measured."""

    weights: dict[str, np.ndarray]
    state: list[np.ndarray]
    step: int
    history: dict[str, list]
    run: dict = field(default_factory=dict)
    exchange_state: list = field(default_factory=list)  # the server method's state (local SGD)


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


# ---------------------------------------------------------------- data


def balance_dataframe(df, n: int, per_rank_batch: int, timeout_s: float = 600.0):
    """The DataFrame with ``n`` partitions. Left as it is when it has ``n`` non-empty partitions
    whose sizes differ by at most one batch; otherwise repartitioned (round robin).

    Returns ``(df, rows per partition before, repartitioned)``."""
    from pyspark.sql import functions as F

    grouped = df.groupBy(F.spark_partition_id().alias("p")).count()
    counts = {r["p"]: r["count"] for r in bounded_job(df.sparkSession.sparkContext, "counting the training rows",
                                                      grouped.collect, timeout_s)}
    parts = df.rdd.getNumPartitions()
    sizes = [counts.get(i, 0) for i in range(parts)]
    total = sum(sizes)
    if total < n:
        raise ValueError(f"The training data has {total} rows, fewer than the {n} workers; each rank needs rows.")
    if parts == n and min(sizes) > 0 and max(sizes) - min(sizes) <= per_rank_batch:
        return df, sizes, False
    return df.repartition(n), sizes, True


def balance_rdd(rdd, n: int, per_rank_batch: int, timeout_s: float = 600.0):
    sizes = bounded_job(rdd.context, "counting the training rows",
                        rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect, timeout_s)
    total = sum(sizes)
    if total < n:
        raise ValueError(f"The training data has {total} rows, fewer than the {n} workers; each rank needs rows.")
    if len(sizes) == n and min(sizes) > 0 and max(sizes) - min(sizes) <= per_rank_batch:
        return rdd, sizes, False
    return rdd.repartition(n), sizes, True


def _validation_for_ranks(val: TFDataset | None):
    """Validation data the ranks read themselves: arrays (broadcast), a tf.data input (each rank
    builds its shard), or an RDD's records (collected to the driver first). A DataFrame goes into
    the stage itself (:func:`optim.spark.datasets.with_validation`) instead."""
    if val is None or isinstance(val, (ArrayDataset, TFDataDataset)):
        return val
    to_local = getattr(val, "to_local", None)
    if to_local is not None:
        return to_local()
    raise TypeError(
        "Distributed validation data must be numpy arrays, a TFDataset (from_ndarrays, from_tf_data, from_dataframe, "
        f"from_rdd). Received: {type(val).__name__}"
    )


# ---------------------------------------------------------------- the launcher


def optimize_distributed(opt, dataset: TFDataset, config: TrainConfig, validation: TFDataset | None, *,
                         num_workers: int | None = None, verbose: int = 1, max_retries: int = 2,
                         timeout: float = 300.0, startup_timeout: float = 600.0, slot_wait: float = 30.0,
                         steps_per_epoch: int | None = None) -> DistributedResult:
    """Trains ``opt.net`` on ``num_workers`` Horovod ranks in one Spark barrier stage.

    Args:
        num_workers: Ranks. Default: Spark's default parallelism.
        max_retries: Times to rerun the stage after a failure a rerun can mend (a dead task, a lost
            executor, a timeout), resuming from this run's newest checkpoint in ``model_dir``.
            Default 2.
        timeout: Seconds a rank may go without progress (a training step, a validation batch)
            before it gives up and the driver cancels the stage. Default 300.
        startup_timeout: Seconds allowed from launch to the first step, and the bound of the long
            phases (the first step's compile, a checkpoint write, waiting for the other ranks'
            validation). Default 600.
        slot_wait: Seconds to wait for enough task slots (executors still registering). Default 30.
        steps_per_epoch: Steps per epoch for tf.data input of unknown length. Default: agreed from
            the data.
    """
    from optim.logs import quiet_task_failures
    from optim.spark.connect import is_connect, session_of
    from optim.spark.session import shared_python_workers

    spark = session_of(dataset) or get_spark()
    if is_connect(spark):
        from optim.spark.driver.connect_launcher import optimize_connect

        return optimize_connect(opt, dataset, config, validation, spark, num_workers=num_workers, verbose=verbose,
                                max_retries=max_retries, timeout=timeout, startup_timeout=startup_timeout,
                                steps_per_epoch=steps_per_epoch)
    with quiet_task_failures(spark.sparkContext, verbose), shared_python_workers(spark):
        return _optimize_distributed(opt, dataset, config, validation, num_workers=num_workers, verbose=verbose,
                                     max_retries=max_retries, timeout=timeout, startup_timeout=startup_timeout,
                                     slot_wait=slot_wait, steps_per_epoch=steps_per_epoch)


def _optimize_distributed(opt, dataset: TFDataset, config: TrainConfig, validation: TFDataset | None, *,
                          num_workers, verbose, max_retries, timeout, startup_timeout, slot_wait,
                          steps_per_epoch) -> DistributedResult:
    t_call = time.monotonic()
    config = copy.copy(config)
    config.run_id = config.run_id or new_run_id()
    sc, n, per_rank = _check_cluster(dataset, config, num_workers, slot_wait, startup_timeout)
    secret = secrets.token_bytes(32)  # this call's secret: it stays here; the ranks get derived keys
    cleanup = _Cleanup()
    try:
        stage = _prepare_stage(sc, opt, dataset, validation, config, n, per_rank, cleanup, startup_timeout)
        server = ProgressServer(MultiReporter([ProgressBar(verbose) if verbose else None]), host=stage.bind_host,
                                authkey=derive_key(secret, "progress"), port=_pinned_port(sc, "progress"),
                                advertise=stage.driver_host)
        cleanup.add(server.close)
        failures: list[str] = []
        attempts: list[dict] = []
        result = _run_attempts(sc, opt, stage, server, secret, RetryPolicy(max_retries), failures, attempts,
                               timeout=timeout, startup_timeout=startup_timeout, slot_wait=slot_wait,
                               steps_per_epoch=steps_per_epoch, verbose=verbose)
    finally:
        cleanup.run()
    result.run = {**_run_summary(server, n, failures, t_call), **result.run, "attempt_log": attempts,
                  "run_id": config.run_id}
    return result


class _Cleanup:
    """What a call made and must take away on every way out: broadcasts, the exchange folder, the
    progress server. Each step runs once, in reverse order; one that fails does not stop the rest."""

    def __init__(self):
        self._steps: list = []

    def add(self, fn, *args) -> None:
        self._steps.append((fn, args))

    def broadcast(self, bc):
        if bc is not None and hasattr(bc, "destroy"):
            self.add(_destroy, bc)
        return bc

    def run(self) -> None:
        while self._steps:
            fn, args = self._steps.pop()
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - clean-up goes on; the run's own error wins
                log.warning("Clean-up step %s failed: %s", getattr(fn, "__name__", fn), exc)


def _destroy(bc) -> None:
    """Destroys a broadcast on the executors and removes its file from the driver's disk."""
    path = getattr(bc, "_path", None)
    bc.destroy()
    if path and os.path.exists(path):
        os.unlink(path)


@dataclass
class _Stage:
    """What every attempt of the stage shares: the data (one partition per rank), the validation
    data, the shipped net and hooks, the ranks' config (per-rank batch), and the driver's address
    (classic) or the size of rank 0's result pieces (Spark Connect)."""

    n: int
    kind: str
    reader: object
    data: object
    source: object
    validation: object
    exchange: str | None
    net: object
    hooks: bytes | None
    config: TrainConfig
    driver_host: str = ""
    bind_host: str = ""
    chunk: int = 0


def rank_job(opt, stage: _Stage, attempt: int, *, timeout: float, startup_timeout: float,
             steps_per_epoch: int | None, verbose: int, **channels) -> RankJob:
    """The ranks' job for one attempt of ``stage``; ``channels`` say how the ranks meet and report
    (``rendezvous``, ``progress`` or ``progress_path``, and their keys)."""
    return RankJob(
        exchange=stage.exchange, net=stage.net, hooks=stage.hooks, loss=opt.loss, method=opt.method,
        metrics=opt.metrics, config=stage.config, size=stage.n, kind=stage.kind, reader=stage.reader,
        data=stage.data, validation=stage.validation, timeout_s=timeout, startup_timeout_s=startup_timeout,
        state=opt.state, start_step=opt.global_step, steps_per_epoch=steps_per_epoch, attempt=attempt,
        lr_source=getattr(opt, "_lr_source", None),
        log_level=_worker_log_level(verbose), outputs=(opt.net.output_names, opt.net.output_specs),
        horovod_threads=comm_threads.mode_from_env(), exchange_state=opt.exchange_state or None,
        **channels,
    )


def _check_cluster(dataset: TFDataset, config: TrainConfig, num_workers: int | None, slot_wait: float,
                   startup_timeout: float):
    """Horovod on the driver, the number of ranks, the task slots, the batch split and the workers.
    Returns ``(SparkContext, ranks, per-rank batch)``."""
    check_driver_horovod()
    sc = get_spark().sparkContext
    n = int(num_workers or sc.defaultParallelism)
    if n < 1:
        raise ValueError(f"`num_workers` must be positive. Received: {num_workers}")
    # a local master cannot grow: its slots are what it has now, so there is nothing to wait for
    slots = wait_for_slots(sc, n, 0.0 if sc.master.startswith("local") else slot_wait)
    if slots < n:
        raise DistributedTrainingError(
            f"num_workers={n}, but the cluster has {slots} task slot(s): a barrier stage must run all its "
            f"tasks at once. Use num_workers <= {slots}, or add executors or cores."
        )
    per_rank = per_rank_batch(dataset, config, n)
    check_workers(sc, n, startup_timeout, config)
    return sc, n, per_rank


def per_rank_batch(dataset: TFDataset, config: TrainConfig, n: int) -> int:
    """Each rank's batch: the global batch split evenly over ``n`` ranks (a tf.data input batches
    itself on each rank)."""
    if isinstance(dataset, TFDataDataset):
        return config.batch_size
    if config.batch_size % n:
        raise ValueError(
            f"`batch_size` is the global batch and must split evenly over the {n} workers. "
            f"Received: batch_size={config.batch_size}"
        )
    return config.batch_size // n


def check_workers(target, n: int, timeout_s: float, config: TrainConfig) -> None:
    """``model_dir`` writable here (a marker file, removed after) and the workers' Python, and the
    marker readable there (:func:`~optim.spark.driver.preflight.probe_workers`); ``target`` is a
    SparkContext or a Spark Connect session."""
    marker = check_model_dir(config.model_dir, config.storage_options) if config.model_dir else None
    try:
        probe_workers(target, n, timeout_s, (marker, config.storage_options) if marker else None)
    finally:
        if marker:
            storage.remove(marker, config.storage_options)


def _prepare_stage(sc, opt, dataset: TFDataset, validation: TFDataset | None, config: TrainConfig, n: int,
                   per_rank: int, cleanup: _Cleanup, timeout_s: float) -> _Stage:
    """The data, one partition per rank; the validation data; the net, shipped once. Everything it
    makes is registered with ``cleanup``."""
    from optim.spark.datasets import DataFrameDataset, with_validation

    if isinstance(dataset, DataFrameDataset) and isinstance(validation, DataFrameDataset):
        # both DataFrames: one stage reads both; each rank validates on its own rows
        source, reader = with_validation(dataset, validation, n)
        kind, data_bc, val_bc = "arrow", None, None
    else:
        kind, reader, data_bc, source = _prepare_data(sc, dataset, n, per_rank, cleanup, timeout_s)
        val = _validation_for_ranks(validation)
        val_bc = _ship_validation(sc, val, cleanup)
    exchange = _exchange_dir(sc, config.model_dir, config.storage_options)
    if exchange is not None:
        cleanup.add(storage.rmtree, exchange, config.storage_options)
    net_bytes = net_to_bytes(opt.net)
    if exchange is None:
        check_driver_memory(sc, len(net_bytes), _result_bytes(opt, config))
    net_bc = _ship(sc, net_bytes, exchange, cleanup, config.storage_options)
    worker_config = copy.copy(config)
    worker_config.batch_size = per_rank
    conf = sc.getConf()
    host = conf.get("spark.driver.host", "127.0.0.1")
    return _Stage(n, kind, reader, data_bc, source, val_bc, exchange, net_bc, _pickle_hooks(opt.net), worker_config,
                  host, conf.get("spark.driver.bindAddress", host))


def _ship_validation(sc, val, cleanup: _Cleanup):
    """Arrays go as a broadcast; a tf.data input goes with the job (its function builds each rank's
    shard there)."""
    if val is None:
        return None
    if isinstance(val, TFDataDataset):
        import cloudpickle

        try:
            cloudpickle.dumps(val)
        except Exception as exc:  # noqa: BLE001 - a tf.data.Dataset object cannot be pickled
            raise TypeError("Distributed validation from tf.data needs TFDataset.from_tf_data(fn), with fn(rank, size) "
                            f"building each rank's dataset; a Dataset object cannot be sent to the ranks ({exc}).") from None
        return val
    return cleanup.broadcast(sc.broadcast(val))


def _pinned_port(sc, channel: str) -> int:
    """The port pinned for ``channel`` (``spark.tfnet.rendezvous.port`` / ``spark.tfnet.progress.port``,
    for a firewalled cluster), or 0 for one the OS picks."""
    key = f"spark.tfnet.{channel}.port"
    value = sc.getConf().get(key, "0")
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port < 65536:
        raise ValueError(f"`{key}` must be a port number (0 for any). Received: {value!r}")
    return port


def _run_attempts(sc, opt, stage: _Stage, server, secret: bytes, policy: RetryPolicy, failures: list[str],
                  attempts: list[dict], *, timeout: float, startup_timeout: float, slot_wait: float,
                  steps_per_epoch: int | None, verbose: int) -> DistributedResult:
    """Runs the stage until it succeeds, or fails in a way a retry cannot help, or the retries
    run out. Every attempt runs under the same run id, so a retry resumes from this run's own
    newest checkpoint (with ``model_dir``) and never from another run's."""
    rendezvous_key = derive_key(secret, "rendezvous")
    for attempt in range(policy.max_retries + 1):
        if attempt:
            wait_for_slots(sc, stage.n, max(slot_wait, 60.0))
        with SecureRendezvous(stage.bind_host, stage.n, rendezvous_key, port=_pinned_port(sc, "rendezvous")) as rdv:
            job = rank_job(opt, stage, attempt, timeout=timeout, startup_timeout=startup_timeout,
                           steps_per_epoch=steps_per_epoch, verbose=verbose,
                           rendezvous=(stage.driver_host, rdv.address[1]), progress=(stage.driver_host, server.port),
                           rendezvous_key=rendezvous_key, progress_key=derive_key(secret, "progress"))
            try:
                result = _read_result(_run_stage(sc, stage.source, stage.kind, job, rdv, timeout, startup_timeout),
                                      stage.config.storage_options)
                attempts.append({"attempt": attempt, "ok": True, **result.run})
                return result
            except Exception as exc:  # noqa: BLE001 - turned into the ranks' own error below
                attempts.append({"attempt": attempt, "ok": False, "error": str(exc)[:300]})
                _after_failure(lambda: _spark_stopped(sc), exc, rdv.failures(), policy, attempt, failures,
                               bool(stage.config.model_dir))
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def _after_failure(stopped, exc: Exception, reports: list, policy: RetryPolicy, attempt: int, failures: list[str],
                   has_model_dir: bool) -> None:
    """Raises the ranks' own error (or a DistributedTrainingError) unless the stage is retried;
    otherwise records the failure and warns. ``stopped()`` says whether the session is gone."""
    err = stage_error(exc, reports)
    if not getattr(err, "retryable", False):
        raise err from exc
    if stopped():
        raise DistributedTrainingError(
            f"The SparkContext stopped during training, so the stage cannot be retried: {err}"
        ) from exc
    failures.append(str(err))
    if not policy.should_retry(err, attempt):
        raise DistributedTrainingError(
            f"Distributed training failed {len(failures)} time(s), the last time with: {failures[-1]}"
        ) from exc
    message = (f"Training stage attempt {attempt + 1} failed ({one_line(str(err))}); retrying "
               f"{_RETRY_FROM[has_model_dir]}.")
    log.warning(message)
    # stacklevel 6: the warning points at optimize()'s caller (through optimize_distributed, _optimize_distributed
    # or optimize_connect, and _run_attempts).
    warnings.warn(message, RuntimeWarning, stacklevel=6)


def one_line(text: str, limit: int = 300) -> str:
    """An error in one line for a warning: its first line, and its last when they differ (a TF
    graph error's first line says where, its last says what), cut to ``limit`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    short = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return short if len(short) <= limit else short[:limit - 3] + "..."


_RETRY_FROM = {True: "from this run's newest checkpoint", False: "from the start (no model_dir)"}


def _run_summary(server, n: int, failures: list[str], t_call: float) -> dict:
    """What the run measured: attempts, start-up and wall time, step and allreduce times."""
    steps = [e for e in server.events if e.get("event") == "step"]
    return {
        "num_workers": n, "attempts": len(failures) + 1, "failures": failures,
        "startup_s": (server.first_step_at - t_call) if server.first_step_at else None,
        "wall_s": time.monotonic() - t_call,
        "step_times": [e["logs"].get("step_time") for e in steps],
        "allreduce_seconds": [e["logs"].get("allreduce_seconds") for e in steps],
        "refused_progress_clients": server.refused,
    }


def _worker_log_level(verbose: int) -> int:
    """The ranks' log level: their warnings at the default verbosity, everything at 2+."""
    return logging.DEBUG if verbose >= 2 else logging.WARNING


def _exchange_dir(sc, model_dir: str | None, storage_options=None) -> str | None:
    """A folder the driver and every rank can read and write, to move the net and the results
    without passing them through Spark's JVM heap: a private temporary folder when the master is
    local, ``model_dir/.exchange/<id>`` otherwise (a URI, or a path every host sees: checked by
    :func:`~optim.spark.driver.preflight.check_model_dir`). None: use a broadcast and the job result
    instead. The caller removes it."""
    if sc.master.startswith("local"):
        return tempfile.mkdtemp(prefix="tfnet-exchange-")
    if model_dir:
        path = storage.join(model_dir, ".exchange", uuid.uuid4().hex[:12])
        storage.makedirs(path, storage_options)
        return path
    return None


def _ship(sc, data: bytes, exchange: str | None, cleanup: _Cleanup, storage_options=None):
    """The serialized net, as a file path in ``exchange`` or as a broadcast."""
    if exchange is None:
        return cleanup.broadcast(sc.broadcast(data))
    path = storage.join(exchange, "net.npz")
    storage.write_bytes_atomic(path, data, storage_options)
    return path


def _result_bytes(opt, config: TrainConfig) -> int:
    """What rank 0's result holds: every weight, the optimiser state (its slots are sized like
    the trainable weights; estimated from the method's own state), and local SGD's server state."""
    weights = sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in opt.net.weight_variables.values())
    trainable = sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in opt.net.trainable_variables)
    state = sum(int(np.asarray(a).nbytes) for a in opt.state) if opt.state is not None else 2 * trainable
    server = 0
    if isinstance(config.sync, LocalSGD):
        carried = opt.exchange_state
        server = sum(int(np.asarray(a).nbytes) for a in carried) if carried else 2 * trainable
    return weights + state + server  # 2 x trainable: Adam's two slots, the largest of tfnet's methods'


#: The driver's JVM holds the broadcast net and the collected result while the stage runs; this
#: much more stays free for Spark itself.
DRIVER_HEADROOM_BYTES = 256 << 20


def check_driver_memory(sc, net_bytes: int, result_bytes: int) -> None:
    """Without shared storage the net goes out as a broadcast and rank 0's result comes back as the
    job's result, both through the driver's JVM heap: ``net_bytes + result_bytes`` plus
    :data:`DRIVER_HEADROOM_BYTES` must fit in it, and the result in ``spark.driver.maxResultSize``.
    For a net of N float32 parameters trained with Adam that is about 4N + 12N bytes (16N: 1.6 GB
    for 100M parameters). Raises DistributedTrainingError (not retried) before the stage starts."""
    heap = _driver_heap(sc)
    limit = _size_setting(sc.getConf().get("spark.driver.maxResultSize", "1g"))
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
    except Exception:  # noqa: BLE001 - no JVM view (a Connect client): the result-size check remains
        return None


def _size_setting(text: str) -> int | None:
    """Bytes of a Spark size setting (``1g``, ``512m``, ``0`` for unlimited -> None)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = str(text).strip().lower().rstrip("b")
    try:
        value = int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except (ValueError, IndexError):
        return None
    return value or None


def _spark_stopped(sc) -> bool:
    try:
        return bool(sc._jsc.sc().isStopped())
    except Exception:  # noqa: BLE001 - the JVM is gone
        return True


def _prepare_data(sc, dataset: TFDataset, n: int, per_rank: int, cleanup: _Cleanup, timeout_s: float):
    from optim.spark.datasets import DataFrameDataset, RDDDataset

    if isinstance(dataset, DataFrameDataset):
        df, _, _ = balance_dataframe(dataset.df.select(*dataset.columns()), n, per_rank, timeout_s)
        return "arrow", dataset.shard_reader(), None, df
    if isinstance(dataset, RDDDataset):
        rdd, _, _ = balance_rdd(dataset.rdd, n, per_rank, timeout_s)
        return "records", dataset.shard_reader(), None, rdd
    if isinstance(dataset, ArrayDataset):
        if len(dataset) < n:
            raise ValueError(f"The training data has {len(dataset)} rows, fewer than the {n} workers.")
        return "arrays", None, cleanup.broadcast(sc.broadcast(dataset)), sc.parallelize(range(n), n)
    if isinstance(dataset, TFDataDataset):
        return "tf_data", None, dataset, sc.parallelize(range(n), n)
    raise TypeError(f"Cannot train on {type(dataset).__name__} over Spark.")


def _run_stage(sc, source, kind: str, job, rendezvous, timeout: float, startup_timeout: float) -> list[bytes]:
    """Runs the barrier stage in a thread; cancels it when a rank's heartbeat says it is stuck."""
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
    thread = threading.Thread(target=run, name="tfnet-stage", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(1.0)
        why = stuck_rank(rendezvous.heartbeats(), job.size, time.monotonic(), started, startup_timeout)
        if thread.is_alive() and why:
            sc.cancelJobGroup(group)
            thread.join(60)
            raise DistributedTrainingError(f"The stage was cancelled: {why}.")
    if error:
        raise error[0]
    if len(out) != 1:
        raise DistributedTrainingError(f"Expected one result from rank 0; got {len(out)}.")
    return out


def _read_result(payloads: list, options=None) -> DistributedResult:
    data = payloads[0]
    if isinstance(data, str):  # a file in the exchange folder
        data = storage.read_bytes(payloads[0], options)
        storage.remove(payloads[0], options)
    return result_from_payload(data)


def result_from_payload(data: bytes) -> DistributedResult:
    """Rank 0's payload (:func:`optim.spark.worker.rank.read_payload`) as the optimiser takes it."""
    weights, state, meta = read_payload(data)
    run = {k: meta.get(k) for k in ("start_step", "resumed_from", "rows", "steps_per_epoch")}
    run["end_step"] = meta["step"]
    return DistributedResult(weights, state, meta["step"], meta["history"], run, meta["exchange_state"])


def _pickle_hooks(net) -> bytes | None:
    hooks = (list(net._forward_hooks), list(net._gradient_hooks), list(net._update_hooks))
    if not any(hooks):
        return None
    import cloudpickle

    try:
        return cloudpickle.dumps(hooks)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"The net's hooks cannot be sent to the Spark workers: {exc}") from None
