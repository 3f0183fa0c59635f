"""ONNX operators as TensorFlow ops: element-wise, shape, tensor and normalisation ops.

Each handler takes ``(ctx, node, attrs)``, reads its inputs from ``ctx`` and stores its outputs with
``ctx.set``. :data:`HANDLERS` maps operator names to handlers. The other modules register
themselves here: :mod:`~tfnet.onnx.ops_nn` (2-D convolution, pooling, batch norm),
:mod:`~tfnet.onnx.ops_conv_nd` (1-D and 3-D, ConvTranspose), :mod:`~tfnet.onnx.ops_rnn` (LSTM, GRU,
RNN), :mod:`~tfnet.onnx.ops_resize` (Pad, Resize), :mod:`~tfnet.onnx.ops_tensor` (Einsum, CumSum,
TopK, instance and group norm, If) and :mod:`~tfnet.onnx.ops_shape` (shapes, indexing, reductions).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError

HANDLERS: dict[str, Callable] = {}

def register(*names: str):
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco


def tf_dtype(onnx_type: int) -> tf.DType:
    from onnx import helper

    return tf.as_dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def plain_inputs(ctx: Ctx, node) -> list[tf.Tensor | None]:
    return [ctx.plain(i) if i else None for i in node.input]


# ------------------------------------------------------------------ element-wise

_UNARY = {
    "Relu": tf.nn.relu, "Sigmoid": tf.sigmoid, "Tanh": tf.tanh, "Exp": tf.exp, "Log": tf.math.log,
    "Sqrt": tf.sqrt, "Neg": tf.negative, "Abs": tf.abs, "Erf": tf.math.erf, "Reciprocal": tf.math.reciprocal,
    "Floor": tf.floor, "Ceil": tf.math.ceil, "Softplus": tf.nn.softplus, "Sin": tf.sin, "Cos": tf.cos,
    "Identity": tf.identity, "Not": tf.logical_not, "Sign": tf.sign, "Round": tf.round,
}
_LAYOUT_FREE = set(_UNARY) - {"Not"}  # element-wise: any layout in, the same layout out


def _unary_layout(ctx: Ctx, name: str) -> tuple[tf.Tensor, bool]:
    if ctx.is_nhwc(name):
        return ctx.nhwc(name), True
    return ctx.plain(name), False


@register(*_UNARY)
def _unary(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], _UNARY[node.op_type](x), nhwc)


@register("Dropout")
def _dropout(ctx, node, attrs):
    if len(node.input) > 2 and node.input[2]:
        mode = ctx.static(node.input[2])
        if mode is None or bool(mode):
            raise OnnxConversionError(f"Dropout {node.name!r} runs in training mode; tfnet imports inference graphs.")
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], tf.identity(x), nhwc)
    if len(node.output) > 1 and node.output[1]:
        ctx.set(node.output[1], tf.ones_like(ctx.plain(node.input[0]), dtype=tf.bool))


@register("LeakyRelu")
def _leaky(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], tf.nn.leaky_relu(x, alpha=attrs.get("alpha", 0.01)), nhwc)


@register("Elu")
def _elu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    alpha = attrs.get("alpha", 1.0)
    y = tf.nn.elu(x) if alpha == 1.0 else tf.where(x > 0, x, alpha * (tf.exp(x) - 1))
    ctx.set(node.output[0], y, nhwc)


@register("HardSigmoid")
def _hard_sigmoid(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    y = tf.clip_by_value(attrs.get("alpha", 0.2) * x + attrs.get("beta", 0.5), 0.0, 1.0)
    ctx.set(node.output[0], y, nhwc)


@register("HardSwish")
def _hard_swish(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], x * tf.nn.relu6(x + 3.0) / 6.0, nhwc)


@register("Gelu")
def _gelu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    approximate = attrs.get("approximate", b"none")
    ctx.set(node.output[0], tf.nn.gelu(x, approximate=approximate in (b"tanh", "tanh")), nhwc)


@register("Clip")
def _clip(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    lo = ctx.static(node.input[1]) if len(node.input) > 1 and node.input[1] else attrs.get("min")
    hi = ctx.static(node.input[2]) if len(node.input) > 2 and node.input[2] else attrs.get("max")
    if len(node.input) > 1 and node.input[1] and lo is None:
        lo = ctx.plain(node.input[1])
    if len(node.input) > 2 and node.input[2] and hi is None:
        hi = ctx.plain(node.input[2])
    if isinstance(lo, (np.ndarray, float, int, np.generic)) and isinstance(hi, (np.ndarray, float, int, np.generic)) \
            and float(lo) == 0.0 and float(hi) == 6.0:
        y = tf.nn.relu6(x)
    else:
        y = x
        if lo is not None:
            y = tf.maximum(y, tf.cast(lo, x.dtype))
        if hi is not None:
            y = tf.minimum(y, tf.cast(hi, x.dtype))
    ctx.set(node.output[0], y, nhwc)


_BINARY = {
    "Add": tf.add, "Sub": tf.subtract, "Mul": tf.multiply, "Max": tf.maximum, "Min": tf.minimum,
    "Equal": tf.equal, "Less": tf.less, "Greater": tf.greater, "LessOrEqual": tf.less_equal,
    "GreaterOrEqual": tf.greater_equal, "And": tf.logical_and, "Or": tf.logical_or, "Xor": tf.math.logical_xor,
}
_BINARY_LAYOUT_FREE = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum"}


def _scalar_like(ctx: Ctx, name: str) -> bool:
    shape = ctx.plain(name).shape if not ctx.is_nhwc(name) else None
    return shape is not None and shape.rank is not None and shape.num_elements() == 1


def _binary_operands(ctx: Ctx, node) -> tuple[list[tf.Tensor], bool]:
    """Operands in NHWC when one is NHWC and every other is NHWC too or a single number."""
    names = list(node.input)
    if node.op_type in _BINARY_LAYOUT_FREE and any(ctx.is_nhwc(n) for n in names):
        if all(ctx.is_nhwc(n) or _scalar_like(ctx, n) for n in names):
            return [ctx.nhwc(n) if ctx.is_nhwc(n) else ctx.plain(n) for n in names], True
    return [ctx.plain(n) for n in names], False


@register(*_BINARY, "Div", "Pow", "Sum", "Mean")
def _binary(ctx, node, attrs):
    xs, nhwc = _binary_operands(ctx, node)
    op = node.op_type
    if op in ("Sum", "Mean"):
        y = xs[0]
        for x in xs[1:]:
            y = y + x
        if op == "Mean":
            y = y / len(xs)
    elif op == "Div":
        a, b = xs
        y = tf.truncatediv(a, b) if a.dtype.is_integer else a / b
    elif op == "Pow":
        a, b = xs
        exponent = ctx.static(node.input[1])
        if exponent is not None and np.asarray(exponent).size == 1 and float(exponent) == 2.0:
            y = tf.square(a)
        elif exponent is not None and np.asarray(exponent).size == 1 and float(exponent) == 0.5:
            y = tf.sqrt(a)
        else:
            y = tf.pow(a, tf.cast(b, a.dtype))
    else:
        a, b = xs
        if op in ("Add", "Sub", "Mul", "Max", "Min") and a.dtype != b.dtype:
            b = tf.cast(b, a.dtype)
        y = _BINARY[op](a, b)
    ctx.set(node.output[0], y, nhwc)


@register("Mod")
def _mod(ctx, node, attrs):
    a, b = plain_inputs(ctx, node)
    fn = tf.truncatemod if attrs.get("fmod", 0) else tf.math.floormod
    ctx.set(node.output[0], fn(a, b))


@register("Where")
def _where(ctx, node, attrs):
    c, a, b = plain_inputs(ctx, node)
    ctx.set(node.output[0], tf.where(c, a, b))


@register("Softmax", "LogSoftmax")
def _softmax(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", -1)
    fn = tf.nn.softmax if node.op_type == "Softmax" else tf.nn.log_softmax
    ctx.set(node.output[0], fn(x, axis=axis))


@register("Cast")
def _cast(ctx, node, attrs):
    ctx.set(node.output[0], tf.cast(ctx.plain(node.input[0]), tf_dtype(attrs["to"])))


@register("CastLike")
def _cast_like(ctx, node, attrs):
    ctx.set(node.output[0], tf.cast(ctx.plain(node.input[0]), ctx.plain(node.input[1]).dtype))


# ------------------------------------------------------------------ matrix products

@register("MatMul")
def _matmul(ctx, node, attrs):
    a, b = plain_inputs(ctx, node)
    if a.shape.rank == 1 or b.shape.rank == 1:
        a2 = a[None] if a.shape.rank == 1 else a
        b2 = b[:, None] if b.shape.rank == 1 else b
        y = tf.linalg.matmul(a2, b2)
        if a.shape.rank == 1:
            y = tf.squeeze(y, -2)
        if b.shape.rank == 1:
            y = tf.squeeze(y, -1)
    elif b.shape.rank == 2 and a.shape.rank > 2:  # (..., K) @ (K, N): one 2-D matmul
        lead = tf.shape(a)[:-1]
        y = tf.linalg.matmul(tf.reshape(a, [-1, a.shape[-1] or tf.shape(a)[-1]]), b)
        y = tf.reshape(y, tf.concat([lead, tf.shape(b)[-1:]], 0))
    else:
        y = tf.linalg.matmul(a, b)
    ctx.set(node.output[0], y)


@register("Gemm")
def _gemm(ctx, node, attrs):
    a = ctx.plain(node.input[0])
    b = ctx.plain(node.input[1])
    y = tf.linalg.matmul(a, b, transpose_a=bool(attrs.get("transA", 0)), transpose_b=bool(attrs.get("transB", 0)))
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if len(node.input) > 2 and node.input[2]:
        c = ctx.plain(node.input[2])
        if beta != 1.0:
            c = c * beta
        y = tf.nn.bias_add(y, c) if c.shape.rank == 1 else y + c
    ctx.set(node.output[0], y)


@register("LayerNormalization")
def _layer_norm(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    rank = x.shape.rank
    axis = attrs.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    eps = attrs.get("epsilon", 1e-5)
    mean, var = tf.nn.moments(x, axes, keepdims=True)
    inv = tf.math.rsqrt(var + eps)
    y = (x - mean) * inv * ctx.plain(node.input[1])
    if len(node.input) > 2 and node.input[2]:
        y = y + ctx.plain(node.input[2])
    ctx.set(node.output[0], y)
    if len(node.output) > 1:
        ctx.set(node.output[1], mean)
    if len(node.output) > 2:
        ctx.set(node.output[2], inv)


def supported_operators() -> list[str]:
    from tfnet.onnx import (  # noqa: F401  (they register their handlers)
        ops_conv_nd,
        ops_nn,
        ops_resize,
        ops_rnn,
        ops_shape,
        ops_tensor,
    )

    return sorted(HANDLERS)
