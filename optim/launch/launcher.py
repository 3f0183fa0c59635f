"""Distributed training on Spark: one barrier stage, one Horovod rank per task. Driver side (or a Spark
Connect client).

The one distributed path, for a classic session and a Spark Connect client alike, and for every kind of
data: ``optimize_distributed`` settles the ranks and the batch split, checks the workers, stages the data
for the ranks (the data adapter's :meth:`~optim.data.base.DataAdapter.stage`; the net and hooks shipped
once), and moves the run through its states (:mod:`optim.launch.states`): starting, running an
attempt, and then finished, failed, retrying, shrinking or growing, each transition decided by a pure
policy (:class:`~optim.launch.retry.RetryPolicy`, :class:`~optim.launch.elastic.ElasticPolicy`)
and carried out here. Every attempt runs under the run's id, so a retry resumes from the run's own newest
checkpoint. The stage is cancelled on Ctrl-C or a stuck rank (:mod:`~optim.spark.jobs`), what the call made
is taken away on every way out, and the run ends in an :class:`optim.protocol.RunResult` with its summary.
What differs between the two kinds of session is behind :class:`~optim.launch.backends.base.Backend`.
The ranks run :data:`optim.protocol.TRAIN_ENTRY`, named, never imported here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import time
import warnings

from optim.config import TrainConfig
from optim.errors import CheckpointWarning, DistributedTrainingError
from optim.launch.backends.base import Backend
from optim.launch.backends.classic import ClassicBackend
from optim.launch.backends.connect import ConnectBackend
from optim.launch.elastic import ElasticPolicy, membership
from optim.launch.intervals import Intervals
from optim.launch.notice import DecommissionNotice
from optim.launch.results import print_history, step_times
from optim.launch.retry import RetryPolicy, one_line
from optim.launch.stage import (
    Cleanup,
    Stage,
    carried_bytes,
    check_workers,
    per_rank_batch,
    rank_job,
    shipped_hooks,
    worker_config,
)
from optim.launch.staging import order_rows, staged_for
from optim.launch.states import (
    Failed,
    Finished,
    Growing,
    Retrying,
    Running,
    RunState,
    Shrinking,
    Starting,
)
from optim.logs import user_stacklevel
from optim.protocol import (
    RESULT_SCHEMA,
    TRAIN_ENTRY,
    AttemptReport,
    ClusterRun,
    RunResult,
    RunSummary,
    TrainSpec,
    entry,
    unpack_result,
)
from optim.spark.connect import is_connect
from optim.spark.jobs import run_job
from optim.spark.session import get_spark, small_arrow_batches
from optim.training.checkpoint import new_run_id
from optim.training.reporting import MultiReporter, ProgressBar
from optim.transport.chunks import result_carrier
from optim.transport.failures import failures_in
from tfnet import storage
from tfnet.serialize import net_to_bytes

__all__ = [
    "DistributedTrainingError",
    "backend_for",
    "one_line",
    "optimize_distributed",
    "scale_learning_rate",
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


def optimize_distributed(spec: TrainSpec, dataset, validation, *,
                         num_workers: int | None = None, min_workers: int | None = None, verbose: int = 1,
                         max_retries: int = 2, timeout: float = 300.0, startup_timeout: float = 600.0,
                         slot_wait: float = 30.0, elastic_wait: float = 60.0,
                         steps_per_epoch: int | None = None, reporters=()) -> RunResult:
    """Trains ``spec.net`` as ``spec`` says (:meth:`TFOptimizer.train_spec <optim.TFOptimizer.train_spec>`) on
    ``num_workers`` Horovod ranks in one Spark barrier stage, in the session the data belongs to (or the active
    one), classic or Spark Connect.

    Args:
        num_workers: Ranks. Default: Spark's default parallelism (under Spark Connect, the ``N`` of a
            ``local[N]`` master; other masters need it).
        min_workers: Elastic training (:mod:`~optim.launch.elastic`): when executors are lost
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
        reporters: More reporters of the progress that reaches this process (tfnet's own callbacks).
            Default: none.
    """
    backend = backend_for(dataset.session() or get_spark())
    run = _DistributedRun(spec, backend, RetryPolicy(max_retries), verbose=verbose, timeout=timeout,
                          startup_timeout=startup_timeout, slot_wait=slot_wait, steps_per_epoch=steps_per_epoch,
                          reporters=reporters)
    with backend.quiet(verbose), small_arrow_batches(backend.spark, dataset.arrow_batch_rows):
        return run(dataset, validation, num_workers, min_workers, elastic_wait)


class _DistributedRun:
    """One distributed ``optimize()`` call: its settings, its states, and what it does in each."""

    def __init__(self, spec: TrainSpec, backend: Backend, policy: RetryPolicy, *, verbose: int, timeout: float,
                 startup_timeout: float, slot_wait: float, steps_per_epoch: int | None, reporters=()):
        self.spec, self.backend, self.policy = spec, backend, policy  # spec: the driver's (the net itself)
        self.reporters = list(reporters)  # more reporters of the progress that reaches this process (tfnet's callbacks)
        self.verbose, self.timeout, self.startup_timeout = verbose, timeout, startup_timeout
        self.slot_wait, self.steps_per_epoch = slot_wait, steps_per_epoch
        self.failures: list[str] = []
        self.attempts: list[dict] = []
        self.members: list[tuple[int, int]] = []  # (start step, ranks) per attempt that reached its first step
        self.states: list[str] = []  # the states the run went through, in order
        self.control: str | None = None  # elastic: the file that asks the ranks to stop at an epoch boundary
        self.notice: DecommissionNotice | None = None  # a classic session that sees decommission notices
        self.ranks = 0  # the ranks of the last attempt that finished
        self.roads: dict = {}  # how the net went out and rank 0's result came back (last_run's net_via, result_via)
        self.report = AttemptReport()  # what rank 0 reported of the last attempt that finished
        self.intervals = Intervals()
        self.t_call = time.monotonic()

    def __call__(self, dataset, validation, num_workers: int | None, min_workers: int | None,
                 elastic_wait: float) -> RunResult:
        self.t_call = time.monotonic()
        self.intervals = Intervals.of(self.backend.spark)
        started_at = time.time()  # attempt_log's started_s, ended_s and first_step_s count from here
        config = dataclasses.replace(self.spec.config, run_id=self.spec.config.run_id or new_run_id())
        self.spec = dataclasses.replace(self.spec, config=config)
        n = self.backend.ranks(num_workers)
        self.elastic = ElasticPolicy(n, n if min_workers is None else min_workers, elastic_wait)
        order_rows(self.backend, config, self.elastic.elastic)  # a run that may shrink inside an epoch
        if self.elastic.elastic and not config.model_dir:
            raise ValueError("Elastic training (min_workers < num_workers) goes on from the run's checkpoints: give "
                             "TFOptimizer a model_dir.")
        n = self.first_ranks(dataset, config, n)
        self.data = (dataset, validation, config)
        per_rank_batch(dataset, config, n)  # checked before anything starts
        check_workers(self.backend.spark, n, self.startup_timeout, config)
        self.secret = secrets.token_bytes(32)  # this call's secret: it stays here; the ranks get derived keys
        self.cleanup = Cleanup()
        try:
            reporter = MultiReporter([ProgressBar(self.verbose) if self.verbose else None, *self.reporters])
            self.sink = self.backend.progress(reporter, config, self.secret, self.cleanup)
            if self.elastic.elastic:
                self.control = storage.join(config.model_dir, "control", config.run_id, "grow")
                self.cleanup.add(_remove_quietly, self.control, config.storage_options)
            if config.model_dir and self.backend.sees_decommission:  # a notice becomes a checkpoint and a shrink
                self.notice = DecommissionNotice(self.backend, storage.join(config.model_dir, "control",
                                                                            config.run_id, "notice"),
                                                 config.storage_options, tell=_tell)
                self.cleanup.add(self.notice.withdraw)
            state: RunState = Starting(n)
            while not state.type.terminal:
                self.states.append(state.type.label)
                state = self.next(state)
            self.states.append(state.type.label)
        finally:
            self.cleanup.run()
        if isinstance(state, Failed):
            # the error says what failed and where (a rank's own error, rebuilt, with its traceback in
            # worker_traceback); the Spark exception it came through (a Py4J error with the JVM's stack) stays off the
            # console: kept as the error's spark_error and logged at DEBUG
            if state.cause is not None and state.cause is not state.error:
                log.debug("The training stage failed through:", exc_info=state.cause)
                try:
                    # the Spark exception itself, not a typed view of it (typed_spark_error keeps the original)
                    state.error.spark_error = getattr(state.cause, "spark_error", state.cause)
                except AttributeError:  # an error type without a __dict__
                    pass
            raise state.error from None
        result = state.result
        if self.verbose and not self.sink.events:  # no progress reached here while the stage ran
            print_history(result)
        result.run = self.summary(result, config.run_id, started_at).to_dict()
        return result

    def summary(self, result: RunResult, run_id: str, started_at: float) -> RunSummary:
        """The run's summary (``last_run``), from the last attempt's ``result`` and what this call saw."""
        cluster = ClusterRun(wall_s=time.monotonic() - self.t_call, refused_progress_clients=self.sink.refused,
                             last_attempt=self.report, attempt_log=self.attempts, started_at=started_at,
                             mode=self.backend.mode, barrier=not self.backend.gang, states=self.states,
                             membership=membership(self.members), roads=self.roads)
        return RunSummary(num_workers=self.ranks, failures=self.failures, run_id=run_id,
                          **step_times(self.sink, self.t_call), start_step=result.start_step,
                          resumed_from=result.resumed_from, cluster=cluster)

    # ---- the states

    def next(self, state: RunState) -> RunState:
        """The state after ``state``: what the run does there, and where the policies send it."""
        if isinstance(state, Starting):
            return Running(self.prepare(state.ranks), 0)
        if isinstance(state, Running):
            return self.run_attempt(state)
        try:
            if isinstance(state, Retrying):
                return self.after_retry_wait(state)
            if isinstance(state, Shrinking):
                _tell(f"The run goes on with {state.ranks} rank(s) (it asked for {self.elastic.num_workers}, had "
                      f"{state.stage.n}).")
                return Running(self.prepare(state.ranks), state.attempt, state.failed)
            if isinstance(state, Growing):
                return self.grow(state)
        except DistributedTrainingError as err:  # the elastic policy's: too few slots, or no count that fits
            return Failed(err)
        raise TypeError(f"No transition from {state!r}")  # pragma: no cover - every state is handled above

    def run_attempt(self, state: Running) -> RunState:
        """Runs attempt ``state.attempt``; then finished, growing (the ranks stopped at an epoch boundary for the
        slots that came back), retrying (the retry policy says a rerun can mend the failure) or failed."""
        stage, attempt = state.stage, state.attempt
        if self.notice is not None:  # a notice an attempt did not act on (it failed first) is not the next one's
            self.notice.withdraw()
        seen = len(self.sink.events)
        started = self.clock()
        try:
            result = self.run_stage(stage, attempt)
        except Exception as exc:  # noqa: BLE001 - decided on below: a retry, or the ranks' own error
            self.attempts.append({"attempt": attempt, "ok": False, "ranks": stage.n, "error": str(exc)[:300],
                                  "started_s": started, "ended_s": self.clock()})
            self.record(seen, stage.n)
            decision = self.policy.decide(exc, failures_in(str(exc)), state.failed, stopped=self.backend.stopped(),
                                          failures=self.failures)
            if decision.failure is not None:
                self.failures.append(decision.failure)
            if not decision.retry:
                return Failed(decision.error, exc)
            _tell(f"Training stage attempt {state.failed + 1} failed ({one_line(str(decision.error))}); retrying "
                  f"{_RETRY_FROM[bool(stage.config.model_dir)]}.")
            return Retrying(stage, attempt, state.failed + 1, decision.error)
        self.report = AttemptReport.of(result, stage.staged.rank_data.counts_rows)
        self.attempts.append({"attempt": attempt, "ok": True, "ranks": stage.n, "started_s": started,
                              "ended_s": self.clock(), **self.report.to_dict()})
        for why in result.skipped_checkpoints:  # rank 0 passed over a newer checkpoint: say so here, once
            message = (f"Attempt {attempt + 1} resumed from {result.resumed_from or 'the start'}, passing over a newer "
                       f"checkpoint: {why}")
            log.warning(message)
            warnings.warn(message, CheckpointWarning, stacklevel=user_stacklevel())
        self.record(seen, stage.n)
        self.ranks = stage.n
        if result.stopped and self.notice is not None and self.notice.leaving:
            return self.after_notice(state)
        return Growing(stage, attempt, state.failed) if result.stopped else Finished(result)

    def after_notice(self, state: Running) -> RunState:
        """After the ranks checkpointed and stopped for a decommission notice: a planned shrink, not a failure. As
        many ranks as there are slots without the executors that are going (waiting ``elastic_wait`` for others to
        come), from the checkpoint just written."""
        leaving = self.notice.leaving
        self.notice.withdraw()
        try:
            return self.after_retry_wait(state, leaving)
        except DistributedTrainingError as err:  # too few slots left: the checkpoint is there to resume from
            return Failed(err)

    def after_retry_wait(self, state: Retrying | Running, leaving: int = 0) -> RunState:
        """After a failure (or a decommission notice for ``leaving`` ranks): as many ranks as there are slots
        within ``elastic_wait`` (at least ``min_workers``; else a typed error naming the slots): the same stage, or
        a smaller one."""
        slots = self.backend.wait_for_slots(self.elastic.num_workers, self.elastic.wait_s)
        if leaving and self.backend.gang and self.elastic.elastic:
            # dynamic allocation counts what it may ask for, not what the cluster gives: go on without the leaving
            # ranks now, and grow back as executors come
            slots = min(slots, state.stage.n - leaving)
        n = self.elastic.ranks_for(slots, self.batch_for_policy())
        if n < state.stage.n:
            return Shrinking(state.stage, state.attempt + 1, state.failed, n)
        stage = state.stage if n == state.stage.n else self.prepare(n)
        return Running(stage, state.attempt + 1, state.failed)

    def grow(self, state: Growing) -> RunState:
        """After the ranks stopped to grow: as many ranks as there are slots now (the stage has ended, so every
        slot is free), from the epoch's checkpoint."""
        _remove_quietly(self.control, state.stage.config.storage_options)
        slots = self.backend.free_slots(self.elastic.num_workers, 0)
        n = self.elastic.ranks_for(slots, self.batch_for_policy())
        if n == state.stage.n:
            return Running(state.stage, state.attempt + 1, state.failed)
        _tell(f"The run goes on with {n} rank(s) (it asked for {self.elastic.num_workers}, had {state.stage.n}; "
              f"{slots} task slot(s) there).")
        return Running(self.prepare(n), state.attempt + 1, state.failed)

    # ---- what the states do

    def clock(self) -> float:
        """Seconds since the call began (``attempt_log``'s ``started_s`` and ``ended_s``)."""
        return round(time.monotonic() - self.t_call, 3)

    def batch_for_policy(self) -> int | None:
        """The global batch the rank counts must divide (None: a ``tf.data`` input batches itself)."""
        dataset, _, config = self.data
        return config.batch_size if dataset.splits_batch else None

    def first_ranks(self, dataset, config: TrainConfig, n: int) -> int:
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
        return self.elastic.ranks_for(slots, config.batch_size if dataset.splits_batch else None)

    def prepare(self, n: int) -> Stage:
        """The stage for ``n`` ranks: the data staged by its adapter (with the validation data), the net and
        hooks shipped once. Everything it makes is registered with the call's clean-up."""
        dataset, validation, config = self.data
        per_rank = per_rank_batch(dataset, config, n)
        staged = staged_for(dataset, self.backend, n, per_rank, config, resuming=bool(self.attempts or config.resume),
                            cleanup=self.cleanup, validation=validation, timeout_s=self.startup_timeout)
        spec = self.spec
        carried = carried_bytes(dataset, validation, (spec.state or []) + list(spec.exchange_state or []))
        net, exchange = self.backend.ship_net(spec, net_to_bytes(spec.net), carried, self.cleanup)
        return Stage(n, staged, net, shipped_hooks(spec.net), worker_config(config, per_rank), exchange=exchange,
                     **self.backend.stage_defaults())

    def run_stage(self, stage: Stage, attempt: int) -> RunResult:
        """Runs attempt ``attempt`` of the barrier stage (cancelled on Ctrl-C and when the watch names a stuck
        rank) and returns rank 0's result."""
        with self.backend.attempt(self.secret, stage.n, attempt, self.sink, stage.config,
                                  self.startup_timeout) as channels:
            control = self.control if stage.n < self.elastic.num_workers else None
            job = rank_job(self.spec, stage, attempt,
                           dataclasses.replace(channels.channels, exchange=stage.exchange, control=control,
                                               notice=self.notice and self.notice.path),
                           timeout=self.timeout, startup_timeout=self.startup_timeout,
                           steps_per_epoch=self.steps_per_epoch, verbose=self.verbose, gang=self.backend.gang,
                           console=self.backend.shares_console, notice_every_s=self.intervals.notice_s)

            def task(rows, job=job):
                return entry(TRAIN_ENTRY)(job, rows)

            rows = run_job(self.backend.spark, f"training on {job.size} ranks (attempt {attempt + 1})",
                           lambda: stage.staged.collect(task, RESULT_SCHEMA, barrier=not job.gang), kind="train",
                           watch=self.watch(stage, channels.watch))
        result = result_carrier(rows)
        self.roads = {"net_via": stage.net.via, "result_via": result.via, "result_pieces": len(rows)}
        return unpack_result(result.take(stage.config.storage_options))

    def watch(self, stage: Stage, stuck):
        """What the driver checks while the stage runs: a stuck rank (``stuck``), task slots lost under the stage
        (:meth:`lost_slots`), and, for an elastic run on fewer ranks than it asked for, whether to grow (the
        elastic policy's ``should_grow``, once the attempt's first step has come; then it asks the ranks, through
        the control file, to stop at the next epoch boundary)."""
        lost = self.lost_slots(stage)
        if self.notice is not None:  # a decommissioning executor is one whose slots are going: not a lost one
            lost = self.notice.watch(stage.n, lost, self.sink, self.intervals.slot_s)
        if stage.n >= self.elastic.num_workers:
            return _first(stuck, lost)
        config = stage.config
        wanted = self.elastic.num_workers - stage.n
        last = [0.0]
        seen = len(self.sink.events)

        def check() -> str | None:
            why = _first(stuck, lost)()
            if why or time.monotonic() - last[0] < self.intervals.grow_s or not _stepping(self.sink.events, seen):
                return why
            last[0] = time.monotonic()
            slots = stage.n + self.backend.free_slots(wanted, stage.n)
            if self.elastic.should_grow(stage.n, slots) and not storage.exists(self.control, config.storage_options):
                _tell(f"{wanted} task slot(s) are back: the run grows to {self.elastic.num_workers} ranks at the next "
                      "epoch boundary.")
                storage.write_bytes_atomic(self.control, b"grow", config.storage_options)
            return None

        return check

    def lost_slots(self, stage: Stage):
        """A check, every ``intervals.slot_s``, that the cluster still has the task slots the stage's ranks need
        (where the session counts them cheaply: a classic one). When an executor is lost, Spark fails a barrier
        stage and resubmits it, and the resubmitted stage waits for slots the cluster no longer has (up to Spark's
        own check, minutes); a retry launched before Spark declared the executor lost waits likewise, with a rank
        that never starts. Both end as soon as the loss is known, and the retry goes on with the slots there are."""
        if not self.backend.counts_slots:
            return None
        last = [time.monotonic()]

        def check() -> str | None:
            if time.monotonic() - last[0] < self.intervals.slot_s:
                return None
            last[0] = time.monotonic()
            slots = self.backend.slots_now()
            if slots is not None and slots < stage.n:
                return (f"the cluster has {slots} task slot(s) now, fewer than the stage's {stage.n} ranks (an "
                        "executor was lost)")
            return None

        return check

    def record(self, seen: int, ranks: int) -> None:
        """The attempt's start step (rank 0's ``begin`` event after index ``seen``) and its ranks; and, in its
        ``attempt_log`` entry, when its first step reached here (``first_step_s``, on the clock of ``started_s``)."""
        events = self.sink.events[seen:]
        begins = [e for e in events if e.get("event") == "begin"]
        if begins:
            self.members.append((int(begins[0]["initial_step"]), ranks))
        steps = [i for i, e in enumerate(events, seen) if e.get("event") == "step"]
        arrived = getattr(self.sink, "arrived", [])
        if steps and steps[0] < len(arrived):
            self.attempts[-1]["first_step_s"] = round(arrived[steps[0]] - self.t_call, 3)


def _stepping(events: list[dict], seen: int) -> bool:
    """Whether this attempt's first step has reached here (a ``step`` event after index ``seen``): every rank has
    passed its first allreduce, so each holds its task slot. Before that, a slot the stage is about to take is
    free (between its shuffle and its ranks' start, say), and a Connect client's probe would count it as one that
    came back."""
    return any(e.get("event") == "step" for e in events[seen:])


_RETRY_FROM = {True: "from this run's newest checkpoint", False: "from the start (no model_dir)"}


def _first(*checks):
    """One check from several (None: none): the first reason any of them gives."""
    checks = [c for c in checks if c is not None]

    def check() -> str | None:
        for c in checks:
            why = c()
            if why:
                return why
        return None

    return check


def _tell(message: str) -> None:
    """Logs ``message`` and warns with it (a RuntimeWarning) pointing at the user's call of
    ``TFOptimizer.optimize`` (the first frame outside tfnet)."""
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=user_stacklevel())


def _remove_quietly(path: str | None, options=None) -> None:
    if path and storage.exists(path, options):
        storage.remove(path, options)
