"""How often the ranks exchange: the ``sync`` argument of ``TFOptimizer.optimize``.

* ``sync=None`` or :class:`EveryStep`: the gradients are averaged over the ranks at every step
  (synchronous data parallelism, Horovod's way). :class:`EveryStep` can reduce the gradients in
  buckets as the backward pass makes them (``overlap=True``) and send them in 16 bits
  (``compression="fp16"`` or ``"bf16"``).
* :class:`LocalSGD`: each rank takes ``every`` steps of the worker (inner) method on its own data,
  then the ranks average how far their weights moved with one allreduce, and the ``server``
  (outer) method applies that average. ``server=optim.SGD(1.0)`` is plain model averaging;
  ``optim.SGD(0.7, momentum=0.9, nesterov=True)`` is the DiLoCo recipe.
* :class:`Asynchronous`: each step's gradient exchange runs in the background while the next step
  computes; a step applies the averaged gradient of ``staleness`` steps before, so no rank waits
  for a slower rank's current step.

Every mode takes equal steps on every rank, checkpoints (the server method's state included),
resumes, retries, and reports the bytes each rank sends per step (``bytes_per_step`` in the
progress bar, the history and TensorBoard). These objects are plain configuration: they are
pickled to the ranks, where ``optim.training.exchange`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EveryStep", "LocalSGD", "Asynchronous", "check_sync"]

_COMPRESSIONS = (None, "fp16", "bf16")


@dataclass(frozen=True)
class EveryStep:
    """Average the gradients over the ranks at every step (the default, ``sync=None``).

    Args:
        overlap: Reduce the gradients in buckets of about ``bucket_mb`` MiB, in reverse layer order,
            each as soon as the backward pass has made it, instead of one call after the whole
            backward pass. Default: True.
        bucket_mb: The bucket size for ``overlap``. Default: 4.
        compression: ``None`` (float32), ``"fp16"`` (half the bytes; Horovod's own fp16
            allreduce; a gradient over 65504 in magnitude overflows, as with
            ``hvd.Compression.fp16``) or ``"bf16"`` (half the bytes, float32's range; Horovod has no
            bfloat16 allreduce, so the ranks all-gather the bfloat16 gradients and sum them in
            float32: on N ranks each sends ``N - 1`` times its half-size gradients, against
            ``2 (N - 1) / N`` times its float32 ones for the ring allreduce). Default: None.
    """

    overlap: bool = True
    bucket_mb: float = 4.0
    compression: str | None = None

    def __post_init__(self):
        if self.compression not in _COMPRESSIONS:
            raise ValueError(f"`compression` must be None, 'fp16' or 'bf16'. Received: {self.compression!r}")
        if not isinstance(self.bucket_mb, (int, float)) or isinstance(self.bucket_mb, bool) or self.bucket_mb <= 0:
            raise ValueError(f"`bucket_mb` must be a positive number. Received: {self.bucket_mb!r}")

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * (1 << 20)) if self.overlap else 0


@dataclass(frozen=True)
class LocalSGD:
    """Local SGD: ``every`` local steps of the worker method, then one exchange.

    At an exchange, each rank's pseudo-gradient is ``anchor - weights`` (how far its weights moved
    since the last exchange, the anchor); the ranks average it with one allreduce, and the
    ``server`` method applies the average to the anchor, which becomes every rank's weights.
    Statistics (batch-norm means and variances) are averaged. Each rank keeps its own worker
    optimiser state, as DiLoCo does; a checkpoint holds rank 0's, and the server method's state.

    The ranks also exchange before every checkpoint, validation and at the end of training, so
    what is saved, validated and returned is one model.

    Args:
        every: Local steps between exchanges (K). ``every=1`` with ``server=optim.SGD(1.0)`` is
            every-step training with plain SGD, to float32 rounding.
        server: The server (outer) method: any ``optim`` method. Default: ``optim.SGD(1.0)``
            (plain averaging of the weights).
    """

    every: int
    server: Any = None

    def __post_init__(self):
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise ValueError(f"`every` must be a positive integer (steps between exchanges). Received: {self.every!r}")
        if self.server is not None and not (hasattr(self.server, "init") and hasattr(self.server, "update")):
            raise TypeError(f"`server` must be an optim method (e.g. optim.SGD(1.0)). Received: {self.server!r}")

    def server_method(self):
        if self.server is not None:
            return self.server
        from optim.methods import SGD

        return SGD(1.0)


@dataclass(frozen=True)
class Asynchronous:
    """Asynchronous exchange with bounded staleness.

    Each step computes its gradient on the current weights and hands it to a background exchange
    (an allreduce that averages it over the ranks); then it applies the averaged gradient of the
    step ``staleness`` steps before, which has had a whole step's compute to arrive. A rank waits
    only for that older exchange, never for another rank's current step. The pending gradients are
    applied before every checkpoint, validation and at the end, so every rank holds the same weights
    there, and a resumed run continues exactly.

    Args:
        staleness: How many steps old the applied gradient is. 0 applies each step's own averaged
            gradient (every-step training without overlap). Default: 1.
        compression: As :class:`EveryStep`'s. Default: None.
    """

    staleness: int = 1
    compression: str | None = None

    def __post_init__(self):
        if not isinstance(self.staleness, int) or isinstance(self.staleness, bool) or self.staleness < 0:
            raise ValueError(f"`staleness` must be a non-negative integer. Received: {self.staleness!r}")
        if self.compression not in _COMPRESSIONS:
            raise ValueError(f"`compression` must be None, 'fp16' or 'bf16'. Received: {self.compression!r}")


def check_sync(sync):
    """``sync`` as one of the mode objects (None: :class:`EveryStep` with its defaults)."""
    if sync is None:
        return EveryStep()
    if isinstance(sync, (EveryStep, LocalSGD, Asynchronous)):
        return sync
    raise TypeError("`sync` must be None (every step), optim.EveryStep(...), optim.LocalSGD(every=K, server=...) or "
                    f"optim.Asynchronous(staleness=...). Received: {sync!r}")
