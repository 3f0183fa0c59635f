"""Lower-precision inference on the driver: the calibration sample and NNCF's post-training INT8
quantisation of an OpenVINO model. Runs once per :class:`TFPredictor`, before anything ships; the
workers receive the quantised IR and never import NNCF.

Calibration data is numpy (one array, a list in input order or a dict by input name) or a Spark
DataFrame, sampled here on the driver (``calibration_size`` rows, 300 by default).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from optim.errors import BackendError, BackendUnavailableError, CalibrationError
from optim.predict.snapshot import ModelSnapshot, TensorInfo
from tfnet import precision as _precision
from tfnet.precision import PRECISIONS, PrecisionError, PrecisionWarning

__all__ = ["check_precision", "calibration_arrays", "effective_precision", "fingerprint", "import_nncf", "quantize_ir",
           "quantization_count"]

log = logging.getLogger("tfnet.predict.quantize")

_QUANTIZATIONS = {"count": 0}


def quantization_count() -> int:
    """How many models this process has quantised with NNCF (tests check "once")."""
    return _QUANTIZATIONS["count"]


def check_precision(precision: str, backend: str) -> str:
    """Raises :class:`PrecisionError` for an unknown precision, or ``"int8"`` without OpenVINO."""
    if precision not in PRECISIONS + ("int8",):
        raise PrecisionError(
            f"`precision` must be one of {list(PRECISIONS + ('int8',))}. Received: precision={precision!r}")
    if precision == "int8" and backend != "openvino":
        raise PrecisionError(
            f"precision='int8' runs on OpenVINO (NNCF quantisation); pass backend='openvino'. Received: "
            f"backend={backend!r}")
    return precision


def effective_precision(precision: str, backend: str = "openvino") -> str:
    """``precision``, or ``"fp32"`` with a :class:`PrecisionWarning` for bf16 on a CPU without native
    bfloat16 (or, for the TensorFlow backend, with oneDNN off)."""
    if precision != "bf16":
        return precision
    missing = _precision.bf16_missing()
    if missing is None and backend == "tensorflow" and not _precision.onednn_enabled():
        missing = "TensorFlow's oneDNN kernels are off (TF_ENABLE_ONEDNN_OPTS=0)"
    if missing is None:
        return "bf16"
    import warnings

    warnings.warn(f"precision='bf16' was asked for, but {missing}; running in fp32.", PrecisionWarning,
                  stacklevel=3)
    return "fp32"


# ---------------------------------------------------------------------------- calibration data


def calibration_arrays(calibration, inputs: Sequence[TensorInfo], size: int = 300,
                       columns=None, seed: int = 0) -> list[np.ndarray]:
    """The calibration sample as one array per input, each ``(rows, *row_shape)``, at most ``size``
    rows.

    Args:
        calibration: Numpy (one array, a list in input order or a dict by input name), or a Spark
            DataFrame (sampled on the driver).
        inputs: The model's inputs.
        size: Rows to use. Default 300.
        columns: DataFrames only: the column per input, as ``TFPredictor.predict``'s
            ``feature_cols``. Default: the columns named like the inputs.
        seed: The DataFrame sample's seed. Default 0.

    Raises:
        CalibrationError: no rows, inputs of the wrong number, shape or dtype.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise CalibrationError(f"`calibration_size` must be a positive integer. Received: {size!r}")
    if calibration is None:
        raise CalibrationError("precision='int8' needs calibration data: pass calibration= (numpy arrays, or a "
                               f"DataFrame with a column per input {[t.name for t in inputs]}).")
    if _is_dataframe(calibration):
        arrays = _sample_dataframe(calibration, inputs, size, columns, seed)
    else:
        if columns is not None:
            raise CalibrationError("`calibration_cols` applies to a DataFrame; numpy calibration data is given "
                                   "in input order, or as a dict by input name.")
        arrays = _numpy_inputs(calibration, inputs)
    arrays = [_check_array(a, t) for a, t in zip(arrays, inputs)]
    rows = {len(a) for a in arrays}
    if len(rows) != 1:
        raise CalibrationError(f"The calibration inputs have different numbers of rows: {sorted(rows)}.")
    if rows == {0}:
        raise CalibrationError("The calibration data is empty (0 rows); INT8 quantisation needs a sample of "
                               "typical inputs (300 rows by default).")
    return [a[:size] for a in arrays]


def _is_dataframe(value) -> bool:
    return type(value).__name__ == "DataFrame" and hasattr(value, "schema") and hasattr(value, "sparkSession")


def _numpy_inputs(calibration, inputs) -> list[np.ndarray]:
    from tfnet.inputs import arrange

    try:
        values = arrange(calibration, [t.name for t in inputs])
    except (ValueError, TypeError) as exc:
        raise CalibrationError(f"Calibration data does not match the model's inputs: {exc}") from None
    return [np.asarray(v) for v in values]


def _check_array(array: np.ndarray, info: TensorInfo) -> np.ndarray:
    if array.dtype.kind not in "fiub":
        raise CalibrationError(f"Calibration data for input {info.name!r} must be numeric; received dtype "
                               f"{array.dtype}.")
    shape = tuple(info.row_shape or ())
    if array.ndim == 0:
        raise CalibrationError(f"Calibration data for input {info.name!r} must have a batch dimension; "
                               "received a scalar.")
    row = array.shape[1:]
    fits = info.row_shape is None or (len(row) == len(shape) and all(d is None or d == r for d, r in zip(shape, row)))
    if not fits:
        size = int(np.prod(row)) if row else 1
        if None not in shape and size == int(np.prod(shape)) and len(array):
            array = array.reshape((len(array),) + shape)
        else:
            raise CalibrationError(
                f"Calibration data for input {info.describe()} has per-row shape {tuple(row)} "
                f"(array shape {array.shape}); expected per-row shape {shape}.")
    return np.ascontiguousarray(array, dtype=np.dtype(info.dtype))


def _sample_dataframe(df, inputs, size: int, columns, seed: int) -> list[np.ndarray]:
    from optim.arrow import read_column
    from optim.predict.columns import plan_columns

    plan = plan_columns(df.schema, inputs, (), columns, None, None)
    names = [spec.column for spec in plan.inputs]
    total = df.count()
    if total == 0:
        raise CalibrationError("The calibration DataFrame is empty (0 rows); INT8 quantisation needs a sample "
                               "of typical inputs.")
    picked = df.select(*names)
    if total > size:
        # a little more than needed, then cut: sample() returns about fraction * total rows
        picked = picked.sample(False, min(1.0, 1.5 * size / total), seed).limit(size)
    table = picked.toArrow()
    arrays = []
    for spec in plan.inputs:
        values, bad = read_column(table.column(spec.column), spec.reading, column=spec.column)
        if bad and len(bad) == len(values):
            first = min(bad)
            raise CalibrationError(f"No sampled row of calibration column {spec.column!r} fits input "
                                   f"{spec.input.describe()}: row {first}: {bad[first].text}.")
        if bad:
            keep = np.ones(len(values), bool)
            keep[list(bad)] = False
            log.info("Calibration: %d bad row(s) in column %r left out.", len(bad), spec.column)
            values = values[keep]
        arrays.append(values)
    log.info("Calibration: %d of %d DataFrame rows sampled on the driver.", len(arrays[0]) if arrays else 0, total)
    return arrays


def fingerprint(arrays: Sequence[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(str(a.shape).encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()[:12]


# ---------------------------------------------------------------------------- quantisation


def import_nncf():
    try:
        import nncf
    except ImportError as exc:
        raise BackendUnavailableError(
            f"precision='int8' needs the `nncf` package (OpenVINO's post-training quantisation), which is not "
            f"installed ({exc}). Install it with `pip install tfnet[quantize]` (or `pip install nncf`), or use "
            "precision='fp32' or 'bf16'."
        ) from None
    return nncf


def quantize_ir(ir: tuple[bytes, bytes], snapshot: ModelSnapshot, arrays: Sequence[np.ndarray], *,
                validation: tuple | None = None, metric: Callable | None = None,
                max_drop: float = 0.01) -> tuple[bytes, bytes]:
    """INT8-quantises OpenVINO IR with NNCF from the calibration ``arrays`` (one row per
    calibration item). With ``validation=(inputs, labels)`` and ``metric(labels, outputs) ->
    float`` (higher is better), NNCF's accuracy-controlled mode keeps the metric within
    ``max_drop`` of fp32 by reverting the most harmful layers to fp32.

    Raises:
        BackendUnavailableError: NNCF or OpenVINO is missing.
        BackendError: NNCF failed on this model.
    """
    nncf = import_nncf()
    from optim.predict.backends import import_openvino, ir_bytes

    ov = import_openvino()
    xml, weights = ir
    model = ov.Core().read_model(model=xml, weights=ov.Tensor(np.frombuffer(weights, np.uint8)))
    n = len(arrays[0])
    items = [[a[i:i + 1] for a in arrays] for i in range(n)]
    dataset = nncf.Dataset(items)
    t0 = time.perf_counter()
    progress = io.StringIO()  # NNCF draws progress bars on stdout; a library does not print
    try:
        with contextlib.redirect_stdout(progress):
            if validation is not None:
                quantized = _with_accuracy_control(nncf, model, dataset, snapshot, validation, metric, max_drop, n)
            else:
                quantized = nncf.quantize(model, dataset, subset_size=n)
    except (BackendUnavailableError, CalibrationError):
        raise
    except Exception as exc:  # NNCF and OpenVINO raise their own types
        raise BackendError(f"NNCF could not quantise this model: {type(exc).__name__}: {str(exc)[:500]}") from None
    finally:
        log.debug("NNCF: %s", progress.getvalue().strip())
    _QUANTIZATIONS["count"] += 1
    log.info("INT8 quantisation with %d calibration rows took %.1f s.", n, time.perf_counter() - t0)
    return ir_bytes(ov, quantized)


def _with_accuracy_control(nncf, model, dataset, snapshot, validation, metric, max_drop, n):
    if metric is None or not callable(metric):
        raise CalibrationError("Accuracy-controlled quantisation needs `metric(labels, outputs) -> float` "
                               f"(higher is better). Received: metric={metric!r}")
    try:
        inputs, labels = validation
    except (TypeError, ValueError):
        raise CalibrationError("`validation` must be a pair (inputs, labels).") from None
    arrays = calibration_arrays(inputs, snapshot.inputs, size=10**9)
    labels = np.asarray(labels)
    if len(labels) != len(arrays[0]):
        raise CalibrationError(f"`validation` has {len(arrays[0])} input rows but {len(labels)} labels.")
    items = [([a[i:i + 1] for a in arrays], labels[i]) for i in range(len(labels))]

    def validate(compiled, data) -> float:
        outs, ys = [], []
        for feed, y in data:
            outs.append(compiled(feed)[0])
            ys.append(y)
        return float(metric(np.stack(ys), np.concatenate(outs)))

    return nncf.quantize_with_accuracy_control(
        model, dataset, nncf.Dataset(items, lambda item: item[0]), validation_fn=validate, max_drop=max_drop,
        subset_size=n)
