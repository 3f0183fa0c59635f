"""Distributed training on Spark: one barrier stage, one Horovod rank per task. Driver side (or a Spark
Connect client).

The one distributed path, for a classic session and a Spark Connect client alike: ``optimize_distributed``
settles the ranks and the batch split, checks the workers, prepares the stage once (the data, one
partition per rank; the net and hooks; the validation data), runs the attempts loop (each attempt under
the run's id, so a retry resumes from the run's own newest checkpoint; the retry decision is
:meth:`~optim.spark.driver.retry.RetryPolicy.decide`'s), cancels the stage on Ctrl-C or a stuck rank
(:mod:`~optim.spark.driver.jobs`), takes away what it made on every way out, and returns a
:class:`~optim.spark.driver.stage.DistributedResult` with the run's summary. What differs between the
two kinds of session is behind :class:`~optim.spark.driver.backends.base.Backend`. The ranks run
:func:`optim.spark.worker.task.run_arrow_task` (or, for an RDD, :func:`optim.spark.worker.rank.run_rank`).
"""

from __future__ import annotations

import copy
import logging
import math
import secrets
import time
import warnings

from optim.errors import DistributedTrainingError, NonFiniteLossError, SparkSetupError  # noqa: F401 (re-exported)
from optim.spark.connect import is_connect, plan_limit, session_of
from optim.spark.driver.backends.base import Backend
from optim.spark.driver.backends.classic import ClassicBackend, check_driver_memory  # noqa: F401 (re-exported)
from optim.spark.driver.backends.connect import ConnectBackend
from optim.spark.driver.elastic import ElasticPolicy, membership
from optim.spark.driver.jobs import run_job
from optim.spark.driver.retry import RetryPolicy, one_line
from optim.spark.driver.slots import task_slots
from optim.spark.driver.stage import (
    VALIDATION_ARRAYS_LIMIT,
    Cleanup,
    DistributedResult,
    Stage,
    carried_bytes,
    check_workers,
    per_rank_batch,
    rank_job,
    result_from_payload,
    shippable_validation,
    shipped_hooks,
    validation_for_ranks,
    worker_config,
)
from optim.spark.driver.warm_up import warm_up_workers
from optim.spark.session import get_spark, small_arrow_batches
from optim.spark.worker.rank import run_rank
from optim.spark.worker.task import RESULT_SCHEMA, run_arrow_task
from optim.training.checkpoint import new_run_id
from optim.training.config import TrainConfig
from optim.training.datasets import ArrayDataset, TFDataDataset, TFDataset
from optim.training.reporting import MultiReporter, ProgressBar
from optim.transport.chunks import join_chunks
from optim.transport.store import STUCK_GRACE_S, stuck_rank  # noqa: F401 (re-exported)
from tfnet import storage
from tfnet.serialize import net_to_bytes

__all__ = [
    "DistributedResult",
    "DistributedTrainingError",
    "backend_for",
    "one_line",
    "optimize_distributed",
    "scale_learning_rate",
    "task_slots",
    "warm_up_workers",
]

log = logging.getLogger("tfnet.spark.driver")


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


def backend_for(spark) -> Backend:
    """The backend of ``spark``'s kind: Spark Connect's for a Connect session, else the classic one."""
    return ConnectBackend(spark) if is_connect(spark) else ClassicBackend(spark)


def optimize_distributed(opt, dataset: TFDataset, config: TrainConfig, validation: TFDataset | None, *,
                         num_workers: int | None = None, min_workers: int | None = None, verbose: int = 1,
                         max_retries: int = 2, timeout: float = 300.0, startup_timeout: float = 600.0,
                         slot_wait: float = 30.0, elastic_wait: float = 60.0,
                         steps_per_epoch: int | None = None) -> DistributedResult:
    """Trains ``opt.net`` on ``num_workers`` Horovod ranks in one Spark barrier stage, in the session
    the data belongs to (or the active one), classic or Spark Connect.

    Args:
        num_workers: Ranks. Default: Spark's default parallelism (under Spark Connect, the ``N`` of a
            ``local[N]`` master; other masters need it).
        min_workers: Elastic training (:mod:`~optim.spark.driver.elastic`): when executors are lost
            and ``num_workers`` slots are not back within ``elastic_wait``, the run goes on from its
            newest checkpoint with fewer ranks, at least this many (the global batch re-split, the
            learning rate unchanged), and grows back at an epoch boundary when the slots return.
            Needs ``model_dir``. Default: ``num_workers`` (a lost slot that does not come back fails
            the run, with the slots seen).
        max_retries: Times to rerun the stage after a failure a rerun can mend (a dead task, a lost
            executor, a timeout), resuming from this run's newest checkpoint in ``model_dir``.
            Default 2.
        timeout: Seconds a rank may go without progress (a training step, a validation batch)
            before it gives up and the stage is cancelled. Default 300.
        startup_timeout: Seconds allowed from launch to the first step, and the bound of the long
            phases (the first step's compile, a checkpoint write, waiting for the other ranks'
            validation). Default 600.
        slot_wait: Seconds to wait for enough task slots (executors still registering). Default 30.
        elastic_wait: Seconds a retry waits for lost slots to come back before it goes on with fewer
            ranks, or fails when fewer than ``min_workers`` are there. Default 60.
        steps_per_epoch: Steps per epoch for tf.data input of unknown length. Default: agreed from
            the data.
    """
    backend = backend_for(session_of(dataset) or get_spark())
    run = _DistributedRun(opt, backend, RetryPolicy(max_retries), verbose=verbose, timeout=timeout,
                          startup_timeout=startup_timeout, slot_wait=slot_wait, steps_per_epoch=steps_per_epoch)
    with backend.quiet(verbose), small_arrow_batches(backend.spark, getattr(dataset, "arrow_batch_rows", None)):
        return run(dataset, config, validation, num_workers, min_workers, elastic_wait)


class _DistributedRun:
    """One distributed ``optimize()`` call: its settings, and the steps of the call."""

    def __init__(self, opt, backend: Backend, policy: RetryPolicy, *, verbose: int, timeout: float,
                 startup_timeout: float, slot_wait: float, steps_per_epoch: int | None):
        self.opt, self.backend, self.policy = opt, backend, policy
        self.verbose, self.timeout, self.startup_timeout = verbose, timeout, startup_timeout
        self.slot_wait, self.steps_per_epoch = slot_wait, steps_per_epoch
        self.failures: list[str] = []
        self.attempts: list[dict] = []
        self.members: list[tuple[int, int]] = []  # (start step, ranks) per attempt that reached its first step
        self.control: str | None = None  # elastic: the file that asks the ranks to stop at an epoch boundary
        self.ranks = 0  # the ranks of the last attempt that finished
        self.roads: dict = {}  # how the net went out and rank 0's result came back (last_run's net_via, result_via)
        self.grow_check_s = GROW_CHECK_S

    def __call__(self, dataset: TFDataset, config: TrainConfig, validation: TFDataset | None,
                 num_workers: int | None, min_workers: int | None, elastic_wait: float) -> DistributedResult:
        t_call = time.monotonic()
        config = copy.copy(config)
        config.run_id = config.run_id or new_run_id()
        n = self.backend.ranks(num_workers)
        self.elastic = ElasticPolicy(n, n if min_workers is None else min_workers, elastic_wait)
        if self.elastic.elastic and not config.model_dir:
            raise ValueError("Elastic training (min_workers < num_workers) goes on from the run's checkpoints: give "
                             "TFOptimizer a model_dir.")
        n = self.first_ranks(dataset, config, n)
        self.data = (dataset, validation, config)
        per_rank = per_rank_batch(dataset, config, n)
        check_workers(self.backend.spark, n, self.startup_timeout, config)
        secret = secrets.token_bytes(32)  # this call's secret: it stays here; the ranks get derived keys
        cleanup = Cleanup()
        try:
            stage = self.prepare(dataset, validation, config, n, per_rank, cleanup)
            reporter = MultiReporter([ProgressBar(self.verbose) if self.verbose else None])
            sink = self.backend.progress(reporter, config, secret, cleanup)
            if self.elastic.elastic:
                self.control = storage.join(config.model_dir, "control", config.run_id, "grow")
                cleanup.add(_remove_quietly, self.control, config.storage_options)
            result = self.run_attempts(stage, sink, secret, cleanup)
        finally:
            cleanup.run()
        if self.verbose and not sink.events:  # no progress reached here while the stage ran
            _print_history(result)
        result.run = {**_run_summary(sink, n, self.failures, t_call), **result.run, "attempt_log": self.attempts,
                      "run_id": config.run_id, "mode": self.backend.mode,
                      "membership": membership(self.members), "num_workers": self.ranks, **self.roads}
        return result

    def first_ranks(self, dataset: TFDataset, config: TrainConfig, n: int) -> int:
        """The first attempt's ranks: ``n`` when its slots are there within ``slot_wait``; an elastic run
        starts with fewer (at least ``min_workers``) and grows when the rest come."""
        if not (self.backend.counts_slots or self.elastic.elastic):
            return n
        slots = self.backend.wait_for_slots(n, self.slot_wait)
        if slots >= n:
            return n
        if not self.elastic.elastic:
            raise DistributedTrainingError(
                f"num_workers={n}, but the cluster has {slots} task slot(s): a barrier stage must run all its "
                f"tasks at once. Use num_workers <= {slots}, add executors or cores, or let the run start smaller "
                "with min_workers.")
        return self.elastic.ranks_for(slots, None if isinstance(dataset, TFDataDataset) else config.batch_size)

    def prepare(self, dataset: TFDataset, validation: TFDataset | None, config: TrainConfig, n: int, per_rank: int,
                cleanup: Cleanup) -> Stage:
        """The data, one partition per rank; the validation data; the net and hooks, shipped once.
        Everything it makes is registered with ``cleanup``."""
        from optim.spark.datasets import DataFrameDataset, ParquetDataset, with_validation

        if isinstance(dataset, DataFrameDataset) and isinstance(validation, DataFrameDataset):
            # both DataFrames: one stage reads both; each rank validates on its own rows
            source, reader = with_validation(dataset, validation, n)
            kind, data, val = "arrow", None, None
        else:
            if isinstance(dataset, ParquetDataset):  # each rank reads its share of the files: no Spark job for data
                kind, reader, data, source = "files", None, dataset, self.backend.spark.range(n, numPartitions=n)
            else:
                kind, reader, data, source = self.backend.source(dataset, n, per_rank, self.startup_timeout)
            if kind == "arrays" and len(data) < n:
                raise ValueError(f"The training data has {len(data)} rows, fewer than the {n} workers.")
            limit = plan_limit(self.backend.spark) if self.backend.mode == "connect" else VALIDATION_ARRAYS_LIMIT
            val = shippable_validation(validation_for_ranks(validation), limit)
        opt = self.opt
        carried = carried_bytes(data, val, (opt.state or []) + list(opt.exchange_state))
        net, exchange = self.backend.ship_net(opt, config, net_to_bytes(opt.net), carried, cleanup)
        if kind == "arrays":
            data = self.backend.ship(data, cleanup)
        if isinstance(val, ArrayDataset):
            val = self.backend.ship(val, cleanup)
        return Stage(n, kind, reader, data, source, val, net, shipped_hooks(opt.net), worker_config(config, per_rank),
                     exchange=exchange, **self.backend.stage_defaults())

    def run_attempts(self, stage: Stage, sink, secret: bytes, cleanup: Cleanup) -> DistributedResult:
        """Runs the stage until it succeeds, or fails in a way a retry cannot help, or the retries
        run out. Every attempt runs under the same run id, so a retry resumes from this run's own
        newest checkpoint (with ``model_dir``) and never from another run's. After a failure, and when
        an elastic run grows back, the next attempt may have another number of ranks (:meth:`resize`)."""
        attempt = failed = 0
        while True:
            seen = len(sink.events)
            with self.backend.attempt(secret, stage.n, attempt, sink, stage.config, self.startup_timeout) as channels:
                job = rank_job(self.opt, stage, attempt, timeout=self.timeout, startup_timeout=self.startup_timeout,
                               steps_per_epoch=self.steps_per_epoch, verbose=self.verbose,
                               control=self.control if stage.n < self.elastic.num_workers else None, **channels.job)
                try:
                    result = result_from_payload(self.run_stage(stage, job, self.watch(stage, channels.watch)))
                except Exception as exc:  # noqa: BLE001 - decided on below: a retry, or the ranks' own error
                    self.attempts.append({"attempt": attempt, "ok": False, "ranks": stage.n, "error": str(exc)[:300]})
                    self.record(sink, seen, stage.n)
                    self.after_failure(exc, channels.reports(exc), failed, bool(stage.config.model_dir))
                    failed += 1
                    stage = self.resize(stage, cleanup, lost=True)
                    attempt += 1
                    continue
            self.attempts.append({"attempt": attempt, "ok": True, "ranks": stage.n, **result.run})
            self.record(sink, seen, stage.n)
            self.ranks = stage.n
            if not result.run.get("stopped"):
                return result
            stage = self.resize(stage, cleanup, lost=False)  # slots came back: grow, from the epoch's checkpoint
            attempt += 1

    def watch(self, stage: Stage, stuck):
        """What the driver checks while the stage runs: a stuck rank (``stuck``), and, for an elastic run
        on fewer ranks than it asked for, whether the slots are back (then it asks the ranks, through the
        control file, to stop at the next epoch boundary)."""
        wanted = self.elastic.num_workers - stage.n
        if wanted <= 0:
            return stuck
        config = stage.config
        last = [0.0]

        def check() -> str | None:
            why = stuck() if stuck is not None else None
            if why or time.monotonic() - last[0] < self.grow_check_s:
                return why
            last[0] = time.monotonic()
            if self.backend.free_slots(wanted, stage.n) >= wanted and not storage.exists(self.control,
                                                                                           config.storage_options):
                _tell(f"{wanted} task slot(s) are back: the run grows to {self.elastic.num_workers} ranks at the next "
                      "epoch boundary.", depth=4)
                storage.write_bytes_atomic(self.control, b"grow", config.storage_options)
            return None

        return check

    def resize(self, stage: Stage, cleanup: Cleanup, lost: bool) -> Stage:
        """The stage for the next attempt: after a failure (``lost``), with as many ranks as there are
        slots within ``elastic_wait`` (at least ``min_workers``; else a typed error naming the slots);
        after a stop to grow, with as many as are there now. Re-prepared when the count changes."""
        dataset, validation, config = self.data
        target = self.elastic.num_workers
        if lost:
            slots = self.backend.wait_for_slots(target, self.elastic.wait_s)
        else:
            _remove_quietly(self.control, config.storage_options)
            slots = self.backend.free_slots(target, 0)  # the stage has ended: every slot is free
        batch = None if isinstance(dataset, TFDataDataset) else config.batch_size
        n = self.elastic.ranks_for(slots, batch)
        if n == stage.n:
            return stage
        _tell(f"The run goes on with {n} rank(s) (it asked for {target}, had {stage.n}; {slots} task slot(s) there).",
              depth=2)
        return self.prepare(dataset, validation, config, n, per_rank_batch(dataset, config, n), cleanup)

    def record(self, sink, seen: int, ranks: int) -> None:
        """The attempt's start step (rank 0's ``begin`` event after index ``seen``) and its ranks."""
        begins = [e for e in sink.events[seen:] if e.get("event") == "begin"]
        if begins:
            self.members.append((int(begins[0]["initial_step"]), ranks))

    def after_failure(self, exc: Exception, reports: list, attempt: int, has_model_dir: bool) -> None:
        """Carries out the retry policy's decision: raises its error, or records the failure and warns."""
        decision = self.policy.decide(exc, reports, attempt, stopped=self.backend.stopped(), failures=self.failures)
        if decision.failure is not None:
            self.failures.append(decision.failure)
        if not decision.retry:
            raise decision.error from exc
        _tell(f"Training stage attempt {attempt + 1} failed ({one_line(str(decision.error))}); retrying "
              f"{_RETRY_FROM[has_model_dir]}.", depth=2)

    def run_stage(self, stage: Stage, job, watch) -> bytes:
        """Runs the barrier stage (cancelled on Ctrl-C and when ``watch`` names a stuck rank) and returns
        rank 0's payload."""
        if stage.kind == "records":
            action = stage.source.barrier().mapPartitions(lambda it: run_rank(job, it)).collect
        else:
            chunk = stage.chunk

            def fn(batches):
                return run_arrow_task(job, batches, chunk)

            def action():
                rows = stage.source.mapInArrow(fn, RESULT_SCHEMA, barrier=True).collect()
                return [r["path"] or (r["piece"], r["chunk"]) for r in rows]

        rows = run_job(self.backend.spark, f"training on {job.size} ranks (attempt {job.attempt + 1})", action,
                       kind="train", watch=watch)
        net = stage.net
        self.roads = {"net_via": "file" if isinstance(net, str) else "plan" if isinstance(net, bytes) else "broadcast",
                      "result_via": "file" if any(isinstance(r, str) for r in rows) else "rows",
                      "result_pieces": len(rows)}
        return _read_result(rows, stage.config.storage_options)


_RETRY_FROM = {True: "from this run's newest checkpoint", False: "from the start (no model_dir)"}
#: Seconds between the checks for returned slots while an elastic run has fewer ranks than it asked for.
GROW_CHECK_S = 5.0


def _tell(message: str, depth: int) -> None:
    """Logs ``message`` and warns with it (a RuntimeWarning) pointing at the caller of
    ``TFOptimizer.optimize``. ``depth``: the frames from the caller of ``_tell`` up to, not counting,
    ``_DistributedRun.__call__`` (after which ``optimize_distributed``, ``TFOptimizer._train_distributed``
    and ``optimize`` stand between it and the user's code)."""
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=depth + 6)


def _remove_quietly(path: str | None, options=None) -> None:
    if path and storage.exists(path, options):
        storage.remove(path, options)


def _read_result(rows: list, options=None) -> bytes:
    """Rank 0's payload from the stage's rows: a file in the exchange folder (read, then removed), the
    payload itself (an RDD stage), or its pieces."""
    paths = [r for r in rows if isinstance(r, str)]
    if paths:
        data = storage.read_bytes(paths[0], options)
        storage.remove(paths[0], options)
        return data
    if rows and isinstance(rows[0], (bytes, bytearray)):
        if len(rows) != 1:
            raise DistributedTrainingError(f"Expected one result from rank 0; got {len(rows)}.")
        return bytes(rows[0])
    if not rows:
        raise DistributedTrainingError("Rank 0 returned no result.")
    return join_chunks(rows)


def _run_summary(sink, n: int, failures: list[str], t_call: float) -> dict:
    """What the run measured: attempts, start-up and wall time, step and allreduce times."""
    steps = [e for e in sink.events if e.get("event") == "step"]
    return {
        "num_workers": n, "attempts": len(failures) + 1, "failures": failures,
        "startup_s": (sink.first_step_at - t_call) if sink.first_step_at else None,
        "wall_s": time.monotonic() - t_call,
        "step_times": [e["logs"].get("step_time") for e in steps],
        "allreduce_seconds": [e["logs"].get("allreduce_seconds") for e in steps],
        "refused_progress_clients": sink.refused,
    }


def _print_history(result: DistributedResult) -> None:
    """When no progress reached this process while the stage ran (a Connect client without
    ``model_dir``), the per-epoch lines come from the history at the end."""
    history = result.history
    epochs = max((len(v) for v in history.values()), default=0)
    per_epoch, start = result.run.get("steps_per_epoch"), result.run.get("start_step") or 0
    bar = ProgressBar(2)
    bar.begin(epochs, per_epoch, start, 0)
    for e in range(epochs):
        step = min(result.step, start + (e + 1) * per_epoch) if per_epoch else result.step
        bar.epoch_end(e, step, {k: v[e] for k, v in history.items() if e < len(v)})
