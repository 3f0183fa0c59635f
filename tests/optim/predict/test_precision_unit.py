"""INT8 and bf16 inference without Spark: NNCF quantisation on the fine-tuned digits model, the
bf16 precision hint, save and load, and every bad input (typed errors or a warning and fp32)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from optim import TFPredictor
from optim.errors import BackendUnavailableError, CalibrationError, PrecisionError, PrecisionWarning
from optim.predict import quantize
from tests.tfnet import transfer
from tfnet import TFNetError, precision

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tuned():
    """(net, calibration x, test x, test y): the digits transfer task, fine-tuned in fp32."""
    opt = transfer.fine_tune()
    (xtr, _), (xte, yte) = transfer.data()
    return opt.net, xtr, xte, yte


def _fake_quantize_ops(model) -> int:
    return sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())


def test_int8_keeps_accuracy_quantises_once_and_saves(tuned, tmp_path):
    """The oracle is OpenVINO and NNCF on their own: the frozen graph's file read by
    ``ov.convert_model``, quantised by ``nncf.quantize`` from the same 200 calibration rows and run
    by OpenVINO's CPU plugin (INT8 where quantised, f32 elsewhere) gives the predictor's outputs;
    OpenVINO alone runs the IR the predictor saved to the same outputs; and against the fp32
    reference (OpenVINO's f32 run of the graph, itself TensorFlow's outputs) INT8 keeps the
    documented accuracy, within 1 point."""
    import nncf
    import openvino as ov

    net, xtr, xte, yte = tuned
    before = quantize.quantization_count()
    p = TFPredictor(net, backend="openvino", precision="int8", calibration=xtr, calibration_size=200)
    assert (p.backend, p.precision) == ("openvino", "int8")
    assert quantize.quantization_count() == before + 1 and p.stats()["quantizations"] == 1
    got = p.predict(xte)
    assert p.stats()["rows"] == len(xte)

    pb = tmp_path / "frozen.pb"
    pb.write_bytes(net.frozen_graph_def().SerializeToString())
    core, f32 = ov.Core(), {"INFERENCE_PRECISION_HINT": "f32"}
    model = ov.convert_model(str(pb))
    fp32 = core.compile_model(model, "CPU", f32)(xte)[0]
    np.testing.assert_allclose(fp32, net.forward(xte), rtol=1e-5, atol=1e-5)  # the fp32 reference
    quantized = nncf.quantize(model, nncf.Dataset([xtr[i:i + 1] for i in range(200)]), subset_size=200)
    assert _fake_quantize_ops(quantized) > 0
    np.testing.assert_allclose(got, core.compile_model(quantized, "CPU", f32)(xte)[0], rtol=1e-6, atol=1e-6)
    assert abs(transfer.accuracy(got, yte) - transfer.accuracy(fp32, yte)) <= 0.01
    assert transfer.accuracy(fp32, yte) >= 0.95
    assert np.mean(got.argmax(1) == fp32.argmax(1)) >= 0.98  # the same class for nearly every digit
    assert not np.allclose(got, fp32, atol=1e-4)  # the model did change: INT8 is not fp32

    p.save(tmp_path / "int8")
    saved = core.read_model(str(tmp_path / "int8" / "openvino" / "model.xml"))
    assert _fake_quantize_ops(saved) == _fake_quantize_ops(quantized)
    np.testing.assert_array_equal(core.compile_model(saved, "CPU", f32)(xte)[0], got)
    again = TFPredictor.load(tmp_path / "int8", batch_per_thread=7)
    assert (again.backend, again.precision, again.batch_per_thread) == ("openvino", "int8", 7)
    np.testing.assert_array_equal(again.predict(xte), got)
    assert quantize.quantization_count() == before + 1  # loading does not quantise again


def test_bf16_hint_runs_bf16_and_stays_close(tuned):
    net, _, xte, yte = tuned
    p = TFPredictor(net, backend="openvino", precision="bf16")
    assert p.precision == ("bf16" if precision.cpu_has_bf16() else "fp32")
    got, fp32 = p.predict(xte), net.forward(xte)
    # bfloat16 keeps 8 bits of mantissa: close to fp32, not equal to it
    assert np.max(np.abs(got - fp32)) < 0.05 * np.max(np.abs(fp32))
    if precision.cpu_has_bf16():  # the hint took effect: not fp32's numbers
        assert not np.allclose(got, fp32, rtol=1e-5, atol=1e-5)
    assert abs(transfer.accuracy(got, yte) - transfer.accuracy(fp32, yte)) <= 0.01


def test_cpu_without_bf16_warns_and_runs_fp32(tuned, monkeypatch):
    net, _, xte, _ = tuned
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # a Zen 3's /proc/cpuinfo
    with pytest.warns(PrecisionWarning, match="no native bfloat16"):
        p = TFPredictor(net, backend="openvino", precision="bf16")
    assert p.precision == "fp32"
    np.testing.assert_allclose(p.predict(xte), net.forward(xte), rtol=1e-4, atol=1e-4)


def test_bf16_on_tensorflow_uses_the_onednn_rewrite(tuned, monkeypatch, bf16_kernels):
    """On every CPU: oneDNN's bf16 kernels, or TensorFlow's emulation of them (tests/bf16_kernels.py)."""
    net, _, xte, yte = tuned
    p = TFPredictor(net, precision="bf16")
    assert (p.backend, p.precision) == ("tensorflow", "bf16")
    got, fp32 = p.predict(xte), net.forward(xte)
    assert not np.allclose(got, fp32, rtol=1e-5, atol=1e-5)  # computed in bf16
    assert np.max(np.abs(got - fp32)) < 0.05 * np.max(np.abs(fp32))
    assert abs(transfer.accuracy(got, yte) - transfer.accuracy(fp32, yte)) <= 0.01
    np.testing.assert_array_equal(net.forward(xte), fp32)  # the rewrite stays inside the predictor
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    with pytest.warns(PrecisionWarning, match="oneDNN kernels are off"):
        assert TFPredictor(net, precision="bf16").precision == "fp32"


@pytest.mark.parametrize("kwargs, error, match", [
    ({"precision": "fp16", "backend": "openvino"}, PrecisionError, r"one of \['fp32', 'bf16', 'int8'\]"),
    ({"precision": "int8"}, PrecisionError, "pass backend='openvino'"),
    ({"precision": "int8", "backend": "openvino"}, CalibrationError, "needs calibration data"),
    ({"precision": "fp32", "calibration": np.zeros((4, 8, 8, 1))}, CalibrationError, "apply to precision='int8'"),
    ({"precision": "int8", "backend": "openvino", "calibration": np.zeros((0, 8, 8, 1), np.float32)},
     CalibrationError, "empty"),
    ({"precision": "int8", "backend": "openvino", "calibration": np.zeros((4, 8, 9, 1), np.float32)},
     CalibrationError, r"per-row shape \(8, 9, 1\).*expected per-row shape \(8, 8, 1\)"),
    ({"precision": "int8", "backend": "openvino", "calibration": [np.zeros((4, 8, 8, 1))] * 2},
     CalibrationError, "does not match the model's inputs"),
    ({"precision": "int8", "backend": "openvino", "calibration": np.zeros((4, 8, 8, 1)), "calibration_size": 0},
     CalibrationError, "positive integer"),
])
def test_bad_precision_and_calibration(tuned, kwargs, error, match):
    with pytest.raises(error, match=match) as info:
        TFPredictor(tuned[0], **kwargs)
    assert isinstance(info.value, (TFNetError)) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("missing", ["nncf", "openvino"])
def test_int8_without_nncf_or_openvino(tuned, monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    before = quantize.quantization_count()
    with pytest.raises(BackendUnavailableError, match=f"needs the `{missing}` package") as info:
        TFPredictor(tuned[0], backend="openvino", precision="int8", calibration=tuned[1])
    assert isinstance(info.value, ImportError)
    assert quantize.quantization_count() == before


def test_flat_calibration_rows_are_reshaped(tuned):
    net, xtr, xte, _ = tuned
    arrays = quantize.calibration_arrays(xtr.reshape(len(xtr), -1), net_inputs(net), size=50)
    assert len(arrays) == 1 and arrays[0].shape == (50, 8, 8, 1)
    np.testing.assert_array_equal(arrays[0], xtr[:50])


def test_load_without_a_saved_predictor(tmp_path):
    with pytest.raises(FileNotFoundError, match="No saved TFPredictor"):
        TFPredictor.load(tmp_path)


def net_inputs(net):
    from optim.predict.snapshot import ModelSnapshot

    return ModelSnapshot.from_net(net).inputs


def test_accuracy_controlled_int8(tuned):
    net, xtr, xte, yte = tuned
    p = TFPredictor(net, backend="openvino", precision="int8", calibration=xtr[:100], validation=(xte[:120], yte[:120]),
                    metric=lambda labels, outputs: transfer.accuracy(outputs, labels), max_drop=0.005)
    assert p.precision == "int8" and p.stats()["quantizations"] == 1
    assert transfer.accuracy(p.predict(xte), yte) >= transfer.accuracy(net.forward(xte), yte) - 0.005
    with pytest.raises(CalibrationError, match="needs `metric"):
        TFPredictor(net, backend="openvino", precision="int8", calibration=xtr[:20], validation=(xte, yte))
    with pytest.raises(CalibrationError, match="268 input rows but 3 labels"):
        TFPredictor(net, backend="openvino", precision="int8", calibration=xtr[:20], validation=(xte, yte[:3]),
                    metric=transfer.accuracy)
