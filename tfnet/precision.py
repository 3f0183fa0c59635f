"""Compute precision: what the CPU supports, and bfloat16 for the fused training step.

``precision="bf16"`` computes the forward and backward passes in bfloat16 while the weights, the
optimiser state and the loss stay float32 (master weights). It uses TensorFlow's oneDNN
auto-mixed-precision graph rewrite (grappler's ``auto_mixed_precision_onednn_bfloat16``), turned
on only in the calling thread while the bf16 step's own function is instantiated and called (:func:`bf16_rewrite`), so
other functions in the process stay float32. The rewrite runs convolutions, matmuls and their
gradients (and the elementwise ops between them) in bfloat16 with casts at the edges; variables
are never rewritten, and the loss's reductions (``Sum``, ``Mean``, ``Log``, ``Exp``, the softmax
cross-entropies) are on its float32-only list.

Where the CPU has no native bfloat16 (``avx512_bf16`` or ``amx_bf16``; or ``ONEDNN_MAX_CPU_ISA`` keeps oneDNN
below it), or oneDNN is off, a
:class:`PrecisionWarning` says so once and the step runs in float32: emulated bfloat16 is slower
than float32, never faster.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from tfnet.call_options import edited_options, thread_rewrites
from tfnet.errors import TFNetError

__all__ = ["PRECISIONS", "PrecisionError", "PrecisionWarning", "cpu_flags", "cpu_model", "cpu_has_bf16", "bf16_missing", "check_precision",
           "training_precision", "onednn_enabled", "onednn_isa_cap", "onednn_capped_below_bf16",
           "bf16_rewrite"]

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


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name with its family and model numbers from ``/proc/cpuinfo`` (a virtual machine's name is
    often generic: "Intel(R) Xeon(R) Processor (family 6 model 167)"); ``platform.processor()`` where it cannot be
    read."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "model name" not in fields:
        import platform

        return platform.processor() or "unknown CPU"
    return f"{fields['model name']} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


#: ``ONEDNN_MAX_CPU_ISA`` values (oneDNN's names, any case) that stop below oneDNN's bfloat16 kernels
#: (``avx512_core_bf16`` and above); OpenVINO's CPU plugin, built on oneDNN, honours the same variable
ISA_BELOW_BF16 = frozenset({"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"})
#: The CPU flags (``/proc/cpuinfo``) of native bfloat16: AVX-512's and AMX's
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def onednn_isa_cap() -> str:
    """``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``), lower case; ``""`` where unset."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().lower()


def bf16_missing() -> str | None:
    """Why bfloat16 is not native here (None where it is): the CPU has neither ``avx512_bf16`` nor ``amx_bf16``, or
    ``ONEDNN_MAX_CPU_ISA`` stops oneDNN (TensorFlow's and OpenVINO's kernels) below its bfloat16 kernels. With such a
    cap on a CPU whose flags say bfloat16, TensorFlow still sends bfloat16 matmuls to oneDNN, which then has no
    kernel: the process aborts ("could not create a primitive descriptor")."""
    if not cpu_flags() & BF16_FLAGS:
        return "this CPU has no native bfloat16 (avx512_bf16 or amx_bf16)"
    if onednn_capped_below_bf16():
        return f"oneDNN is capped below its bfloat16 kernels (ONEDNN_MAX_CPU_ISA={onednn_isa_cap()})"
    return None


def onednn_capped_below_bf16() -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` stops oneDNN below its bfloat16 kernels (:data:`ISA_BELOW_BF16`). On a CPU with
    bfloat16, TensorFlow's bfloat16 matmuls and OpenVINO's ``bf16`` hint then find no kernel."""
    return onednn_isa_cap() in ISA_BELOW_BF16


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16``), for oneDNN's kernels:
    :func:`bf16_missing` is None."""
    return bf16_missing() is None


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
    missing = bf16_missing()
    if missing is None and not onednn_enabled():
        missing = "TensorFlow's oneDNN kernels are off (set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported)"
    if missing is None:
        return "bf16"
    if missing not in _warned:
        _warned.add(missing)
        warnings.warn(f"precision='bf16' was asked for, but {missing}; training runs in fp32.", PrecisionWarning,
                      stacklevel=4)
    return "fp32"


@contextmanager
def bf16_rewrite(on: bool = True) -> Iterator[None]:
    """Inside it (when ``on``), functions this thread instantiates and calls get oneDNN's bf16
    auto-mixed-precision rewrite; this thread's previous options come back after.

    The rewrite is set in this thread's function-call options only (TensorFlow keeps them per thread), never
    in the process-wide optimizer options: those reach any other thread that calls its first function
    meanwhile, and a fresh thread's fp32 forward, run while a bf16 step trained in another, came out at
    bf16's precision (4.3e-3 from its own fp32 result, 19 times in 20). :func:`tfnet.call_options.thread_rewrites`
    swaps them."""
    if not on:
        yield
        return
    with thread_rewrites(lambda before: edited_options(before, _bf16_on)):
        yield


def _bf16_on(rewrites) -> None:
    from tensorflow.core.protobuf import rewriter_config_pb2

    rewrites.auto_mixed_precision_onednn_bfloat16 = rewriter_config_pb2.RewriterConfig.ON
