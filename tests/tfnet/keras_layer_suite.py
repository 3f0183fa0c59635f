"""Keras's own layer tests, replayed through ``TFNet.from_keras`` (issue 51).

The keras wheel ships its layer tests (``keras/src/layers/**/*_test.py``), each built on
``keras.src.testing.TestCase.run_layer_test(layer_cls, init_kwargs, input_shape=..., ...)``. :func:`collect_calls`
runs every test method whose source calls ``run_layer_test`` with that method replaced by a recorder, so the calls'
configurations (the layer, its arguments, the input's shape and dtype) are Keras's own table. :func:`replay` wraps
each layer with one float input in a Functional model, loads it with ``TFNet.from_keras``, and compares with Keras:
the forward pass (1e-4 relative), the input gradient and one SGD step's update (1e-3 relative; 2e-2 for a layer that
computes in bfloat16 or float16), and the trainable set
(Keras's ``trainable_variables``). Each call gets a verdict: ``equal``, ``differs``, ``error`` or ``n/a`` (with the
reason: several inputs, sparse or ragged input, call arguments, an integer input, several outputs)."""

from __future__ import annotations

import glob
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field

import numpy as np

VERDICTS = ("equal", "differs", "error", "n/a")
FORWARD_RTOL, GRADIENT_RTOL, LR = 1e-4, 1e-3, 0.1
HALF_RTOL = 2e-2  # a layer computing in bfloat16 (8 bits of mantissa): a few roundings of 2 ** -8


@dataclass
class Call:
    """One ``run_layer_test`` call as Keras's test made it."""

    test: str  # "core/dense_test.py::DenseTest::test_dense_basics"
    index: int  # its place among that test's calls
    layer_cls: type
    init_kwargs: dict
    kwargs: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.test}#{self.index}"


@dataclass
class Verdict:
    name: str
    layer: str
    outcome: str
    reason: str = ""


def keras_layers_dir() -> str:
    import keras

    return os.path.join(os.path.dirname(keras.__file__), "src", "layers")


def _import(path: str, root: str):
    name = "keras_layer_suite_" + os.path.relpath(path, root).replace(os.sep, "_")[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _calls_run_layer_test(method) -> bool:
    try:
        return "run_layer_test" in inspect.getsource(inspect.unwrap(method))
    except (OSError, TypeError):
        return False


def collect_calls(root: str | None = None, unimported: dict | None = None) -> list[Call]:
    """Every ``run_layer_test`` call of the layer tests under ``root`` (default: the installed keras's); a test file
    that cannot be imported here goes into ``unimported`` (its path: the error)."""
    unimported = {} if unimported is None else unimported
    from _pytest.outcomes import OutcomeException  # pytest.skip in a test: a BaseException
    from keras.src.testing import TestCase

    root = root or keras_layers_dir()
    calls: list[Call] = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*_test.py"), recursive=True)):
        with open(path) as f:
            if "run_layer_test" not in f.read():
                continue
        rel = os.path.relpath(path, root)
        try:
            module = _import(path, root)
        except ImportError as exc:  # a test file of an optional backend's package (grain, jax) that is not here
            unimported[rel] = f"{type(exc).__name__}: {exc}"
            continue
        for cls_name, cls in sorted(vars(module).items()):
            if not (isinstance(cls, type) and issubclass(cls, TestCase)) or cls.__module__ != module.__name__:
                continue
            for method_name in sorted(n for n in dir(cls) if n.startswith("test")):
                if not _calls_run_layer_test(getattr(cls, method_name)):
                    continue
                test = f"{rel}::{cls_name}::{method_name}"
                found: list[Call] = []

                def record(layer_cls, init_kwargs, _test=test, _found=found, **kwargs):
                    _found.append(Call(_test, len(_found), layer_cls, dict(init_kwargs), kwargs))

                case = cls(method_name)
                case.run_layer_test = record
                try:
                    case.setUp()
                    getattr(case, method_name)()
                except (Exception, OutcomeException):  # noqa: BLE001 - what the test checks after its calls, its skips
                    pass
                calls.extend(found)
    return calls


def _not_applicable(call: Call) -> str | None:
    kw = call.kwargs
    if kw.get("input_sparse") or kw.get("input_ragged"):
        return "sparse or ragged input"
    if kw.get("call_kwargs"):
        return "call arguments"
    shape = kw.get("input_shape")
    if shape is None and kw.get("input_data") is not None:
        data = kw["input_data"]
        shape = getattr(data, "shape", None) if not isinstance(data, (list, tuple, dict)) else None
        if shape is None:
            return "several inputs"
    if shape is None or isinstance(shape, dict) or (isinstance(shape, (list, tuple)) and shape and
                                                  isinstance(shape[0], (list, tuple))):
        return "several inputs"
    dtype = kw.get("input_dtype") or "float32"
    if not str(dtype).startswith("float"):
        return f"{dtype} input"
    return None


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(_dense(want), np.float64)
    if got.shape != want.shape:
        return float("inf")
    if not want.size:
        return 0.0
    scale = np.abs(want).max()
    return float(np.abs(got - want).max() / scale) if scale > 0 else float(np.abs(got).max())


def _dense(value):
    """A gradient as an array (an embedding's comes as ``IndexedSlices``)."""
    import tensorflow as tf

    return tf.convert_to_tensor(value).numpy() if isinstance(value, tf.IndexedSlices) else value


def replay(call: Call, seed: int = 0) -> Verdict:
    """``call``'s layer through Keras and through tfnet, compared; never raises."""
    import keras
    import tensorflow as tf

    from tfnet import TFNet

    layer_name = call.layer_cls.__name__
    why = _not_applicable(call)
    if why:
        return Verdict(call.name, layer_name, "n/a", why)
    kw = call.kwargs
    shape = tuple(kw["input_shape"]) if kw.get("input_shape") is not None else tuple(kw["input_data"].shape)
    try:
        keras.utils.set_random_seed(seed)
        layer = call.layer_cls(**call.init_kwargs)
        inputs = keras.Input(shape[1:], batch_size=None)
        outputs = layer(inputs)
        if not isinstance(outputs, keras.KerasTensor):
            return Verdict(call.name, layer_name, "n/a", "several outputs")
        expected = kw.get("expected_output_shape")
        if isinstance(expected, tuple) and expected and (len(expected) != len(outputs.shape) or expected[0] != shape[0]):
            return Verdict(call.name, layer_name, "n/a", "the test's input has no batch dimension")
        model = keras.Model(inputs, outputs)
    except Exception as exc:  # noqa: BLE001 - Keras's own refusal of the configuration outside its test
        return Verdict(call.name, layer_name, "n/a", f"Keras builds no Functional model: {type(exc).__name__}")
    rng = np.random.default_rng(seed)
    x = (np.asarray(kw["input_data"], np.float32) if kw.get("input_data") is not None
         else rng.standard_normal(shape).astype(np.float32))
    try:
        xv = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xv)
            want_y = model(xv, training=False)
        g = rng.standard_normal(tuple(want_y.shape)).astype(np.float32)
        # one backward pass for the input and the weights (two calls of a persistent tape ran it twice)
        want_x, *want_w = tape.gradient(want_y, [xv, *model.trainable_variables], output_gradients=tf.constant(g))
        # a variable this call does not use (a ReversibleEmbedding's reverse weights) is not in the frozen graph
        used = [(v.path, w) for v, w in zip(model.trainable_variables, want_w) if w is not None]
        want_trainable = [p for p, _ in used]
    except Exception as exc:  # noqa: BLE001
        return Verdict(call.name, layer_name, "n/a", f"Keras's own gradient fails: {type(exc).__name__}")
    try:
        net = TFNet.from_keras(model)
        got_y = net.forward(x)
        if sorted(net.trainable) != sorted(want_trainable):
            return Verdict(call.name, layer_name, "differs", f"trainable {sorted(net.trainable)} != {want_trainable}")
        grad_x, grad_w = net.backward(x, g)
    except Exception as exc:  # noqa: BLE001 - the verdict says what failed
        return Verdict(call.name, layer_name, "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                       if str(exc).strip() else type(exc).__name__)
    errors = {"forward": _rel(got_y, want_y)}
    if want_x is not None:
        errors["input gradient"] = _rel(grad_x, want_x)
    for path, want in used:  # one SGD step's update of each weight
        errors[f"step {path}"] = _rel(-LR * grad_w[path], -LR * np.asarray(_dense(want)))
    # a layer that computes in 16 bits (a "mixed_bfloat16" or "int8_from_mixed_bfloat16" policy): a few of its roundings
    low = str(getattr(layer, "compute_dtype", "float32")) in ("bfloat16", "float16")
    forward_rtol, gradient_rtol = (HALF_RTOL, HALF_RTOL) if low else (FORWARD_RTOL, GRADIENT_RTOL)
    worst = {k: v for k, v in errors.items()
             if v > (forward_rtol if k == "forward" else gradient_rtol) or not np.isfinite(v)}
    if worst:
        return Verdict(call.name, layer_name, "differs", ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
    return Verdict(call.name, layer_name, "equal")


def replay_all(calls: list[Call]) -> list[Verdict]:
    out = []
    for call in calls:
        try:
            out.append(replay(call))
        except Exception:  # noqa: BLE001 - a bug in the harness itself is an error verdict, not a crash
            out.append(Verdict(call.name, call.layer_cls.__name__, "error", traceback.format_exc().splitlines()[-1]))
    return out


def _replay_share(share: int, shares: int) -> list[tuple]:
    """In a fresh process: collect the calls, replay every ``shares``-th from ``share``."""
    calls = collect_calls()
    return [(v.name, v.layer, v.outcome, v.reason) for v in replay_all(calls[share::shares])]


def run_suite(processes: int = 2) -> list[Verdict]:
    """Every call's verdict, the calls shared among ``processes`` fresh processes (TensorFlow does not fork)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = list(pool.map(_replay_share, range(processes), [processes] * processes))
    return sorted((Verdict(*row) for part in parts for row in part), key=lambda v: v.name)
