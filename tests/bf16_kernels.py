"""bfloat16 on every CPU, for the tests of tfnet's own bf16 road: oneDNN's kernels where the CPU has native bfloat16,
TensorFlow's emulation where it has not.

On a CPU without ``avx512_bf16`` or ``amx_bf16`` tfnet runs ``precision="bf16"`` in float32 with a
:class:`~tfnet.precision.PrecisionWarning` (emulated bfloat16 is slower than float32), so the tests of the bf16 road
skipped there: on an AVX2-only CI machine (AMD EPYC Zen 3) nothing checked it. What that road does is tfnet's whatever
the kernels: the oneDNN auto-mixed-precision rewrite set in the calling thread's function options only
(:func:`tfnet.precision.bf16_rewrite`), the weights, the optimiser state and the loss in float32. TensorFlow, asked
for the rewrite on such a CPU, rewrites the graph all the same and runs its bfloat16 ops on Eigen's kernels ("oneDNN
supports DT_BFLOAT16 only on platforms with AVX-512. Falling back to the default Eigen-based implementation"): still
bfloat16's 8-bit mantissa, rounded by other kernels.

The ``bf16_kernels`` fixture makes tfnet take its bf16 road on such a CPU by adding ``avx512_bf16`` to the flags tfnet
reads (:func:`tfnet.precision.cpu_flags`, the seam below which ``/proc/cpuinfo`` is read), in this process only, and
returns ``"oneDNN"`` or ``"Eigen (emulated)"``. A test whose bound is oneDNN's kernels' own rounding, or that needs
Spark's workers (other processes) on the bf16 road, still skips without native bfloat16.
"""

from __future__ import annotations

import pytest

NATIVE, EMULATED = "oneDNN", "Eigen (emulated)"


@pytest.fixture
def bf16_kernels(monkeypatch) -> str:
    """``"oneDNN"`` where the CPU computes bfloat16 natively; on a CPU without it, ``"Eigen (emulated)"`` after
    tfnet has been told the CPU has ``avx512_bf16`` (in this process, for this test). Skips where oneDNN is off or
    ``ONEDNN_MAX_CPU_ISA`` caps it below bfloat16, where tfnet's bf16 road runs float32 by design: a setting, not the
    hardware, so under CI=true (which leaves both as the suite sets them) that skip fails."""
    from tfnet import precision  # (imports TensorFlow: not when tests/conftest.py loads this plugin)

    if not precision.onednn_enabled() or precision.onednn_capped_below_bf16():
        pytest.skip("oneDNN is off (TF_ENABLE_ONEDNN_OPTS) or capped below bfloat16 (ONEDNN_MAX_CPU_ISA): tfnet's "
                    "bf16 road runs float32 there")
    if precision.cpu_has_bf16():
        return NATIVE
    flags = precision.cpu_flags() | {"avx512_bf16"}
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    assert precision.cpu_has_bf16()
    return EMULATED
