"""Collectives the training loop uses. :class:`LocalCollective` is the one-process case; the
Horovod collective (``optim.training.horovod``) has the same interface, so the loop never changes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np


class Collective:
    """What the training loop needs from its peers."""

    rank: int = 0
    size: int = 1

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def reducer(self, bucket_bytes: int = 0, compression: str | None = None) -> Callable | None:
        """``(grads, loss) -> (grads, loss)`` averaged over ranks, run inside the compiled step
        (in buckets of ``bucket_bytes`` when not 0; in 16 bits with ``compression``)."""
        return None

    def average(self, tensors: Sequence, compression: str | None = None, name: str = "tfnet_exchange") -> list:
        """The ranks' average of each tensor, eagerly (one process: the tensors)."""
        return list(tensors)

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def allreduce_min(self, value: int) -> int:
        return int(value)

    def allreduce_max(self, value: int) -> int:
        return int(value)

    def broadcast(self, arrays: Sequence[np.ndarray], root: int = 0) -> list[np.ndarray]:
        return [np.asarray(a) for a in arrays]

    def broadcast_json(self, obj, root: int = 0):
        """``obj`` (anything JSON holds) from ``root``, sent as arrays: nothing received from a peer
        is ever unpickled."""
        data = np.frombuffer(json.dumps(obj).encode(), np.uint8) if self.rank == root else np.zeros(0, np.uint8)
        size = self.broadcast([np.array([data.size], np.int64)], root)[0]
        if self.rank != root:
            data = np.zeros(int(size[0]), np.uint8)
        return json.loads(bytes(np.asarray(self.broadcast([data], root)[0], np.uint8)))


class LocalCollective(Collective):
    """One process: every collective is the identity."""
