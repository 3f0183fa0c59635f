"""A rank's share of the data: the data's half of the driver<->rank protocol, how a rank opens its share. Both sides.

A data adapter (:class:`optim.data.base.DataAdapter`) makes a :class:`RankData` on the driver when it stages the data
for ``n`` ranks; it travels in the job (:class:`optim.protocol.RankJob`, :class:`optim.protocol.EvalJob`) and, on the
rank, opens the rank's share (:meth:`RankData.open` with the rank's :class:`RankEnv`, giving an :class:`Opened`),
counts it, and turns every rank's count into the steps they all take (:func:`agree_steps`). Validation data travels
in a :class:`~optim.carriers.Carrier` (a Spark broadcast, the plan, or a file). Plain Python: no TensorFlow, no Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from optim.carriers import Carrier
from optim.errors import DataError

__all__ = ["Opened", "RankData", "RankEnv", "agree_steps"]


@dataclass
class RankEnv:
    """What a rank offers its data when it opens it (made by the rank).

    Attributes:
        name: A name for this rank's local copies (the run, the rank and the attempt).
        checks: ``checks(where)``: the partition checks (:class:`optim.data.values.PartitionChecks`) of
            the run's loss, outputs and ``on_nonfinite``, naming the rows as ``where`` says.
        check_values: ``check_values(dataset, where)``: the same checks on a partition read whole (an
            :class:`~optim.data.arrays.ArrayDataset`); returns it, or it without its skipped rows.
    """

    name: str
    checks: Callable[[str], Any]
    check_values: Callable[[Any, str], Any]


@dataclass
class Opened:
    """A rank's data once opened: its training share, its validation share (None: none, or shipped apart), and
    the local copies it made (removed by :meth:`release` on every way out)."""

    train: Any
    validation: Any = None
    local: list = field(default_factory=list)

    def release(self) -> None:
        for data in self.local:
            data.release()


class RankData:
    """How a rank opens its share of the data: made by :meth:`DataAdapter.stage` on the driver, shipped in
    the job (picklable), used on the rank. ``validation`` is shipped validation data (its
    :class:`~optim.carriers.Carrier`, or None)."""

    validation: Carrier | None = None
    #: Whether :meth:`count` counts rows (a ``tf.data`` input counts batches).
    counts_rows: bool = True

    def open(self, rows: Iterable, rank: int, size: int, env: RankEnv) -> Opened:  # pragma: no cover - interface
        raise NotImplementedError

    def count(self, opened: Opened, rank: int, size: int) -> int:
        """What the ranks gather to agree on the steps: this rank's rows."""
        return int(opened.train.rows_on(rank, size))

    def steps(self, counts: list[int], per_rank_batch: int) -> int:
        """Steps per epoch for every rank, from every rank's :meth:`count` (:func:`agree_steps`)."""
        return agree_steps(counts, per_rank_batch)

    def evaluate(self, rows: Iterable, partition: int, size: int) -> tuple[Any, int, int]:
        """For a distributed evaluation (a task per partition): ``(data, rank, size)`` to accumulate over."""
        raise NotImplementedError  # pragma: no cover - interface

    def open_validation(self):
        return None if self.validation is None else self.validation.read()


def agree_steps(rows: list[int], per_rank_batch: int) -> int:
    """Steps per epoch for every rank: ``ceil(max(rows) / per_rank_batch)``.

    Each rank takes that many full batches; a rank with fewer rows wraps around (a fresh shuffle of
    its rows), so every row is seen at least once per epoch and no rank waits in a collective that
    another rank never joins.

    >>> agree_steps([100, 37], 10)
    10
    """
    if not rows or min(rows) <= 0:
        empty = [r for r, n in enumerate(rows) if n <= 0]
        raise DataError(f"Ranks {empty} have no rows to train on (rows per rank: {rows}).")
    return max(1, -(-max(rows) // per_rank_batch))
