"""Keras's own layer tests, replayed through ``TFNet.from_keras`` (issue 51).

The keras wheel ships its layer tests (``keras/src/layers/**/*_test.py``), each built on
``keras.src.testing.TestCase.run_layer_test(layer_cls, init_kwargs, input_shape=..., ...)``. :func:`collect_calls`
runs every test method whose source calls ``run_layer_test`` with that method replaced by a recorder, so the calls'
configurations (the layer, its arguments, the input's shape and dtype) are Keras's own table. :func:`replay` wraps
each layer in a Functional model (one input or several, float or integer; a subclassed model on an
``input_signature`` where Keras builds no Functional model or the call passes ``training=False``), loads it with
``TFNet.from_keras``, and
compares with Keras: the forward pass (1e-4 relative), each float input's gradient and one SGD step's update (1e-3
relative; 2e-2 for a layer that computes in bfloat16 or float16), and the trainable set (Keras's
``trainable_variables``); where the layer has weight regularizers or its test counts losses, those too
(:func:`_losses_differ`). Each call gets a verdict: ``equal``, ``differs``, ``error`` or ``n/a`` (with the
reason: inputs given as data in several parts, sparse or ragged input, ``training=True``, several outputs, layer
arguments Keras refuses)."""

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


def _is_shape(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(d, (int, type(None))) for d in value)


def _inputs_of(call: Call) -> tuple[list[tuple[str | None, tuple, str]], bool] | str:
    """``([(keyword or None, shape, dtype), ...], several)``: the call's inputs as Keras's test makes them (one shape; a
    list or tuple of shapes, passed as one list; a dict of ``<name>_shape``, passed by keyword), or why they cannot be
    replayed."""
    kw = call.kwargs
    if kw.get("input_sparse") or kw.get("input_ragged"):
        return "sparse or ragged input"
    if kw.get("call_kwargs") and kw["call_kwargs"] != {"training": False}:
        return "call arguments"  # training=True: a frozen graph is the model in inference mode
    shape, dtype = kw.get("input_shape"), kw.get("input_dtype")
    if shape is None:
        data = kw.get("input_data")
        if isinstance(data, (list, tuple, dict)) or getattr(data, "shape", None) is None:
            return "several inputs given as data"
        shape, dtype = tuple(data.shape), "float32" if data.dtype.kind == "f" else str(data.dtype)
    if _is_shape(shape):
        specs, several = [(None, tuple(shape), dtype)], False
    elif isinstance(shape, dict) and all(_is_shape(v) for v in shape.values()):
        specs = [(k.removesuffix("_shape"), tuple(v), dtype[k] if isinstance(dtype, dict) else dtype)
                 for k, v in shape.items()]
        several = True
    elif isinstance(shape, (list, tuple)) and all(_is_shape(v) for v in shape):
        specs = [(None, tuple(v), dtype[i] if isinstance(dtype, (list, tuple)) else dtype) for i, v in enumerate(shape)]
        several = True
    else:
        return "nested inputs"
    specs = [(name, s, str(d or "float32")) for name, s, d in specs]
    odd = [d for _, _, d in specs if not d.startswith(("float", "int", "uint"))]
    return f"{odd[0]} input" if odd else (specs, several)


def _rel(got, want, scale: float | None = None) -> float:
    """The largest difference relative to ``want``'s largest value (or to ``scale``)."""
    got, want = np.asarray(got, np.float64), np.asarray(_dense(want), np.float64)
    if got.shape != want.shape:
        return float("inf")
    if not want.size:
        return 0.0
    scale = np.abs(want).max() if scale is None else scale
    return float(np.abs(got - want).max() / scale) if scale > 0 else float(np.abs(got).max())


def _dense(value):
    """A gradient as an array (an embedding's comes as ``IndexedSlices``)."""
    import tensorflow as tf

    return tf.convert_to_tensor(value).numpy() if isinstance(value, tf.IndexedSlices) else value


def _subclassed(layer, specs, several: bool, call_kwargs: dict):
    """``layer`` in a subclassed model (as Keras's guide writes one), called with the test's ``call_kwargs``: where
    Keras builds no Functional model of it (an ``Equalization`` is "part of a cycle" there) or the call takes
    arguments. Its inputs are positional, one per spec; frozen on an ``input_signature``."""
    import keras

    names = [name for name, _, _ in specs]

    class Wrapper(keras.Model):
        def __init__(self):
            super().__init__(name="wrapper")
            self.inner = layer

        def call(self, *xs):
            if names[0] is not None:
                return self.inner(**dict(zip(names, xs)), **call_kwargs)
            return self.inner(list(xs) if several else xs[0], **call_kwargs)

    return Wrapper()


def replay(call: Call, seed: int = 0) -> Verdict:
    """``call``'s layer through Keras and through tfnet, compared; never raises."""
    import keras
    import tensorflow as tf

    from tfnet import TFNet

    layer_name = call.layer_cls.__name__
    found = _inputs_of(call)
    if isinstance(found, str):
        return Verdict(call.name, layer_name, "n/a", found)
    specs, several = found
    call_kwargs = call.kwargs.get("call_kwargs") or {}
    signature = None  # a subclassed wrapper's: TFNet.from_keras's input_signature
    try:
        keras.utils.set_random_seed(seed)
        layer = call.layer_cls(**call.init_kwargs)
    except Exception as exc:  # noqa: BLE001 - Keras's own refusal of the configuration (a test of invalid usage)
        return Verdict(call.name, layer_name, "n/a", f"Keras refuses the layer's arguments: {type(exc).__name__}")
    model = None
    if not call_kwargs:  # only a subclassed model passes the call's own arguments
        try:
            inputs = [keras.Input(shape[1:], batch_size=None, dtype=dtype) for _, shape, dtype in specs]
            if specs[0][0] is not None:  # by keyword (query=..., value=...)
                outputs = layer(**{name: t for (name, _, _), t in zip(specs, inputs)})
            else:
                outputs = layer(inputs if several else inputs[0])
            if not isinstance(outputs, keras.KerasTensor):
                return Verdict(call.name, layer_name, "n/a", "several outputs")
            expected = call.kwargs.get("expected_output_shape")
            if isinstance(expected, tuple) and expected and (len(expected) != len(outputs.shape) or
                                                             expected[0] != specs[0][1][0]):
                return Verdict(call.name, layer_name, "n/a", "the test's input has no batch dimension")
            model = keras.Model(inputs if several else inputs[0], outputs)
        except Exception:  # noqa: BLE001 - Keras builds no Functional model of the layer (Equalization's "cycle")
            model = None
    if model is None:  # a subclassed model, frozen on an input_signature
        keras.utils.set_random_seed(seed)
        model = _subclassed(call.layer_cls(**call.init_kwargs), specs, several, call_kwargs)
        signature = [tf.TensorSpec((None, *shape[1:]), dtype) for _, shape, dtype in specs]
    rng = np.random.default_rng(seed)
    data = call.kwargs.get("input_data")
    # floats normal; integers in [0, 3), as Keras's own test draws them (an Embedding's ids)
    xs = [np.asarray(data, dtype) if data is not None else rng.standard_normal(shape).astype(dtype)
          if dtype.startswith("float") else (rng.uniform(size=shape) * 3).astype(dtype) for _, shape, dtype in specs]
    x = xs if several else xs[0]
    floats = [i for i, (_, _, dtype) in enumerate(specs) if dtype.startswith("float")]
    try:
        xv = [tf.constant(v) for v in xs]
        with tf.GradientTape() as tape:
            for i in floats:
                tape.watch(xv[i])
            want_y = model(*xv, training=False) if signature else model(xv if several else xv[0], training=False)
        g = rng.standard_normal(tuple(want_y.shape)).astype(np.float32)
        # one backward pass for the inputs and the weights (two calls of a persistent tape ran it twice)
        grads = tape.gradient(want_y, [*(xv[i] for i in floats), *model.trainable_variables],
                              output_gradients=tf.constant(g))
        want_x = dict(zip(floats, grads[:len(floats)]))
        want_w = grads[len(floats):]
        # a variable this call does not use (a ReversibleEmbedding's reverse weights) is not in the frozen graph
        used = [(v.path, w) for v, w in zip(model.trainable_variables, want_w) if w is not None]
        want_trainable = [p for p, _ in used]
    except Exception as exc:  # noqa: BLE001
        return Verdict(call.name, layer_name, "n/a", f"Keras's own gradient fails: {type(exc).__name__}")
    try:
        net = TFNet.from_keras(model, input_signature=signature)
        got_y = net.forward(x)
        if sorted(net.trainable) != sorted(want_trainable):
            return Verdict(call.name, layer_name, "differs", f"trainable {sorted(net.trainable)} != {want_trainable}")
        grad_x, grad_w = net.backward(x, g)
    except Exception as exc:  # noqa: BLE001 - the verdict says what failed
        return Verdict(call.name, layer_name, "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                       if str(exc).strip() else type(exc).__name__)
    errors = {"forward": _rel(got_y, want_y)}
    grad_x = grad_x if several else [grad_x]
    for i, want in want_x.items():
        if want is not None:
            errors[f"input {i} gradient" if several else "input gradient"] = _rel(grad_x[i], want)
    for i in range(len(specs)):  # an integer input has no gradient
        if i not in want_x and grad_x[i] is not None:
            errors[f"input {i} gradient (an integer input)"] = float("inf")
    # one SGD step's update of each weight. A gradient that is zero in exact arithmetic (a MultiHeadAttention's key
    # bias: the softmax ignores a shift that is the same for every key) is rounding noise in Keras and in tfnet alike;
    # below 1e-5 of the call's largest it is compared on that scale (as tests/tfnet/onnx_fixtures.py's gradient_error)
    largest = max((float(np.abs(np.asarray(_dense(w))).max(initial=0.0)) for _, w in used), default=0.0)
    for path, want in used:
        want = np.asarray(_dense(want))
        floor = LR * largest if np.abs(want).max(initial=0.0) < 1e-5 * largest else None
        errors[f"step {path}"] = _rel(-LR * grad_w[path], -LR * want, floor)
    # a layer that computes in 16 bits (a "mixed_bfloat16" or "int8_from_mixed_bfloat16" policy): a few of its roundings
    low = str(getattr(layer, "compute_dtype", "float32")) in ("bfloat16", "float16")
    forward_rtol, gradient_rtol = (HALF_RTOL, HALF_RTOL) if low else (FORWARD_RTOL, GRADIENT_RTOL)
    worst = {k: v for k, v in errors.items()
             if v > (forward_rtol if k == "forward" else gradient_rtol) or not np.isfinite(v)}
    if worst:
        return Verdict(call.name, layer_name, "differs", ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
    try:
        def keras_call():
            return model(*xv, training=False) if signature else model(xv if several else xv[0], training=False)

        problem = _losses_differ(net, model, keras_call, x, g, dict(zip((p for p, _ in used), want_w)),
                                 call.kwargs.get("expected_num_losses"))
    except Exception as exc:  # noqa: BLE001 - the verdict says what failed
        return Verdict(call.name, layer_name, "error", f"regularizers: {type(exc).__name__}: {exc}"[:200])
    if problem:
        return Verdict(call.name, layer_name, "differs", problem)
    return Verdict(call.name, layer_name, "equal")


def _losses_differ(net, model, keras_call, x, g, want_w: dict, expected: int | None) -> str | None:
    """Keras's losses beyond the output's: the count its test expects (``expected_num_losses``: the trainable weights'
    regularizers, and ``activity_regularizer``'s or ``add_loss``'s terms, ``net.loss_names``), and where there are
    any, their sum (``net.regularization_loss()`` plus ``forward(x, return_losses=True)``'s, against ``model.losses``
    after Keras's call) and one step of tfnet's training step on the loss ``sum(outputs * g)`` against Keras's SGD step
    on that loss plus ``model.losses``. None: all equal."""
    import tensorflow as tf

    counted = sum(1 for n in net.trainable if n in net.regularizers) + len(net.loss_names)
    if expected is not None and counted != expected:
        return f"losses: tfnet counts {counted}, Keras's test expects {expected}"
    if not counted:
        return None
    variables = [v for v in model.trainable_variables if v.path in want_w]
    with tf.GradientTape() as tape:
        keras_call()
        penalty = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in model.losses])
    ours = float(net.regularization_loss()) + float(net.forward(x, return_losses=True)[1])
    if _rel(ours, float(penalty)) > GRADIENT_RTOL:
        return f"added losses {ours:.6g} != Keras's model.losses {float(penalty):.6g}"
    if not variables:  # nothing trains (ActivityRegularization's layer): the sum is all there is
        return None
    extra = dict(zip((v.path for v in variables), tape.gradient(penalty, variables)))
    before = net.get_weights()
    net.train_step(lambda targets, outputs: tf.reduce_sum(outputs * targets), LR).run(x, g)
    after = net.get_weights()
    for path, want in want_w.items():
        more = extra.get(path)
        want = -LR * (np.asarray(_dense(want)) + (0.0 if more is None else np.asarray(_dense(more))))
        if _rel(after[path] - before[path], want) > GRADIENT_RTOL:
            return f"step with the added losses {path} {_rel(after[path] - before[path], want):.3g}"
    return None


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
