"""What the training loop tells a watchdog about its progress. Pure: no Spark, no Horovod.

The loop calls :meth:`Liveness.kick` after every unit of work (a training step, a validation
batch) and wraps the phases that are long by nature (the first step's compile, a checkpoint write,
waiting for the other ranks to finish their validation) in :meth:`Liveness.phase`, which gives them
their own, longer bound. A local run uses :class:`Liveness` itself, which does nothing; a rank of a
distributed run uses :class:`optim.rank.watchdog.Watchdog`, which ends a rank that stops
making progress and tells the driver it is alive.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Liveness"]


class Liveness:
    """No watchdog: every call does nothing."""

    def kick(self, phase: str | None = None) -> None:
        """Progress was made (in ``phase``, when given)."""

    @contextmanager
    def phase(self, name: str, timeout_s: float | None = None) -> Iterator[None]:
        """A phase with its own bound: ``timeout_s`` seconds (default: the watchdog's long bound)
        may pass without a kick inside it."""
        yield
