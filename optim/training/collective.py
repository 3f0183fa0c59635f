"""Collectives the training loop uses. :class:`LocalCollective` is the one-process case; the
Horovod collective (``optim.training.horovod``) has the same interface, so the loop never changes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


class Collective:
    """What the training loop needs from its peers."""

    rank: int = 0
    size: int = 1

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def reducer(self) -> Callable | None:
        """``(grads, loss) -> (grads, loss)`` averaged over ranks, run inside the compiled step."""
        return None

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def allreduce_min(self, value: int) -> int:
        return int(value)

    def allreduce_max(self, value: int) -> int:
        return int(value)

    def broadcast(self, arrays: Sequence[np.ndarray], root: int = 0) -> list[np.ndarray]:
        return [np.asarray(a) for a in arrays]

    def broadcast_object(self, obj, root: int = 0):
        return obj


class LocalCollective(Collective):
    """One process: every collective is the identity."""
