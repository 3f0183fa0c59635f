"""The driver<->rank protocol: what a rank is asked to do and what it hands back, as plain data. Both sides.

The driver (or a Spark Connect client) builds a :class:`RankJob` for each attempt of the training stage,
split by concern: :class:`TrainSpec` (what to train and how, with its :class:`~optim.config.TrainConfig`), the
data's :class:`~optim.shares.RankData` (where the rank's data comes from and how it opens it),
:class:`Channels` (how the ranks meet and report) and :class:`Limits` (how long anything may take). The
stage runs the entry point named by :data:`TRAIN_ENTRY` on every rank; rank 0 packs its outcome with
:func:`pack_result`, and the driver reads it back with :func:`unpack_result`. A local run and a distributed
one end in the same :class:`RunResult`, whose :meth:`RunResult.last_run` is ``TFOptimizer.last_run``.

A rank's failure travels one way, as data: a :class:`~optim.transport.failures.WorkerFailure` inside the
task's error (:func:`optim.transport.failures.failure_text`), read back on the driver from the error Spark
raises. Neither side imports the other's package: they meet here, and the driver names the ranks' entry
points by name (:func:`entry`), as a plugin's entry point is named.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from optim.config import TrainConfig
from optim.shares import RankData

if TYPE_CHECKING:  # the types only: importing them would load TensorFlow and Spark here
    from optim.carriers import Carrier
    from optim.losses import Loss
    from optim.methods import Method
    from optim.metrics import Metric
    from optim.transforms import GradientTransformation
    from tfnet import TFNet

__all__ = ["EVALUATE_ENTRY", "RESULT_FORMAT", "RESULT_SCHEMA", "STATES_SCHEMA", "TRAIN_ENTRY", "AttemptReport", "Channels",
           "ClusterRun", "EvalJob", "Limits", "NetOutputs", "RankJob", "RunResult", "RunSummary", "TrainSpec", "entry", "pack_result",
           "unpack_result"]

#: The function every task of the training stage runs: ``(job: RankJob, rows) -> iterator of result records``.
TRAIN_ENTRY = "optim.rank.task:run_task"
#: The function every task of a distributed evaluation runs: ``(job: EvalJob, rows) -> iterator of records``.
EVALUATE_ENTRY = "optim.rank.evaluate:evaluate_task"
#: Rank 0's result, as the stage's rows: the path of the result file, or the payload in numbered pieces.
RESULT_SCHEMA = pa.schema([("piece", pa.int32()), ("chunk", pa.binary()), ("path", pa.string())])
#: A partition's loss and metric accumulators (JSON), as an evaluation's rows.
STATES_SCHEMA = pa.schema([("states", pa.string())])
#: The format tag of rank 0's payload (:mod:`tfnet.container`).
RESULT_FORMAT = "tfnet-rank-result-1"


def entry(name: str):
    """The function an entry point names (``"package.module:function"``), imported where it runs."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class NetOutputs:
    r"""What the ranks' label checks read of the net (:func:`optim.data.values.check_labels`): its output names and
    their specs (each a ``tf.TensorSpec``), without the net itself."""

    output_names: tuple = ()
    output_specs: tuple = ()

    @classmethod
    def of(cls, net) -> NetOutputs:
        """``net``'s output names and specs."""
        return cls(tuple(net.output_names), tuple(net.output_specs))


@dataclass
class TrainSpec:
    """What to train and how: the net (as shipped, its :class:`~optim.carriers.Carrier`) and its hooks,
    the loss, the method and the metrics, the ranks' config (``batch_size`` per rank), the state to go on from
    (the optimiser's, the server method's, the step) and what gives the logged learning rate. ``outputs``: the
    net's output names and specs, for the checks of labels on the ranks. The driver's spec holds the net itself;
    the ranks' (:meth:`for_ranks`), the net as shipped."""

    net: TFNet | Carrier
    hooks: bytes | None
    loss: Loss
    method: Method | GradientTransformation
    metrics: list[Metric]
    config: TrainConfig
    state: list[np.ndarray] | None = None
    start_step: int = 0
    exchange_state: list[np.ndarray] | None = None
    #: what has ``learning_rate_at(step)`` (a :class:`~optim.methods.Method`), or None: the method
    lr_source: Any = None
    outputs: NetOutputs = field(default_factory=NetOutputs)

    def for_ranks(self, net: Carrier, hooks: bytes | None, config: TrainConfig) -> TrainSpec:
        """This spec as the ranks get it: ``net`` shipped (its carrier: a file, a broadcast or the plan), its
        ``hooks``, and the ranks' ``config`` (the per-rank batch)."""
        return dataclasses.replace(self, net=net, hooks=hooks, config=config)


@dataclass
class Channels:
    """How the ranks of one attempt meet and report: the rendezvous store (the driver's; None: rank 0 hosts it,
    under Spark Connect) and its key, the progress channel (the driver's) and its key, or the progress file in
    ``model_dir`` (Spark Connect), the exchange folder the net and rank 0's result go through (None: the job and
    its result rows), the control file that asks the ranks to stop at an epoch boundary (elastic training), and the
    one that asks them to checkpoint and stop at the next step (a decommission notice; None: the driver cannot see
    such notices)."""

    rendezvous: tuple[str, int] | None = ("127.0.0.1", 0)
    rendezvous_key: bytes = b""
    progress: tuple[str, int] | None = None
    progress_key: bytes = b""
    progress_path: str | None = None
    exchange: str | None = None
    control: str | None = None
    notice: str | None = None
    store_file: str | None = None  # Spark Connect without barrier mode: where rank 0 leaves its store's address

    def failure_file(self, rank: int) -> str | None:
        """Where rank ``rank`` leaves its failure beside :attr:`store_file`, to outlive rank 0's store (None
        without one)."""
        return None if self.store_file is None else f"{self.store_file}.failure-r{rank}"


@dataclass
class Limits:
    """How long anything may take on a rank, and how it behaves: ``timeout_s`` without progress, the start-up
    bound (launch to first step, and the long phases), the steps per epoch given (None: agreed from the data),
    the ranks' log level, Horovod's threads (:mod:`optim.training.comm_threads`) and its own log level (None:
    Horovod's default; :func:`optim.launch.stage.horovod_log_level`), the size of rank 0's result pieces when they
    come back as rows, and how often rank 0 asks for a decommission notice."""

    timeout_s: float = 300.0
    startup_timeout_s: float = 600.0
    steps_per_epoch: int | None = None
    log_level: int = logging.WARNING
    horovod_threads: str = "idle"
    horovod_log_level: str | None = None
    chunk_bytes: int = 1 << 30
    #: About how often rank 0 asks for a decommission notice at step boundaries (:mod:`optim.training.notice`).
    notice_every_s: float = 1.0

    @property
    def long_s(self) -> float:
        """The bound of the long phases (compiles, checkpoint writes, waiting for the others' validation) and of
        Gloo's own waits: the start-up bound, or ``timeout_s`` when that is longer."""
        return max(float(self.startup_timeout_s), float(self.timeout_s))


@dataclass
class RankJob:
    """Everything a rank of one attempt needs (picklable): see the module."""

    train: TrainSpec
    data: RankData
    channels: Channels
    limits: Limits
    size: int
    attempt: int = 0
    gang: bool = False  # a plain stage (no barrier mode: dynamic allocation on), see optim.rank.gang


@dataclass
class EvalJob:
    """What every task of a distributed evaluation needs (picklable): the net's bytes in their carrier (a broadcast,
    or the plan under Spark Connect) and its hooks, the loss, the metrics, the batch size and the data's
    :class:`~optim.shares.RankData`."""

    net: Carrier
    loss: Loss
    metrics: list[Metric]
    batch_size: int
    data: RankData
    hooks: bytes | None = None
    size: int = 1  # the tasks of a job over a placeholder (each reads its share of ``size``)


@dataclass
class RunResult:
    """One ``optimize()`` run's outcome, local or distributed: the history, the global step, the optimiser state
    (its leaves) and the server method's, the step the run started from and the checkpoint it resumed, whether it
    stopped early at an epoch boundary (elastic training), and, from a distributed run, rank 0's final weights
    (None: trained in place), the rows per rank and the steps per epoch. ``run``: what the run measured, as
    ``last_run`` shows it (:meth:`RunSummary.to_dict`; rank 0's payload carries only its attempt). ``start_sha256``: a run that
    resumed from a checkpoint, the SHA-256 of the state it started from
    (:func:`optim.training.restore.state_digest`), to check against the checkpoint's; ``skipped_checkpoints``: why
    it passed over newer checkpoints (corrupt or truncated files, each named)."""

    history: dict[str, list]
    step: int
    state: list[np.ndarray]
    start_step: int = 0
    resumed_from: str | None = None
    exchange_state: tuple[np.ndarray, ...] = ()
    stopped: bool = False
    weights: dict[str, np.ndarray] | None = None
    rows: list[int] | None = None
    steps_per_epoch: int | None = None
    run: dict = field(default_factory=dict)
    start_sha256: str | None = None
    skipped_checkpoints: list[str] = field(default_factory=list)

    def last_run(self) -> dict:
        """``TFOptimizer.last_run``: what the run measured, with the step it started from and what it resumed."""
        return {**self.run, "start_step": self.start_step, "resumed_from": self.resumed_from}


@dataclass
class AttemptReport:
    """What rank 0 reported of one attempt of a distributed run (an entry of ``last_run["attempt_log"]`` holds it,
    and ``last_run`` the last one's): the step it started from and the checkpoint it resumed, the rows per rank
    (None where the data does not count rows), the steps per epoch, whether it stopped at an epoch boundary, the
    step it ended at, the SHA-256 of the state it started from and the newer checkpoints it passed over."""

    start_step: int = 0
    resumed_from: str | None = None
    rows: list | None = None
    steps_per_epoch: int | None = None
    stopped: bool = False
    end_step: int = 0
    start_sha256: str | None = None
    skipped_checkpoints: list = field(default_factory=list)

    @classmethod
    def of(cls, result: RunResult, counts_rows: bool) -> AttemptReport:
        """Rank 0's report in ``result`` (``counts_rows``: whether the data's row counts mean rows)."""
        return cls(result.start_step, result.resumed_from, result.rows if counts_rows else None,
                   result.steps_per_epoch, result.stopped, result.step, result.start_sha256,
                   result.skipped_checkpoints)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class ClusterRun:
    """What only a distributed run measures: its wall time, the progress clients refused, the last attempt's
    :class:`AttemptReport`, every attempt's log entry, when it started (``time.time()``), the kind of session
    (``"classic"``, ``"connect"``), barrier mode, the states it went through, the ranks from each step on, and how
    the net went out and rank 0's result came back (``net_via``, ``result_via``, ``result_pieces``)."""

    wall_s: float
    refused_progress_clients: int
    last_attempt: AttemptReport
    attempt_log: list[dict]
    started_at: float
    mode: str
    barrier: bool
    states: list[str]
    membership: list[dict]
    roads: dict = field(default_factory=dict)


@dataclass
class RunSummary:
    """What one ``optimize()`` run measured: ``TFOptimizer.last_run`` is its :meth:`to_dict`, built here alone.

    Every run has ``num_workers``, ``attempts`` (the failures plus one), ``failures`` (one line each), ``run_id``,
    ``startup_s`` (to the first step; None: no step), ``step_times``, ``allreduce_seconds``, ``start_step`` and
    ``resumed_from``; a distributed run adds ``wall_s``, ``refused_progress_clients``, its last attempt's report
    (``rows``, ``steps_per_epoch``, ``stopped``, ``end_step``, ``start_sha256``, ``skipped_checkpoints``:
    :class:`AttemptReport`), ``attempt_log``, ``started_at``, ``mode``, ``barrier``, ``states``, ``membership``,
    ``net_via``, ``result_via`` and ``result_pieces`` (:class:`ClusterRun`)."""

    num_workers: int
    failures: list[str]
    run_id: str | None
    startup_s: float | None
    step_times: list
    allreduce_seconds: list
    start_step: int = 0
    resumed_from: str | None = None
    cluster: ClusterRun | None = None

    def to_dict(self) -> dict:
        """``last_run``: the keys above, in this order."""
        head = {"num_workers": self.num_workers, "attempts": len(self.failures) + 1, "failures": self.failures}
        where = {"start_step": self.start_step, "resumed_from": self.resumed_from}
        c = self.cluster
        if c is None:
            return {**head, "run_id": self.run_id, "startup_s": self.startup_s, "step_times": self.step_times,
                    "allreduce_seconds": self.allreduce_seconds, **where}
        return {**head, "startup_s": self.startup_s, "wall_s": c.wall_s, "step_times": self.step_times,
                "allreduce_seconds": self.allreduce_seconds, "refused_progress_clients": c.refused_progress_clients,
                **c.last_attempt.to_dict(), **where, "attempt_log": c.attempt_log, "run_id": self.run_id,
                "started_at": c.started_at, "mode": c.mode, "barrier": c.barrier, "states": c.states,
                "membership": c.membership, **c.roads}


def pack_result(weights: dict[str, np.ndarray], result: RunResult, plan: dict) -> bytes:
    """Rank 0's payload: ``weights`` and the optimiser and server states as arrays, and what the run did (the step
    it started from and the checkpoint that was, whether it stopped, and ``plan``: the rows per rank, the steps per
    epoch, the attempt)."""
    from tfnet.container import pack

    arrays = {f"w{i:05d}": v for i, v in enumerate(weights.values())}
    arrays.update({f"s{i:05d}": np.asarray(leaf) for i, leaf in enumerate(result.state)})
    arrays.update({f"x{i:05d}": np.asarray(leaf) for i, leaf in enumerate(result.exchange_state)})
    header = {"history": result.history, "step": result.step, "weights": list(weights),
              "state_leaves": len(result.state), "exchange_leaves": len(result.exchange_state),
              "start_step": result.start_step, "stopped": result.stopped,
              "resumed_from": result.resumed_from, "start_sha256": result.start_sha256,
              "skipped_checkpoints": list(result.skipped_checkpoints), **plan}
    return pack(RESULT_FORMAT, header, arrays)


def unpack_result(data: bytes) -> RunResult:
    """The :class:`RunResult` from :func:`pack_result`'s payload (``weights`` set; ``run`` holds the plan's
    ``attempt``).

    Raises:
        tfnet.container.ContainerError: not a rank result, or corrupt.
    """
    from tfnet.container import unpack

    header, arrays = unpack(data, RESULT_FORMAT, what="rank 0's result")
    weights = {n: arrays[f"w{i:05d}"] for i, n in enumerate(header["weights"])}
    state = [arrays[f"s{i:05d}"] for i in range(header["state_leaves"])]
    exchange = tuple(arrays[f"x{i:05d}"] for i in range(header.get("exchange_leaves", 0)))
    return RunResult(header["history"], int(header["step"]), state, int(header.get("start_step") or 0),
                     header.get("resumed_from"), exchange, bool(header.get("stopped", False)), weights,
                     header.get("rows"), header.get("steps_per_epoch"), {"attempt": header.get("attempt")},
                     header.get("start_sha256"), list(header.get("skipped_checkpoints") or []))
