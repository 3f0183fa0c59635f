"""ONNX recurrent operators (``LSTM``, ``GRU``, ``RNN``) as TensorFlow ops, unrolled over the static
sequence length.

Forward, reverse and bidirectional directions, ``layout`` 0 and 1, optional initial states. Weights
stay in ONNX layout (``W: [directions, gates * hidden, input]``), so their names, shapes and
gradients are those of the ONNX model (PyTorch's, after the exporter's ``Slice``/``Concat``). Every
step's input projection is one matmul over the whole sequence.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register

_ACTIVATIONS = {"Sigmoid": tf.sigmoid, "Tanh": tf.tanh, "Relu": tf.nn.relu}
_DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}



def _activations(node, attrs, directions: int) -> list[list]:
    """Per direction, the activation functions the cell uses, in ONNX's order."""
    default = _DEFAULTS[node.op_type]
    given = [attr_text(a) for a in attrs.get("activations", [])] or default * directions
    if len(given) != len(default) * directions:
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: activations {given} do not fit {directions} direction(s).")
    unknown = sorted({a for a in given if a not in _ACTIVATIONS})
    if unknown or attrs.get("activation_alpha") or attrs.get("activation_beta"):
        raise OnnxConversionError(
            f"{node.op_type} {node.name!r}: activations {unknown or given} with alpha/beta are not supported "
            f"(supported: {', '.join(sorted(_ACTIVATIONS))})."
        )
    n = len(default)
    return [[_ACTIVATIONS[a] for a in given[d * n:(d + 1) * n]] for d in range(directions)]


def _lstm_cell(acts, hidden, linear_before_reset, r, p=None):
    """ONNX's LSTM cell; ``p`` the peephole weights (``P[d]``: input, output, forget), or None."""
    f, g, h_act = acts
    pi, po, pf = (None, None, None) if p is None else (p[:hidden], p[hidden:2 * hidden], p[2 * hidden:])

    def step(proj, state):
        h, c = state
        gates = proj + tf.linalg.matmul(h, r, transpose_b=True)
        i, o, fg, cand = tf.split(gates, 4, axis=1)
        if p is not None:
            i, fg = i + pi * c, fg + pf * c
        c = f(fg) * c + f(i) * g(cand)
        if p is not None:
            o = o + po * c
        return (f(o) * h_act(c), c)

    return step


def _gru_cell(acts, hidden, linear_before_reset, r, rb):
    f, g = acts
    r_zr, r_h = r[: 2 * hidden], r[2 * hidden:]
    rb_h = rb[2 * hidden:] if rb is not None else 0.0  # the z and r recurrent biases are in ``proj``

    def step(proj, state):
        (h,) = state
        p_zr, p_h = proj[:, : 2 * hidden], proj[:, 2 * hidden:]
        z, rr = tf.split(f(p_zr + tf.linalg.matmul(h, r_zr, transpose_b=True)), 2, axis=1)
        if linear_before_reset:
            cand = g(p_h + rr * (tf.linalg.matmul(h, r_h, transpose_b=True) + rb_h))
        else:
            cand = g(p_h + tf.linalg.matmul(rr * h, r_h, transpose_b=True) + rb_h)
        return ((1.0 - z) * cand + z * h,)

    return step


def _rnn_cell(acts, hidden, linear_before_reset, r):
    (f,) = acts

    def step(proj, state):
        (h,) = state
        return (f(proj + tf.linalg.matmul(h, r, transpose_b=True)),)

    return step


@register("LSTM", "GRU", "RNN", since=7)  # version 1 had output_sequence
def _recurrent(ctx: Ctx, node, attrs):
    op = node.op_type
    names = list(node.input) + [""] * (8 - len(node.input))
    x_name, w_name, r_name, b_name, lens_name, h0_name = names[:6]
    c0_name = names[6] if op == "LSTM" else ""
    if attrs.get("clip") is not None or attrs.get("input_forget", 0):
        raise OnnxConversionError(f"{op} {node.name!r}: clip and input_forget are not supported.")
    direction = attr_text(attrs.get("direction", b"forward"))
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    acts = _activations(node, attrs, len(dirs))
    layout = attrs.get("layout", 0)
    x = ctx.plain(x_name)
    if layout:
        x = tf.transpose(x, [1, 0, 2])
    steps = x.shape[0]
    if steps is None:
        raise OnnxConversionError(
            f"{op} {node.name!r} has a dynamic sequence length (input shape {x.shape}); tfnet unrolls {op}s and "
            "needs a fixed one. Export with a fixed sequence dimension (dynamic batch is fine); if the sequence is "
            "dimension 0 of a graph input (layout 0), pass relax_batch=False."
        )
    if lens_name:
        lens = ctx.static(lens_name)
        if lens is None or not np.all(np.asarray(lens) == steps):
            raise OnnxConversionError(f"{op} {node.name!r}: sequence_lens other than the full length are not supported.")
    hidden = attrs["hidden_size"]
    gates = _GATES[op] * hidden
    w, r = ctx.plain(w_name), ctx.plain(r_name)
    states0 = [ctx.plain(n) if n else None for n in ((h0_name, c0_name) if op == "LSTM" else (h0_name,))]
    if layout:
        states0 = [None if s is None else tf.transpose(s, [1, 0, 2]) for s in states0]
    batch = tf.shape(x)[1]
    ys, finals = [], []
    for d, way in enumerate(dirs):
        bias, rb = 0.0, None
        if b_name:
            b = ctx.plain(b_name)[d]
            if op == "GRU":  # the recurrent bias of the candidate gate sits inside the reset product
                bias = b[:gates] + tf.concat([b[gates: gates + 2 * hidden], tf.zeros([hidden], b.dtype)], 0)
                rb = b[gates:]
            else:
                bias = b[:gates] + b[gates:]
        proj = tf.reshape(tf.linalg.matmul(tf.reshape(x, [-1, w.shape[-1]]), w[d], transpose_b=True) + bias,
                          [steps, -1, gates])
        make = {"LSTM": _lstm_cell, "GRU": _gru_cell, "RNN": _rnn_cell}[op]
        args = (r[d], rb) if op == "GRU" else (r[d],)
        if op == "LSTM" and names[7]:
            args = (r[d], ctx.plain(names[7])[d])
        step = make(acts[d], hidden, attrs.get("linear_before_reset", 0), *args)
        state = tuple(s[d] if s is not None else tf.zeros(tf.stack([batch, hidden]), x.dtype) for s in states0)
        outs, per_step = [None] * steps, tf.unstack(proj, steps, axis=0)  # one Unpack: one gradient op
        for t in (range(steps) if way == "forward" else range(steps - 1, -1, -1)):
            state = step(per_step[t], state)
            outs[t] = state[0]
        ys.append(tf.stack(outs, 0))
        finals.append(state)
    y = tf.stack(ys, 1)  # (seq, num_directions, batch, hidden)
    results = [y] + [tf.stack([f[k] for f in finals], 0) for k in range(len(states0))]
    if layout:
        results = [tf.transpose(y, [2, 0, 1, 3])] + [tf.transpose(s, [1, 0, 2]) for s in results[1:]]
    for name, value in zip(node.output, results):
        ctx.set(name, value)
