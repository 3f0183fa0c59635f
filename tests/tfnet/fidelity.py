"""Fidelity checks of a frozen graph loaded by TFNet against the framework that made it.

A *case* is a model frozen to a ``.pb`` (by ``TFNet.from_keras`` or by TensorFlow's own converter)
plus an *oracle*: what the original framework computes on the same input (outputs, gradients of
``sum(outputs * grad_outputs)`` on the input and every trainable variable, and the outputs after one
SGD step). :func:`compare` loads the ``.pb`` with ``TFNet.from_frozen_graph`` and measures the three
relative errors the issue asks for. Relative error is ``||a - b|| / ||b||`` (L2 over all elements);
for one weight's gradient the denominator is at least 0.1% of the norm of all weight gradients
(an attention key bias has a true gradient of exactly zero, and float rounding on it is not an error).
The one-step error compares the change of the outputs, ``y_after - y_before``, on both sides.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tfnet import TFNet

FORWARD_TOL = 1e-5
GRADIENT_TOL = 1e-4
STEP_TOL = 1e-3


def rel_error(a, b, floor: float = 0.0) -> float:
    """``||a - b|| / max(||b||, floor)``."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    denom = max(float(np.linalg.norm(b)), floor)
    return float(np.linalg.norm(a - b) / (denom if denom > 0 else 1.0))


@dataclass
class Oracle:
    """What the original framework computes on ``x``."""

    x: np.ndarray
    grad_out: np.ndarray
    y: np.ndarray
    grad_x: np.ndarray | None
    grad_w: dict[str, np.ndarray]  # by weight name in the .pb
    lr: float
    y_after_step: np.ndarray
    trainable: set[str]  # weight names in the .pb that the framework trains
    frozen: set[str] = field(default_factory=set)  # float weights the framework does not train


@dataclass
class Case:
    model: str
    path: str  # "from_keras" or "converter"
    pb: str
    inputs: list[str]
    outputs: list[str]
    oracle: Oracle

    def where(self) -> str:
        return f"[{self.model} via {self.path}]"


# ----------------------------------------------------------------------------- Keras 3 models


def keras_oracle_step(model, x, grad_out, by_name: dict[str, object]) -> Oracle:
    """Keras's outputs, gradients (``training=False``, as frozen) and one SGD step.

    ``by_name`` maps the .pb's weight names to the Keras variables. Variables are restored after.
    """
    return _keras_step(model, x, grad_out).oracle(by_name)


@dataclass
class _KerasStep:
    """What Keras computed on ``x`` once (by variable), for the oracle of each way of freezing the model."""

    x: np.ndarray
    grad_out: np.ndarray
    y: np.ndarray
    grad_x: np.ndarray
    g_by_id: dict[int, object]  # id(variable) -> its gradient (None: not connected)
    lr: float
    y_after: np.ndarray
    train_ids: set[int]

    def oracle(self, by_name: dict[str, object]) -> Oracle:
        grad_w = {}
        for name, var in by_name.items():
            if id(var) in self.g_by_id:
                g = self.g_by_id[id(var)]
                grad_w[name] = np.zeros(var.shape, np.float32) if g is None else tf.convert_to_tensor(g).numpy()
        return Oracle(
            x=self.x, grad_out=self.grad_out, y=self.y, grad_x=self.grad_x, grad_w=grad_w, lr=self.lr,
            y_after_step=self.y_after,
            trainable={n for n, v in by_name.items() if id(v) in self.train_ids},
            frozen={n for n, v in by_name.items() if id(v) not in self.train_ids},
        )


def _keras_step(model, x, grad_out) -> _KerasStep:
    xt = tf.constant(x)
    trainable = list(model.trainable_variables)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = model(xt, training=False)
        obj = tf.reduce_sum(tf.cast(y, tf.float64) * grad_out)
    grads = tape.gradient(obj, [xt] + trainable)
    g_by_id = {id(v): g for v, g in zip(trainable, grads[1:])}
    biggest = max(float(tf.reduce_max(tf.abs(g))) for g in grads[1:] if g is not None)
    lr = 0.01 / biggest
    saved = [v.numpy().copy() for v in trainable]
    for v, g in zip(trainable, grads[1:]):
        if g is not None:
            v.assign_sub(lr * tf.convert_to_tensor(g))
    y_after = model(xt, training=False).numpy()
    for v, s in zip(trainable, saved):
        v.assign(s)
    return _KerasStep(x=x, grad_out=grad_out, y=y.numpy(), grad_x=grads[0].numpy(), g_by_id=g_by_id, lr=lr,
                      y_after=y_after, train_ids={id(v) for v in trainable})


def keras_cases(name: str, model, x: np.ndarray, tmp: str, seed: int = 0, twin=None,
                paths: tuple[str, ...] = ("from_keras", "converter")) -> list[Case]:
    """Freezes ``model`` in each of ``paths`` into ``tmp`` and computes the Keras oracle for each: on ``model``
    itself, or on ``twin``, the same architecture with the same weights in another dtype (a float64 twin gives the
    truth that float32 rounding is measured against); the twin's variables are matched by position."""
    rng = np.random.default_rng(seed)
    position = {id(v): i for i, v in enumerate(model.variables)}
    step: list[_KerasStep] = []  # Keras's step, computed once for every path (the same model, input and weights)

    def oracle(by_name: dict[str, object]) -> Oracle:
        if not step:
            step.append(_keras_step(model, x, grad_out) if twin is None
                        else _keras_step(twin, x.astype(twin.variables[0].dtype), grad_out))
        if twin is None:
            return step[0].oracle(by_name)
        twins = {n: twin.variables[position[id(v)]] for n, v in by_name.items()}
        found = step[0].oracle(twins)
        found.x = x
        return found

    cases = []
    shape = getattr(model, "output_shape", None)  # the functional model's own (batch None): no forward pass for it
    if isinstance(shape, tuple) and len(shape) > 1 and all(isinstance(d, int) for d in shape[1:]):
        y_shape = (x.shape[0], *shape[1:])
    else:
        y_shape = tuple(model(x, training=False).shape)
    grad_out = rng.normal(size=y_shape).astype(np.float64)
    if "from_keras" in paths:
        cases.append(_from_keras_case(name, model, tmp, oracle))
    if "converter" in paths:
        cases.append(_converter_case(name, model, x, tmp, oracle))
    return cases


def _from_keras_case(name: str, model, tmp: str, oracle) -> Case:
    """1. tfnet's own freezer: weight names are the Keras variable paths."""
    net = TFNet.from_keras(model)
    pb = os.path.join(tmp, f"{name}_from_keras.pb")
    with open(pb, "wb") as f:
        f.write(net.frozen_graph_def().SerializeToString())
    from tfnet.graph_utils import clean_node_name

    by_clean = {clean_node_name(v.path): v for v in model.variables}  # one pass, not one per weight name
    by_name = {w: by_clean[w] for w in net.weight_names if w in by_clean}
    return Case(name, "from_keras", pb, net.input_names, net.output_names, oracle(by_name))


def _converter_case(name: str, model, x: np.ndarray, tmp: str, oracle) -> Case:
    """2. TensorFlow's converter, the standard TF 2 recipe."""
    spec = tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype), name="x")
    fn = tf.function(lambda t: model(t, training=False)).get_concrete_function(spec)
    frozen = convert_variables_to_constants_v2(fn)
    graph_def = frozen.graph.as_graph_def()
    pb = os.path.join(tmp, f"{name}_converter.pb")
    with open(pb, "wb") as f:
        f.write(graph_def.SerializeToString())
    handles = {id(getattr(v, "_value", v).handle): v for v in model.variables}
    by_name = {}
    for external, internal in fn.graph.captures:
        var = handles.get(id(external))
        if var is not None:
            by_name[internal.op.name] = var
    out = [t.name for t in frozen.outputs]
    return Case(name, "converter", pb, [t.name for t in frozen.inputs], out, oracle(by_name))


# ----------------------------------------------------------------------------- comparison


@dataclass
class Errors:
    forward: float
    grad_input: float
    grad_weights: float
    step: float


def compare(case: Case, **kwargs) -> tuple[TFNet, Errors]:
    """Loads ``case.pb`` with ``from_frozen_graph`` and checks it against the oracle. Every failure,
    an exception included, names the model and the path."""
    try:
        return _compare(case, **kwargs)
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the model and path in front
        raise AssertionError(f"{case.where()} {type(exc).__name__}: {str(exc)[:2000]}") from exc


def _compare(case: Case, **kwargs) -> tuple[TFNet, Errors]:
    where = case.where()
    o = case.oracle
    net = TFNet.from_frozen_graph(case.pb, case.inputs, case.outputs, **kwargs)
    y = net.forward(o.x)
    fwd = rel_error(y, o.y)
    assert fwd <= FORWARD_TOL, f"{where} forward relative error {fwd:.2e} > {FORWARD_TOL}"
    missing = sorted(o.trainable - set(net.weight_names))
    assert not missing, f"{where} trainable weights not found in the net: {missing[:5]}"
    assert set(net.trainable) == o.trainable, (
        f"{where} default trainable set differs from the framework's: extra "
        f"{sorted(set(net.trainable) - o.trainable)[:5]}, missing {sorted(o.trainable - set(net.trainable))[:5]}; "
        f"detected statistics {net.statistic_names[:8]}"
    )
    gx, gw = net.backward(o.x, o.grad_out.astype(np.float32))
    gin = 0.0 if o.grad_x is None else rel_error(gx, o.grad_x)
    assert gin <= GRADIENT_TOL, f"{where} input-gradient relative error {gin:.2e} > {GRADIENT_TOL}"
    worst, worst_name = 0.0, None
    # A weight whose true gradient is zero (an attention key bias) is measured against 0.1% of
    # the whole weight gradient, not against its own rounding noise.
    floor = 1e-3 * float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in o.grad_w.values())))
    for n, g in o.grad_w.items():
        e = rel_error(gw[n], g, floor)
        if e > worst:
            worst, worst_name = e, n
    assert worst <= GRADIENT_TOL, (
        f"{where} weight-gradient relative error {worst:.2e} > {GRADIENT_TOL} on {worst_name!r}"
    )
    net.apply_updates({n: -o.lr * g for n, g in gw.items()})
    y1 = net.forward(o.x)
    step = rel_error(y1 - y, o.y_after_step - o.y)
    assert step <= STEP_TOL, (
        f"{where} one SGD step moved the outputs with relative error {step:.2e} > {STEP_TOL} "
        f"against the same step on the original model; statistics detected: {net.statistic_names[:8]}"
    )
    errors = Errors(fwd, gin, worst, step)
    report = os.environ.get("TFNET_FIDELITY_REPORT")
    if report:  # one JSON line per case, for the table in docs/benchmarks.md
        with open(report, "a") as f:
            f.write(json.dumps({"model": case.model, "path": case.path, **errors.__dict__,
                                "statistics": len(net.statistics), "weights": len(net.weight_names)}) + "\n")
    return net, errors
