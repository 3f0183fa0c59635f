"""Compute precision: what the CPU supports, and bfloat16 for the fused training step.

``precision="bf16"`` computes the forward and backward passes in bfloat16 while the weights, the
optimiser state and the loss stay float32 (master weights). It uses TensorFlow's oneDNN
auto-mixed-precision graph rewrite (grappler's ``auto_mixed_precision_onednn_bfloat16``), turned
on only while the bf16 step's own function is instantiated and called (:func:`bf16_rewrite`), so
other functions in the process stay float32. The rewrite runs convolutions, matmuls and their
gradients (and the elementwise ops between them) in bfloat16 with casts at the edges; variables
are never rewritten, and the loss's reductions (``Sum``, ``Mean``, ``Log``, ``Exp``, the softmax
cross-entropies) are on its float32-only list.

Where the CPU has no native bfloat16 (``avx512_bf16`` or ``amx_bf16``), or oneDNN is off, a
:class:`PrecisionWarning` says so once and the step runs in float32: emulated bfloat16 is slower
than float32, never faster.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from tfnet.errors import TFNetError

__all__ = ["PRECISIONS", "PrecisionError", "PrecisionWarning", "cpu_flags", "cpu_has_bf16", "check_precision",
           "training_precision", "onednn_enabled", "bf16_rewrite"]

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


def onednn_enabled() -> bool:
    """Whether TensorFlow's oneDNN kernels (and so its bf16 rewrite) are on in this process:
    ``TF_ENABLE_ONEDNN_OPTS=1``, or unset on an Intel CPU (TensorFlow's own default)."""
    value = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if value is not None:
        return value.strip().lower() in ("1", "true")
    try:
        with open("/proc/cpuinfo") as f:
            return "GenuineIntel" in f.read(4096)
    except OSError:
        return False


_warned: set[str] = set()


def training_precision(precision: str) -> str:
    """The precision the training step runs in: ``precision``, or ``"fp32"`` (warned once per
    process) for ``"bf16"`` on a CPU without native bfloat16 or with oneDNN off."""
    check_precision(precision)
    if precision != "bf16":
        return precision
    missing = None
    if not cpu_has_bf16():
        missing = "this CPU has no native bfloat16 (avx512_bf16 or amx_bf16)"
    elif not onednn_enabled():
        missing = "TensorFlow's oneDNN kernels are off (set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported)"
    if missing is None:
        return "bf16"
    if missing not in _warned:
        _warned.add(missing)
        warnings.warn(f"precision='bf16' was asked for, but {missing}; training runs in fp32.", PrecisionWarning,
                      stacklevel=4)
    return "fp32"


_REWRITE = "auto_mixed_precision_onednn_bfloat16"
_rewrite_lock = threading.RLock()


@contextmanager
def bf16_rewrite(on: bool = True) -> Iterator[None]:
    """Inside it (when ``on``), functions instantiated and called get oneDNN's bf16
    auto-mixed-precision rewrite; the previous setting comes back after. Calls from several threads
    take turns."""
    if not on:
        yield
        return
    import tensorflow as tf

    with _rewrite_lock:
        before = tf.config.optimizer.get_experimental_options().get(_REWRITE, False)
        tf.config.optimizer.set_experimental_options({_REWRITE: True})
        try:
            yield
        finally:
            tf.config.optimizer.set_experimental_options({_REWRITE: before})
