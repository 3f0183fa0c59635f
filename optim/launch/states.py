"""The states of a distributed run, as the launcher moves through them. Driver side, pure data.

Every path a run can take is in :class:`RunStateType`: it starts (the first attempt's ranks settled and the
stage prepared), runs an attempt, and then either finishes, fails, retries (a failure a rerun can mend, with
as many ranks as before), shrinks (a retry with fewer ranks: slots were lost, elastic training) or grows (the
ranks stopped at an epoch boundary because the lost slots came back). What to do after an attempt is decided
by pure policies, :meth:`optim.launch.retry.RetryPolicy.decide` and
:class:`optim.launch.elastic.ElasticPolicy`; the launcher (:mod:`optim.launch.launcher`) carries
the decisions out. Ray Train V2's controller states are the model.

>>> RunStateType.FINISHED.terminal, RunStateType.SHRINKING.new_attempt
(True, True)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optim.launch.stage import Stage
    from optim.protocol import RunResult

__all__ = ["Failed", "Finished", "Growing", "Retrying", "RunState", "RunStateType", "Running", "Shrinking",
           "Starting"]


class RunStateType(enum.Enum):
    """Where a run is. ``terminal``: the run is over; ``new_attempt``: the next state runs a new attempt of the
    stage."""

    STARTING = ("starting", False, False)
    RUNNING = ("running", False, False)
    RETRYING = ("retrying", False, True)
    SHRINKING = ("shrinking", False, True)
    GROWING = ("growing", False, True)
    FINISHED = ("finished", True, False)
    FAILED = ("failed", True, False)

    def __init__(self, label: str, terminal: bool, new_attempt: bool):
        self.label, self.terminal, self.new_attempt = label, terminal, new_attempt


@dataclass(frozen=True)
class RunState:
    """A state, and what it carries."""

    type = RunStateType.STARTING


@dataclass(frozen=True)
class Starting(RunState):
    """Before the first attempt: ``ranks`` asked for."""

    ranks: int
    type = RunStateType.STARTING


@dataclass(frozen=True)
class Running(RunState):
    """Attempt ``attempt`` runs ``stage`` (an :class:`optim.launch.stage.Stage`); ``failed``: the attempts
    that failed before it."""

    stage: Stage
    attempt: int
    failed: int = 0
    type = RunStateType.RUNNING


@dataclass(frozen=True)
class Retrying(RunState):
    """Attempt ``attempt`` failed with ``error`` (a failure a rerun can mend); the next attempt waits for the
    lost slots, then runs with as many ranks as there are (at least ``min_workers``)."""

    stage: Stage
    attempt: int
    failed: int
    error: BaseException
    type = RunStateType.RETRYING


@dataclass(frozen=True)
class Shrinking(RunState):
    """The next attempt runs on fewer ranks, ``ranks``, from the run's newest checkpoint (elastic training)."""

    stage: Stage
    attempt: int
    failed: int
    ranks: int
    type = RunStateType.SHRINKING


@dataclass(frozen=True)
class Growing(RunState):
    """The ranks stopped at an epoch boundary because the lost slots came back: the next attempt runs on as many
    ranks as there are slots for (up to ``num_workers``), from that epoch's checkpoint."""

    stage: Stage
    attempt: int
    failed: int
    type = RunStateType.GROWING


@dataclass(frozen=True)
class Finished(RunState):
    """The run is over: ``result`` (an :class:`optim.protocol.RunResult`)."""

    result: RunResult
    type = RunStateType.FINISHED


@dataclass(frozen=True)
class Failed(RunState):
    """The run is over, with ``error`` (raised from ``cause``, the attempt's own error)."""

    error: BaseException
    cause: BaseException | None = None
    type = RunStateType.FAILED
