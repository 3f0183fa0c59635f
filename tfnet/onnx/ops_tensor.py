"""ONNX reductions, ``ArgMax``/``ArgMin``, ``Einsum``, ``CumSum``, ``TopK``, ``InstanceNormalization``,
``LRN``, ``LpNormalization`` and ``If`` (with a condition known while converting) as TensorFlow ops.

PyTorch's legacy exporter writes ``GroupNorm`` as ``Reshape -> InstanceNormalization -> Reshape -> Mul
-> Add``, which these ops convert; the ``GroupNormalization`` operator converts through ONNX's own
definition of it (:mod:`tfnet.onnx.functions`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register
from tfnet.onnx.ops_shape import int_list


@register("Einsum", since=12)
def _einsum(ctx: Ctx, node, attrs):
    equation = attrs["equation"]
    equation = attr_text(equation).replace(" ", "")
    xs = [ctx.plain(n) for n in node.input]
    if "..." not in equation and "->" in equation and all(x.shape.rank is not None for x in xs):
        # repeated subscripts of one operand (a diagonal) are what TensorFlow's einsum does not take
        lhs = equation.split("->")[0].split(",")
        for i, (term, x) in enumerate(zip(lhs, xs)):
            if len(set(term)) < len(term):
                xs[i], lhs[i] = _diagonal(x, term)
        equation = ",".join(lhs) + "->" + equation.split("->")[1]
    ctx.set(node.output[0], tf.einsum(equation, *xs))


def _diagonal(x: tf.Tensor, term: str) -> tuple[tf.Tensor, str]:
    """``x`` with each repeated subscript of ``term`` reduced to its diagonal, and the new term."""
    while len(set(term)) < len(term):
        letter = next(c for c in term if term.count(c) > 1)
        i = term.index(letter)
        j = term.index(letter, i + 1)
        rest = [k for k in range(len(term)) if k not in (i, j)]
        moved = tf.transpose(x, rest + [i, j])
        x = tf.linalg.diag_part(moved)
        term = "".join(term[k] for k in rest) + letter
    return x, term


@register("CumSum", since=11)
def _cumsum(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = ctx.static_ints(node.input[1])
    if axis is None:
        raise OnnxConversionError(f"CumSum {node.name!r}: the axis must be known while converting (a constant).")
    y = tf.math.cumsum(x, axis=axis[0], exclusive=bool(attrs.get("exclusive", 0)), reverse=bool(attrs.get("reverse", 0)))
    ctx.set(node.output[0], y)


@register("TopK", since=1)  # version 1 takes k as an attribute, 10 on as an input
def _top_k(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    if len(node.input) > 1 and node.input[1]:
        k = ctx.static_ints(node.input[1])
        k = ctx.plain(node.input[1])[0] if k is None else k[0]
    else:
        k = attrs["k"]
    rank = x.shape.rank
    axis = attrs.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = x if axis == rank - 1 else tf.transpose(x, perm)
    largest = attrs.get("largest", 1)
    values, indices = tf.math.top_k(moved if largest else -moved, k=k, sorted=True)
    if not largest:
        values = -values
    if axis != rank - 1:
        back = list(np.argsort(perm))
        values, indices = tf.transpose(values, back), tf.transpose(indices, back)
    ctx.set(node.output[0], values)
    if len(node.output) > 1:
        ctx.set(node.output[1], tf.cast(indices, tf.int64))


@register("InstanceNormalization", since=6)
def _instance_norm(ctx: Ctx, node, attrs):
    eps = attrs.get("epsilon", 1e-5)
    name = node.input[0]
    scale, bias = ctx.plain(node.input[1]), ctx.plain(node.input[2])
    if ctx.is_nhwc(name):
        x = ctx.nhwc(name)
        mean, var = tf.nn.moments(x, [1, 2], keepdims=True)
        ctx.set(node.output[0], (x - mean) * tf.math.rsqrt(var + eps) * scale + bias, nhwc=True)
        return
    x = ctx.plain(name)
    mean, var = tf.nn.moments(x, list(range(2, x.shape.rank)), keepdims=True)
    shape = [-1] + [1] * (x.shape.rank - 2)
    y = (x - mean) * tf.math.rsqrt(var + eps) * tf.reshape(scale, shape) + tf.reshape(bias, shape)
    ctx.set(node.output[0], y)


@register("If", since=1)
def _if(ctx: Ctx, node, attrs):
    """Inlines the branch a constant condition picks; a condition known only at run time is a ``tf.cond``."""
    from onnx import numpy_helper

    cond = ctx.static(node.input[0])
    if cond is None:  # computed from the inputs, or inside a Loop's body: tf.cond
        from tfnet.onnx.ops_loop import cond_if

        cond_if(ctx, node, attrs)
        return
    branch = attrs["then_branch"] if bool(np.asarray(cond).reshape(-1)[0]) else attrs["else_branch"]
    for t in branch.initializer:
        ctx.set(t.name, tf.constant(numpy_helper.to_array(t)))
    ctx.convert_nodes(branch.node)
    for out, inner in zip(node.output, branch.output):
        if out:
            value = ctx.values[inner.name]
            ctx.set(out, value.tensor, value.nhwc)


def _in_float(fn):
    """A reduction that needs floats, for integer inputs too (computed in float64, cast back)."""
    def run(x, **kw):
        if x.dtype.is_floating:
            return fn(x, **kw)
        return tf.cast(fn(tf.cast(x, tf.float64), **kw), x.dtype)
    return run


_REDUCE = {
    "ReduceMean": tf.reduce_mean, "ReduceSum": tf.reduce_sum, "ReduceMax": tf.reduce_max,
    "ReduceMin": tf.reduce_min, "ReduceProd": tf.reduce_prod, "ReduceLogSumExp": _in_float(tf.reduce_logsumexp),
    "ReduceL2": _in_float(lambda x, **kw: tf.sqrt(tf.reduce_sum(tf.square(x), **kw))),
    "ReduceL1": lambda x, **kw: tf.reduce_sum(tf.abs(x), **kw),
    "ReduceSumSquare": lambda x, **kw: tf.reduce_sum(tf.square(x), **kw),
    "ReduceLogSum": _in_float(lambda x, **kw: tf.math.log(tf.reduce_sum(x, **kw))),
}


@register(*_REDUCE, since=1)  # axes an attribute before version 13 (ReduceSum) or 18 (the others)
def _reduce(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axes = int_list(ctx, node, 1, "axes", attrs)
    keep = bool(attrs.get("keepdims", 1))
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            ctx.set(node.output[0], tf.identity(x))
            return
        axes = None
    op = node.op_type
    if x.dtype == tf.bool and op in ("ReduceMax", "ReduceMin"):
        fn = tf.reduce_any if op == "ReduceMax" else tf.reduce_all
        ctx.set(node.output[0], fn(x, axis=axes, keepdims=keep))
        return
    if op in ("ReduceMax", "ReduceMin") and x.dtype.is_integer and x.shape.num_elements() == 0:
        limit = x.dtype.min if op == "ReduceMax" else x.dtype.max
        shape = tf.shape(tf.reduce_sum(x, axis=axes, keepdims=keep))
        ctx.set(node.output[0], tf.fill(shape, tf.constant(limit, x.dtype)))
        return
    ctx.set(node.output[0], _REDUCE[op](x, axis=axes, keepdims=keep))


@register("ArgMax", "ArgMin", since=1)
def _argmax(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", 0)
    axis = axis + x.shape.rank if axis < 0 else axis
    fn = tf.argmax if node.op_type == "ArgMax" else tf.argmin
    if attrs.get("select_last_index", 0):  # the last of equal values: search the reversed axis
        last = tf.cast(tf.shape(x)[axis] - 1, tf.int64)
        y = last - fn(tf.reverse(x, [axis]), axis=axis, output_type=tf.int64)
    else:
        y = fn(x, axis=axis, output_type=tf.int64)
    if attrs.get("keepdims", 1):
        y = tf.expand_dims(y, axis)
    ctx.set(node.output[0], y)




@register("LpNormalization", since=1)
def _lp_normalization(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    if p not in (1, 2):
        raise OnnxConversionError(f"LpNormalization {node.name!r}: p={p} is not supported (1 and 2 are).")
    norm = tf.reduce_sum(tf.abs(x), axis, keepdims=True) if p == 1 else \
        tf.sqrt(tf.reduce_sum(tf.square(x), axis, keepdims=True))
    zero = tf.equal(norm, 0)
    if x.dtype.is_integer:
        y = tf.math.floordiv(x, tf.where(zero, tf.ones_like(norm), norm))
    else:
        y = x / tf.where(zero, tf.ones_like(norm), norm)
    ctx.set(node.output[0], tf.where(zero, tf.zeros_like(x), y))


@register("LRN", since=1)
def _lrn(ctx, node, attrs):
    """Local response normalisation across channels: the window of ``size`` channels starts
    ``(size - 1) // 2`` before a channel, as ONNX defines it (not TensorFlow's symmetric radius)."""
    name = node.input[0]
    nhwc = ctx.is_nhwc(name)
    x = ctx.nhwc(name) if nhwc else ctx.plain(name)
    axis = 3 if nhwc else 1
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    pads = [[0, 0]] * x.shape.rank
    pads[axis] = [before, after]
    squares = tf.pad(tf.square(x), pads)
    channels = tf.shape(x)[axis]
    total = tf.add_n([tf.gather(squares, tf.range(i, i + channels), axis=axis) for i in range(size)])
    ctx.set(node.output[0], x / tf.pow(bias + alpha / size * total, beta), nhwc)
