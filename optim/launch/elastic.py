"""Elastic training: how many ranks a run goes on with when task slots are lost or come back. Driver
side, pure (the launcher carries the decisions out).

A run asks for ``num_workers`` (N) ranks and accepts ``min_workers`` (M <= N). When a rank's executor
is lost and N slots are not back within ``elastic_wait`` seconds, the run goes on, from its own newest
checkpoint, with the largest rank count n in [M, slots] that splits the global batch evenly (so the
arithmetic of training stays the same: the same global batch, the same learning rate). While it runs
with fewer than N ranks, the driver watches the slots; once N are there again, the ranks stop at the
next epoch boundary, after that epoch's checkpoint, and the run grows back from it.

>>> ElasticPolicy(4, 1).ranks_for(slots=3, batch_size=32)
2
"""

from __future__ import annotations

from dataclasses import dataclass

from optim.errors import DistributedTrainingError

__all__ = ["ElasticPolicy", "membership"]


@dataclass(frozen=True)
class ElasticPolicy:
    """``num_workers`` ranks wanted, at least ``min_workers``, waiting ``wait_s`` seconds for lost slots.

    Raises:
        ValueError: the bounds are not 1 <= min_workers <= num_workers, or ``wait_s`` is negative.
    """

    num_workers: int
    min_workers: int
    wait_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.min_workers, int) or isinstance(self.min_workers, bool) or \
                not 1 <= self.min_workers <= self.num_workers:
            raise ValueError(f"`min_workers` must be an integer from 1 to num_workers={self.num_workers}. "
                             f"Received: min_workers={self.min_workers!r}")
        if self.wait_s < 0:
            raise ValueError(f"`elastic_wait` must be a number of seconds >= 0. Received: {self.wait_s!r}")

    @property
    def elastic(self) -> bool:
        """Whether the run may go on with fewer ranks than it asked for."""
        return self.min_workers < self.num_workers

    def ranks_for(self, slots: int, batch_size: int | None) -> int:
        """The ranks to go on with when ``slots`` task slots are there: the largest n in
        [min_workers, min(slots, num_workers)] that divides ``batch_size`` (the global batch; None for
        tf.data input, which batches itself on each rank).

        Raises:
            DistributedTrainingError: no such n (fewer slots than ``min_workers``, or no count that
                splits the batch); not retried.
        """
        top = min(int(slots), self.num_workers)
        for n in range(top, self.min_workers - 1, -1):
            if batch_size is None or batch_size % n == 0:
                return n
        if top < self.min_workers:
            why = (f"the cluster offered {slots} task slot(s) within {self.wait_s:.0f} s (elastic_wait), fewer than "
                   f"min_workers={self.min_workers}")
        else:
            why = (f"no rank count from min_workers={self.min_workers} to {top} (the {slots} task slot(s) the cluster "
                   f"offered) splits the global batch of {batch_size} evenly")
        err = DistributedTrainingError(
            f"Distributed training cannot go on: {why}. Add executors or cores, lower min_workers, or pick a "
            "batch size that the rank counts divide.")
        err.retryable = False  # type: ignore[attr-defined]
        raise err

    def should_grow(self, running: int, slots: int) -> bool:
        """Whether a run on ``running`` ranks should grow back now that ``slots`` task slots are there."""
        return running < self.num_workers and slots >= self.num_workers


def membership(changes: list[tuple[int, int]]) -> list[dict]:
    """``[{"step": s, "ranks": n}, ...]`` from ``(start step, ranks)`` per attempt, in order: an attempt
    on as many ranks as the one before (a plain retry) adds no entry."""
    out: list[dict] = []
    for step, ranks in changes:
        if not out or out[-1]["ranks"] != ranks:
            out.append({"step": int(step), "ranks": int(ranks)})
    return out
