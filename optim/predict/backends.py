"""The engines that run a model snapshot: TensorFlow (a TFNet) and OpenVINO (optional).

The driver calls :func:`make_payload` once: for ``backend="openvino"`` it converts the frozen graph
to OpenVINO's IR and compiles it once to check it, and falls back to TensorFlow with a
:class:`BackendFallbackWarning` naming the operations OpenVINO could not convert. Workers (and local
prediction) call :func:`build_engine` on the payload.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from optim.errors import BackendError, BackendFallbackWarning, BackendUnavailableError
from optim.predict.snapshot import ModelSnapshot, TensorInfo

__all__ = ["BACKENDS", "Payload", "make_payload", "build_engine", "check_backend", "unsupported_ops"]

BACKENDS = ("tensorflow", "openvino")

log = logging.getLogger("tfnet.predict")


@dataclass(frozen=True)
class Payload:
    """What the broadcast carries: one model in the form its backend runs.

    Attributes:
        model_id: The snapshot's checksum, plus the backend.
        backend: ``"tensorflow"`` or ``"openvino"`` (after any fallback).
        inputs: Input descriptions, in graph order.
        outputs: Output descriptions, in graph order.
        model: The serialized frozen GraphDef (TensorFlow), or ``(xml, weights)`` of OpenVINO IR.
        num_threads: Threads per worker for the engine; None leaves the library default.
        precision: ``"fp32"``, ``"bf16"`` (OpenVINO's inference precision hint) or ``"int8"`` (the
            model is NNCF-quantised IR). Default ``"fp32"``.
    """

    model_id: str
    backend: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    model: bytes | tuple[bytes, bytes]
    num_threads: int | None
    precision: str = "fp32"


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise BackendError(f"`backend` must be one of {list(BACKENDS)}. Received: backend={backend!r}")
    return backend


def make_payload(snapshot: ModelSnapshot, backend: str, num_threads: int | None = None, precision: str = "fp32",
                 int8: Callable[[tuple[bytes, bytes]], tuple[tuple[bytes, bytes], str]] | None = None) -> Payload:
    """Prepares ``snapshot`` for ``backend`` on the driver.

    ``precision="int8"`` calls ``int8(ir) -> (quantised ir, calibration tag)`` once, on the fp32 IR
    (see :mod:`optim.predict.quantize`). ``precision="bf16"``: OpenVINO's precision hint, or
    TensorFlow's oneDNN bf16 rewrite.

    Raises:
        BackendError: an unknown backend.
        BackendUnavailableError: ``backend="openvino"`` and the ``openvino`` package is missing.

    Warns:
        BackendFallbackWarning: OpenVINO could not convert or compile the graph; the payload
            runs TensorFlow instead.
    """
    check_backend(backend)
    if backend == "openvino":
        try:
            ir = to_openvino_ir(snapshot)
        except _ConversionFailed as exc:
            ops = ", ".join(exc.ops) if exc.ops else "unknown (see the message)"
            warnings.warn(
                f"OpenVINO could not convert this graph; unsupported operation(s): {ops}. Falling "
                f"back to the TensorFlow backend. OpenVINO said: {exc.summary}",
                BackendFallbackWarning,
                stacklevel=3,
            )
        else:
            model_id = snapshot.model_id + "-ov"
            if precision == "int8":
                ir, tag = int8(ir)
                model_id += f"-int8-{tag}"
            elif precision == "bf16":
                model_id += "-bf16"
            return Payload(model_id, "openvino", snapshot.inputs, snapshot.outputs, ir, num_threads, precision)
    tf_precision = "bf16" if precision == "bf16" else "fp32"  # int8 after a fallback: fp32
    return Payload(snapshot.model_id + "-tf" + ("-bf16" if tf_precision == "bf16" else ""), "tensorflow",
                   snapshot.inputs, snapshot.outputs, snapshot.graph, num_threads, tf_precision)


class _ConversionFailed(Exception):
    def __init__(self, ops: list[str], summary: str):
        super().__init__(summary)
        self.ops, self.summary = ops, summary


def import_openvino():
    try:
        import openvino
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend='openvino' needs the `openvino` package, which is not installed ({exc}). "
            "Install it with `pip install tfnet[openvino]` (or `pip install openvino`), or use "
            "backend='tensorflow'."
        ) from None
    return openvino


def to_openvino_ir(snapshot: ModelSnapshot) -> tuple[bytes, bytes]:
    """Converts the frozen graph to OpenVINO IR (xml, weights), fp32, and compiles it once.

    Raises:
        _ConversionFailed: OpenVINO cannot convert or compile the graph.
    """
    ov = import_openvino()
    string_io = [t.name for t in snapshot.inputs + snapshot.outputs if t.dtype == "string"]
    if string_io:
        raise _ConversionFailed([], f"string inputs or outputs {string_io} are not supported by this backend")
    try:
        model = ov.convert_model(snapshot.graph_def(), input=snapshot.input_names, output=snapshot.output_names)
        ov.Core().compile_model(model, "CPU", _ov_config(None))
    except Exception as exc:  # OpenVINO raises its own OpConversionFailure / RuntimeError types
        message = str(exc)
        raise _ConversionFailed(unsupported_ops(message), _summary(message)) from None
    return ir_bytes(ov, model)


def ir_bytes(ov, model) -> tuple[bytes, bytes]:
    """An OpenVINO model as its IR, ``(model.xml, model.bin)`` bytes (no fp16 compression), written
    through a temporary folder that is removed."""
    folder = tempfile.mkdtemp(prefix="tfnet-ov-")
    try:
        path = os.path.join(folder, "model.xml")
        ov.save_model(model, path, compress_to_fp16=False)
        with open(path, "rb") as f:
            xml = f.read()
        with open(os.path.join(folder, "model.bin"), "rb") as f:
            weights = f.read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return xml, weights


_NO_RULE = re.compile(r"No conversion rule found for operations:\s*([^\n]+)")
_FAILED_OP = re.compile(r"^--\s*(\w+) with a message", re.MULTILINE)
_NO_TRANSLATOR = re.compile(r"No translator found for (\w+) node")


def unsupported_ops(message: str) -> list[str]:
    """The operation types an OpenVINO conversion error names, in order, without repeats.

    >>> unsupported_ops("-- No conversion rule found for operations: Lgamma, Erfinv\\nTo ...")
    ['Lgamma', 'Erfinv']
    """
    ops: list[str] = []
    for match in _NO_RULE.finditer(message):
        ops += [o.strip() for o in match.group(1).split(",") if o.strip()]
    ops += _FAILED_OP.findall(message) + _NO_TRANSLATOR.findall(message)
    return list(dict.fromkeys(ops))


def _summary(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not ln.startswith("Check '")]
    keep = [ln for ln in lines if "conversion rule" in ln or ln.startswith("--")] or lines[:2]
    return " ".join(keep)[:500]


def _ov_config(num_threads: int | None, precision: str = "fp32") -> dict:
    # int8: the quantised operations run in int8 (VNNI), the rest in f32
    config = {"INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32", "PERFORMANCE_HINT": "LATENCY",
              "NUM_STREAMS": 1}
    if num_threads:
        # Several worker processes share the machine: pinning could put them on the same cores.
        config.update({"INFERENCE_NUM_THREADS": int(num_threads), "ENABLE_CPU_PINNING": False})
    return config


class TFEngine:
    """Runs the frozen graph with TensorFlow, through a TFNet (batch norm folded); with
    ``precision="bf16"`` under oneDNN's bf16 auto-mixed-precision rewrite (:mod:`tfnet.precision`)."""

    backend = "tensorflow"

    def __init__(self, payload: Payload):
        from tfnet import TFNet

        self.net = TFNet.from_frozen_graph(payload.model, [t.name for t in payload.inputs],
                                           [t.name for t in payload.outputs])
        self.bf16 = payload.precision == "bf16"

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        from tfnet.precision import bf16_rewrite

        with bf16_rewrite(self.bf16):
            outs = self.net.forward(list(arrays))
        return list(outs) if isinstance(outs, list) else [outs]


class OVEngine:
    """Runs OpenVINO IR on the CPU (fp32, bf16 by the precision hint, or quantised int8), with one
    reused infer request. A float input fed narrow integers (uint8 pixels: ``tfnet.inputs.NARROW_DTYPES``)
    takes them as they are: the model is compiled (once per such set of dtypes) with OpenVINO's own
    pre-processing step that converts them inside the model, as TensorFlow's graph casts them."""

    backend = "openvino"

    def __init__(self, payload: Payload):
        self._ov = import_openvino()
        xml, weights = payload.model
        self._core = self._ov.Core()
        self._model = self._core.read_model(model=xml, weights=self._ov.Tensor(np.frombuffer(weights, np.uint8)))
        self._config = _ov_config(payload.num_threads, payload.precision)
        self._names = [t.name for t in payload.inputs]
        self._out_names = [t.name for t in payload.outputs]
        self._dtypes = [np.dtype(t.dtype) for t in payload.inputs]
        self._compiled: dict = {}  # compiled at the first call, for the dtypes it brings

    def _compile(self, dtypes: tuple) -> tuple:
        found = self._compiled.get(dtypes)
        if found is None:
            model = self._model
            if dtypes != tuple(self._dtypes):
                model = model.clone()  # the pre-processing step changes the model it is built on
                ppp = self._ov.preprocess.PrePostProcessor(model)
                for name, got, want in zip(self._names, dtypes, self._dtypes):
                    if got != want:
                        ppp.input(name).tensor().set_element_type(self._ov.Type(got))
                        ppp.input(name).preprocess().convert_element_type(self._ov.Type(want))
                model = ppp.build()
            compiled = self._core.compile_model(model, "CPU", self._config)
            found = (compiled, [compiled.input(n) for n in self._names], [compiled.output(n) for n in self._out_names],
                     compiled.create_infer_request())
            self._compiled[dtypes] = found
        return found

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        from tfnet.inputs import taken_as_is

        dtypes = tuple(a.dtype if taken_as_is(d, a.dtype) else d for a, d in zip(arrays, self._dtypes))
        _, inputs, outputs, request = self._compile(dtypes)
        request.infer({port: np.ascontiguousarray(a, dtype=d) for port, a, d in zip(inputs, arrays, dtypes)})
        return [request.get_tensor(port).data.copy() for port in outputs]


def set_tf_threads(num_threads: int | None) -> bool:
    """Sets TensorFlow's thread pools in this (worker) process, once, before any op runs.
    Returns False when TensorFlow had already started with other settings (they then stay)."""
    if not num_threads:
        return True
    from tfnet.config import set_num_threads

    return set_num_threads(int(num_threads), int(num_threads), strict=False)


_NOT_APPLIED: set = set()  # the num_threads a reused worker could not apply, said once each


def build_engine(payload: Payload, set_threads: bool = True):
    """An engine for ``payload``. ``set_threads`` applies ``payload.num_threads`` to TensorFlow's
    process-wide pools (workers do; the driver, which belongs to the user, does not)."""
    if payload.backend == "openvino":
        return OVEngine(payload)
    if set_threads and not set_tf_threads(payload.num_threads) and payload.num_threads not in _NOT_APPLIED:
        # a reused Python worker (it trained before, or ran another model): its pools stay as they are. Said once per
        # process at DEBUG, not warned per task into the user's console (its progress bar)
        _NOT_APPLIED.add(payload.num_threads)
        log.debug("TensorFlow was already running in this worker, so num_threads=%s could not be applied; its thread "
                  "pools stay as they were.", payload.num_threads)
    return TFEngine(payload)
