"""Compute precision: what the CPU supports, and bfloat16 for the fused training step.

``precision="bf16"`` computes the forward and backward passes in bfloat16 while the weights, the
optimiser state and the loss stay float32 (master weights). Where the CPU has no native bfloat16
(``avx512_bf16`` or ``amx_bf16``), a :class:`PrecisionWarning` says so once and the step runs in
float32: emulated bfloat16 is slower than float32, never faster.
"""

from __future__ import annotations

import functools
import logging
import warnings

from tfnet.errors import TFNetError

__all__ = ["PRECISIONS", "PrecisionError", "PrecisionWarning", "cpu_flags", "cpu_has_bf16", "check_precision",
           "training_precision"]

log = logging.getLogger("tfnet.precision")

#: Precisions of the training step (inference also takes ``"int8"``, see ``optim.predict``).
PRECISIONS = ("fp32", "bf16")


class PrecisionError(TFNetError, ValueError):
    """An unknown precision, or one the chosen backend cannot run (``int8`` needs OpenVINO)."""

    retryable = False


class PrecisionWarning(UserWarning):
    """A lower precision was asked for where the CPU (or a missing package) cannot give it; fp32 runs
    instead. The message says which feature is missing."""


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16``)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def check_precision(precision: str) -> str:
    """Raises :class:`PrecisionError` unless ``precision`` is one of :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise PrecisionError(f"`precision` must be one of {list(PRECISIONS)}. Received: precision={precision!r}")
    return precision


_warned: set[str] = set()


def training_precision(precision: str) -> str:
    """The precision the training step runs in: ``precision``, or ``"fp32"`` (warned once per
    process) for ``"bf16"`` on a CPU without native bfloat16."""
    check_precision(precision)
    if precision == "bf16" and not cpu_has_bf16():
        if "bf16" not in _warned:
            _warned.add("bf16")
            warnings.warn("precision='bf16' was asked for, but this CPU has no native bfloat16 (avx512_bf16 or "
                          "amx_bf16); training runs in fp32.", PrecisionWarning, stacklevel=3)
        return "fp32"
    return precision
