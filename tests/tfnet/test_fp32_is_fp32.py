"""fp32 is fp32 with oneDNN on: a deep Keras net (ResNet101 at 64x64, random weights and batch-norm statistics),
frozen by TensorFlow's converter and taken with ``from_keras``, loaded as a TFNet, against a float64 twin of the
same model with the same weights: forward to 1e-5, the input gradient and every weight's gradient to 1e-4, one SGD
step's change of the outputs to 1e-3 (relative, L2). A reduced-precision kernel anywhere in the graph (oneDNN's
bf16 fpmath mode on an AMX CPU gave the input gradient 8.8e-3) fails it; Keras's own fp32 is checked against the
same truth beside it, so that a failure says whose rounding moved."""

import platform

import numpy as np
import pytest

from tests.tfnet import fidelity as fd
from tests.tfnet import keras_models as km
from tfnet import precision

NAME, SIZE = "ResNet101", 64


def _cpu() -> str:
    flags = sorted(precision.cpu_flags() & {"amx_bf16", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2"})
    return f"{platform.processor() or platform.machine()} flags {' '.join(flags)}"


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    model, x = km.application(NAME, size=SIZE)
    twin = km.float64_twin(NAME, model, size=SIZE)
    keras_error = _keras_input_gradient_error(model, twin, x)
    found = fd.keras_cases(NAME, model, x, str(tmp_path_factory.mktemp("fp32")), twin=twin)
    return {c.path: c for c in found}, keras_error


def _keras_input_gradient_error(model, twin, x) -> float:
    import tensorflow as tf

    g = np.random.default_rng(1).normal(size=(x.shape[0], 5))
    grads = []
    for m, t in ((model, tf.constant(x)), (twin, tf.constant(x.astype(np.float64)))):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.reduce_sum(tf.cast(m(t, training=False), tf.float64) * g)
        grads.append(tape.gradient(y, t).numpy())
    return fd.rel_error(grads[0], grads[1])


def test_onednn_is_on_here():
    """The checks below are about oneDNN's kernels: `make test` turns them on (TF_ENABLE_ONEDNN_OPTS=1)."""
    assert precision.onednn_enabled(), "run the tests with TF_ENABLE_ONEDNN_OPTS=1 (the Makefile sets it)"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["converter", "from_keras"])
def test_resnet101_is_float32_against_float64_truth(cases, path):
    by_path, keras_error = cases
    try:
        errors = fd.compare(by_path[path])[1]
    except AssertionError as exc:
        raise AssertionError(f"{exc} (on {_cpu()}; Keras's own fp32 input gradient: {keras_error:.2e})") from None
    print(f"{path}: {errors} on {_cpu()}; Keras fp32 input gradient {keras_error:.2e}")
