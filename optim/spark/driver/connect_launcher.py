"""Distributed training from a Spark Connect client. Client side.

The same training as :mod:`optim.spark.driver.launcher` (one barrier stage, one Horovod rank per
task, the same loop, the same equal-steps rule, retries from the run's own checkpoint), with
nothing hosted on the client, which the executors may not reach:

* the stage is ``mapInArrow(..., barrier=True)`` on the DataFrame (or on ``spark.range(n)`` for
  numpy and tf.data input); rank 0 hosts the secured rendezvous store
  (:mod:`optim.spark.worker.connect`);
* the net, the hooks, the optimiser state and numpy data travel in the plan, up to
  :func:`optim.spark.connect.plan_limit` bytes (48 MiB by default); a larger net goes through
  ``model_dir`` (``model_dir/.exchange/<id>/net.npz``), and without one the call fails before the
  stage, naming ``model_dir``;
* rank 0's result comes back through ``collect()`` in pieces; a failure inside the task's error;
* progress goes through ``model_dir`` (:mod:`optim.spark.progress_store`); without one, the
  per-epoch lines are printed from the history when the run ends.

It never touches ``sparkContext``.
"""

from __future__ import annotations

import copy
import logging
import secrets
import threading
import time
import uuid

import numpy as np

from optim.errors import DistributedTrainingError
from optim.spark.auth import derive_key
from optim.spark.connect import chunk_bytes, failures_in, join_chunks, plan_limit
from optim.spark.driver.launcher import (
    DistributedResult,
    _after_failure,
    _Cleanup,
    _pickle_hooks,
    _run_summary,
    _Stage,
    _validation_for_ranks,
    check_workers,
    per_rank_batch,
    rank_job,
    result_from_payload,
)
from optim.spark.driver.retry import RetryPolicy
from optim.spark.progress import EventSink
from optim.spark.worker.rank import RankJob
from optim.training.datasets import ArrayDataset, TFDataDataset, TFDataset
from optim.training.loop import TrainConfig
from optim.training.reporting import MultiReporter, ProgressBar
from tfnet import storage
from tfnet.serialize import net_to_bytes

log = logging.getLogger("tfnet.spark.driver")


def optimize_connect(opt, dataset: TFDataset, config: TrainConfig, validation: TFDataset | None, spark, *,
                     num_workers: int | None, verbose: int, max_retries: int, timeout: float, startup_timeout: float,
                     steps_per_epoch: int | None) -> DistributedResult:
    """Trains ``opt.net`` on ``num_workers`` ranks of the Connect session ``spark``; see the module."""
    t_call = time.monotonic()
    config = copy.copy(config)
    n = _num_workers(spark, num_workers)
    per_rank = per_rank_batch(dataset, config, n)
    check_workers(spark, n, startup_timeout, config)
    secret = secrets.token_bytes(32)
    cleanup = _Cleanup()
    sink = None
    try:
        stage = _prepare(spark, opt, dataset, validation, config, n, per_rank, cleanup)
        reporter = MultiReporter([ProgressBar(verbose) if verbose else None])
        if config.model_dir:
            from optim.spark.progress_store import ProgressPoller

            sink = ProgressPoller(reporter, config.storage_options)
        else:
            sink = EventSink(reporter)
        cleanup.add(_close_sink, sink)
        failures: list[str] = []
        attempts: list[dict] = []
        result = _run_attempts(spark, opt, stage, sink, secret, RetryPolicy(max_retries), failures, attempts,
                               timeout=timeout, startup_timeout=startup_timeout, steps_per_epoch=steps_per_epoch,
                               verbose=verbose)
        if not config.model_dir and verbose:
            _print_history(result, verbose)
    finally:
        cleanup.run()
    result.run = {**_run_summary(sink, n, failures, t_call), **result.run, "attempt_log": attempts,
                  "run_id": config.run_id, "mode": "connect"}
    return result


def _close_sink(sink) -> None:
    if hasattr(sink, "close"):
        sink.close()


def _num_workers(spark, num_workers: int | None) -> int:
    if num_workers is not None:
        n = int(num_workers)
        if n < 1:
            raise ValueError(f"`num_workers` must be positive. Received: {num_workers}")
        return n
    try:
        master = spark.conf.get("spark.master", "") or ""
    except Exception:  # noqa: BLE001 - a server that hides it
        master = ""
    if master.startswith("local["):
        inner = master[len("local["):].split(",")[0].rstrip("]")
        if inner.isdigit():
            return int(inner)
    raise ValueError("Under Spark Connect the client cannot count the cluster's task slots: pass num_workers=N "
                     f"(at most the slots the cluster has; master: {master or 'unknown'}).")


def _prepare(spark, opt, dataset: TFDataset, validation: TFDataset | None, config: TrainConfig, n: int,
             per_rank: int, cleanup: _Cleanup) -> _Stage:
    from optim.spark.datasets import DataFrameDataset, RDDDataset, with_validation

    val = None
    if isinstance(dataset, DataFrameDataset) and isinstance(validation, DataFrameDataset):
        source, reader = with_validation(dataset, validation, n)
        kind, data = "arrow", None
    else:
        if isinstance(validation, RDDDataset) or isinstance(dataset, RDDDataset):
            raise TypeError("A Spark Connect session has no RDDs: pass a DataFrame (TFDataset.from_dataframe), "
                            "numpy arrays or TFDataset.from_tf_data.")
        val = _validation_for_ranks(validation)
        if isinstance(dataset, DataFrameDataset):
            source, reader, kind, data = dataset.df.select(*dataset.columns()).repartition(n), dataset.shard_reader(), \
                "arrow", None
        elif isinstance(dataset, ArrayDataset):
            if len(dataset) < n:
                raise ValueError(f"The training data has {len(dataset)} rows, fewer than the {n} workers.")
            source, reader, kind, data = spark.range(n, numPartitions=n), None, "arrays", dataset
        elif isinstance(dataset, TFDataDataset):
            source, reader, kind, data = spark.range(n, numPartitions=n), None, "tf_data", dataset
        else:
            raise TypeError(f"Cannot train on {type(dataset).__name__} over Spark.")
    net: object = net_to_bytes(opt.net)
    limit = plan_limit(spark)
    carried = (opt.state or []) + opt.exchange_state  # both go in the job
    shipped = _plan_bytes(net, data, val, carried)
    if shipped > limit:
        net = _through_model_dir(net, config, cleanup, shipped, limit)
        left = _plan_bytes(b"", data, val, carried)
        if left > limit:
            raise DistributedTrainingError(
                f"The numpy data and optimiser state ({left / 2**20:.0f} MiB) exceed what a Spark Connect plan carries "
                f"({limit / 2**20:.0f} MiB, spark.tfnet.connect.maxPlanBytes): pass the data as a DataFrame.")
    worker_config = copy.copy(config)
    worker_config.batch_size = per_rank
    return _Stage(n=n, kind=kind, reader=reader, data=data, source=source, validation=val, exchange=None, net=net,
                  hooks=_pickle_hooks(opt.net), config=worker_config, chunk=chunk_bytes(spark))


def _plan_bytes(net, data, val, state) -> int:
    """About what the plan carries: the net, numpy data, numpy validation data, the optimiser state."""
    total = len(net) if isinstance(net, (bytes, bytearray)) else 0
    for part in (data, val):
        if isinstance(part, ArrayDataset):
            total += sum(int(np.asarray(a).nbytes) for a in list(part.features) + list(part.labels or []))
    return total + sum(int(np.asarray(a).nbytes) for a in (state or []))


def _through_model_dir(net: bytes, config: TrainConfig, cleanup: _Cleanup, shipped: int, limit: int) -> str:
    if not config.model_dir:
        err = DistributedTrainingError(
            f"The net and what goes with it ({shipped / 2**20:.0f} MiB) exceed what a Spark Connect plan carries "
            f"({limit / 2**20:.0f} MiB, spark.tfnet.connect.maxPlanBytes; a net of about {limit / 4 / 1e6:.0f}M "
            "float32 parameters, a third of that with Adam's state). Give TFOptimizer a model_dir on storage the cluster reaches "
            "(s3://bucket/run, hdfs://..., a shared mount): the net then goes through it.")
        err.retryable = False  # type: ignore[attr-defined]
        raise err
    exchange = storage.join(config.model_dir, ".exchange", uuid.uuid4().hex[:12])
    storage.makedirs(exchange, config.storage_options)
    cleanup.add(storage.rmtree, exchange, config.storage_options)
    path = storage.join(exchange, "net.npz")
    storage.write_bytes_atomic(path, net, config.storage_options)
    return path


def _run_attempts(spark, opt, stage: _Stage, sink, secret: bytes, policy: RetryPolicy, failures: list[str],
                  attempts: list[dict], *, timeout: float, startup_timeout: float, steps_per_epoch: int | None,
                  verbose: int) -> DistributedResult:
    """Runs the stage until it succeeds, or fails in a way a retry cannot help, or the retries run
    out; every attempt under the same run id, so a retry resumes from this run's own checkpoint."""
    from optim.spark.progress_store import progress_path

    config = stage.config
    for attempt in range(policy.max_retries + 1):
        path = progress_path(config.model_dir, config.run_id, attempt) if config.model_dir else None
        if hasattr(sink, "watch"):
            sink.watch(path)
        job = rank_job(opt, stage, attempt, timeout=timeout, startup_timeout=startup_timeout,
                       steps_per_epoch=steps_per_epoch, verbose=verbose, rendezvous=None, progress=None,
                       progress_path=path, rendezvous_key=derive_key(secret, "rendezvous"))
        try:
            result = result_from_payload(join_chunks(_run_stage(spark, stage, job)))
            attempts.append({"attempt": attempt, "ok": True, **result.run})
            return result
        except Exception as exc:  # noqa: BLE001 - turned into the ranks' own error below
            attempts.append({"attempt": attempt, "ok": False, "error": str(exc)[:300]})
            _after_failure(lambda: bool(getattr(spark, "is_stopped", False)), exc, failures_in(str(exc)), policy,
                           attempt, failures, bool(config.model_dir))
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def _run_stage(spark, stage: _Stage, job: RankJob) -> list[tuple[int, bytes]]:
    """Runs the barrier stage, tagged so that it can be interrupted, and collects rank 0's pieces."""
    from optim.spark.worker.connect import RESULT_SCHEMA, run_connect_rank

    chunk = stage.chunk

    def fn(batches):
        return run_connect_rank(job, batches, chunk)

    tag = f"tfnet-train-{uuid.uuid4().hex[:8]}"
    out: list = []
    error: list = []

    def run():
        spark.addTag(tag)
        try:
            out.extend((r["piece"], r["chunk"]) for r in
                       stage.source.mapInArrow(fn, RESULT_SCHEMA, barrier=True).collect())
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            error.append(exc)
        finally:
            spark.removeTag(tag)

    thread = threading.Thread(target=run, name="tfnet-connect-stage", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(1.0)
    except BaseException:  # Ctrl-C on the client: the stage goes too
        spark.interruptTag(tag)
        raise
    if error:
        raise error[0]
    if not out:
        raise DistributedTrainingError("Rank 0 returned no result.")
    return out


def _print_history(result: DistributedResult, verbose: int) -> None:
    """Without ``model_dir`` no progress reaches the client while the stage runs; the per-epoch
    lines come from the history at the end."""
    history = result.history
    epochs = max((len(v) for v in history.values()), default=0)
    per_epoch, start = result.run.get("steps_per_epoch"), result.run.get("start_step") or 0
    bar = ProgressBar(2)
    bar.begin(epochs, per_epoch, start, 0)
    for e in range(epochs):
        step = min(result.step, start + (e + 1) * per_epoch) if per_epoch else result.step
        bar.epoch_end(e, step, {k: v[e] for k, v in history.items() if e < len(v)})
