"""ONNX operators as TensorFlow ops: element-wise, shape, tensor and normalisation ops.

Each handler takes ``(ctx, node, attrs)``, reads its inputs from ``ctx`` and stores its outputs with
``ctx.set``. :data:`HANDLERS` maps operator names to handlers. The other modules register
themselves here: :mod:`~tfnet.onnx.ops_nn` (2-D convolution, pooling, batch norm),
:mod:`~tfnet.onnx.ops_conv_nd` (1-D and 3-D, ConvTranspose), :mod:`~tfnet.onnx.ops_rnn` (LSTM, GRU,
RNN), :mod:`~tfnet.onnx.ops_resize` (Pad, Resize), :mod:`~tfnet.onnx.ops_tensor` (Einsum, CumSum,
TopK, instance and group norm, If) and :mod:`~tfnet.onnx.ops_shape` (shapes, indexing, reductions).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx, Value
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.registry import HANDLERS, register

__all__ = ["HANDLERS", "register", "attr_text", "plain_inputs", "tf_dtype"]


def attr_text(value) -> str:
    """A string attribute as text: onnx hands them over as ``bytes``, a default written in the handler is ``str``."""
    return value.decode() if isinstance(value, bytes) else value


def tf_dtype(onnx_type: int) -> tf.DType:
    from onnx import helper

    return tf.as_dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def plain_inputs(ctx: Ctx, node) -> list[tf.Tensor | None]:
    return [ctx.plain(i) if i else None for i in node.input]


# ------------------------------------------------------------------ element-wise

def _float_op(fn):
    """``fn`` for float tensors; integer ones (where ONNX allows them) computed in float64."""
    def run(x):
        if x.dtype.is_floating:
            return fn(x)
        return tf.cast(fn(tf.cast(x, tf.float64)), x.dtype)
    return run


def _abs(x):
    return x if x.dtype.is_unsigned else tf.abs(x)


def _sign(x):
    return tf.cast(x > 0, x.dtype) if x.dtype.is_unsigned else tf.sign(x)


def _neg(x):
    return tf.negative(x)


_UNARY = {
    "Relu": tf.nn.relu, "Sigmoid": tf.sigmoid, "Tanh": tf.tanh, "Exp": tf.exp, "Log": tf.math.log,
    "Sqrt": tf.sqrt, "Neg": _neg, "Abs": _abs, "Erf": tf.math.erf, "Reciprocal": tf.math.reciprocal,
    "Floor": tf.floor, "Ceil": tf.math.ceil, "Sin": tf.sin, "Cos": tf.cos, "Tan": tf.tan,
    "Asin": tf.asin, "Acos": tf.acos, "Atan": tf.atan, "Sinh": tf.sinh, "Cosh": tf.cosh, "Asinh": tf.asinh,
    "Acosh": tf.acosh, "Atanh": tf.atanh, "Sign": _sign, "Round": tf.round,
}
_UNARY_SINCE_1 = {
    "Softplus": tf.nn.softplus, "Softsign": tf.nn.softsign, "Identity": tf.identity, "Not": tf.logical_not,
}
_LAYOUT_FREE = (set(_UNARY) | set(_UNARY_SINCE_1)) - {"Not"}  # element-wise: any layout in, the same out


def _unary_layout(ctx: Ctx, name: str) -> tuple[tf.Tensor, bool]:
    if ctx.is_nhwc(name):
        return ctx.nhwc(name), True
    return ctx.plain(name), False


@register(*_UNARY, since=6)  # version 1 had the legacy consumed_inputs attribute
def _unary(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    fn = _UNARY[node.op_type]
    if node.op_type == "Relu" and not x.dtype.is_floating:
        y = tf.maximum(x, tf.zeros([], x.dtype))
    elif node.op_type == "Relu":
        y = tf.nn.relu(x)
    elif node.op_type in ("Neg", "Abs", "Sign"):
        y = fn(x)
    else:
        y = _float_op(fn)(x)
    ctx.set(node.output[0], y, nhwc)


@register(*_UNARY_SINCE_1, since=1)
def _unary_any(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], _UNARY_SINCE_1[node.op_type](x), nhwc)


@register("IsNaN", since=9)
def _is_nan(ctx, node, attrs):
    ctx.set(node.output[0], tf.math.is_nan(ctx.plain(node.input[0])))


@register("IsInf", since=10)
def _is_inf(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    pos = tf.equal(x, tf.constant(np.inf, x.dtype))
    neg = tf.equal(x, tf.constant(-np.inf, x.dtype))
    y = tf.zeros_like(x, tf.bool)
    if attrs.get("detect_positive", 1):
        y = y | pos
    if attrs.get("detect_negative", 1):
        y = y | neg
    ctx.set(node.output[0], y)


@register("BitwiseNot", since=18)
def _bitwise_not(ctx, node, attrs):
    ctx.set(node.output[0], tf.bitwise.invert(ctx.plain(node.input[0])))


@register("Dropout", since=7)  # inference: the identity (versions 1 and 6 had is_test)
def _dropout(ctx, node, attrs):
    if len(node.input) > 2 and node.input[2]:
        mode = ctx.static(node.input[2])
        if mode is None or bool(mode):
            raise OnnxConversionError(f"Dropout {node.name!r} runs in training mode; tfnet imports inference graphs.")
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], tf.identity(x), nhwc)
    if len(node.output) > 1 and node.output[1]:
        ctx.set(node.output[1], tf.ones_like(ctx.plain(node.input[0]), dtype=tf.bool))


@register("LeakyRelu", since=6)
def _leaky(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], tf.nn.leaky_relu(x, alpha=attrs.get("alpha", 0.01)), nhwc)


@register("Elu", since=6)
def _elu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    alpha = attrs.get("alpha", 1.0)
    y = tf.nn.elu(x) if alpha == 1.0 else tf.where(x > 0, x, alpha * (tf.exp(x) - 1))
    ctx.set(node.output[0], y, nhwc)


@register("Selu", since=6)
def _selu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    alpha, gamma = attrs.get("alpha", 1.67326319217681884765625), attrs.get("gamma", 1.05070102214813232421875)
    ctx.set(node.output[0], gamma * tf.where(x > 0, x, alpha * (tf.exp(x) - 1)), nhwc)


@register("Celu", since=12)
def _celu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    alpha = attrs.get("alpha", 1.0)
    zero = tf.zeros([], x.dtype)
    ctx.set(node.output[0], tf.maximum(x, zero) + tf.minimum(zero, alpha * (tf.exp(x / alpha) - 1)), nhwc)


@register("ThresholdedRelu", since=10)
def _thresholded_relu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], tf.where(x > attrs.get("alpha", 1.0), x, tf.zeros_like(x)), nhwc)


@register("Shrink", since=9)
def _shrink(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    lambd, bias = attrs.get("lambd", 0.5), attrs.get("bias", 0.0)
    xf = tf.cast(x, tf.float64) if not x.dtype.is_floating else x
    y = tf.where(xf < -lambd, xf + bias, tf.where(xf > lambd, xf - bias, tf.zeros_like(xf)))
    ctx.set(node.output[0], tf.cast(y, x.dtype))


@register("Mish", since=18)
def _mish(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], x * tf.tanh(tf.nn.softplus(x)), nhwc)


@register("Swish", since=24)
def _swish(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    alpha = attrs.get("alpha", 1.0)
    ctx.set(node.output[0], x * tf.sigmoid(alpha * x) if alpha != 1.0 else tf.nn.silu(x), nhwc)


@register("HardSigmoid", since=6)
def _hard_sigmoid(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    y = tf.clip_by_value(attrs.get("alpha", 0.2) * x + attrs.get("beta", 0.5), 0.0, 1.0)
    ctx.set(node.output[0], y, nhwc)


@register("HardSwish", since=14)
def _hard_swish(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], x * tf.nn.relu6(x + 3.0) / 6.0, nhwc)


@register("Gelu", since=20)
def _gelu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    approximate = attrs.get("approximate", b"none")
    ctx.set(node.output[0], tf.nn.gelu(x, approximate=approximate in (b"tanh", "tanh")), nhwc)


@register("PRelu", since=7)  # version 7 on: the slope broadcasts (numpy-style) to the input
def _prelu(ctx, node, attrs):
    x, slope = ctx.plain(node.input[0]), ctx.plain(node.input[1])
    if _per_channel_slope(x.shape, slope.shape):  # PRelu v6 as PyTorch wrote it, kept by onnx's version converter
        slope = tf.reshape(slope, [-1] + [1] * (x.shape.rank - 2))
    ctx.set(node.output[0], tf.where(x < 0, x * slope, x))


def _per_channel_slope(x_shape: tf.TensorShape, slope_shape: tf.TensorShape) -> bool:
    """Whether a PRelu slope of shape ``(C,)`` is meant per channel (dimension 1) of an ``(N, C, ...)`` input: it
    matches dimension 1 and does not broadcast numpy-style (against the last dimension), as an opset-6 model's
    slope, upgraded to version 7 or later by ``onnx.version_converter``, still is."""
    if x_shape.rank is None or x_shape.rank < 3 or slope_shape.rank != 1 or slope_shape[0] in (None, 1):
        return False
    return x_shape[1] == slope_shape[0] and x_shape[-1] not in (None, 1, slope_shape[0])


@register("Clip", since=6)
def _clip(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    lo = ctx.static(node.input[1]) if len(node.input) > 1 and node.input[1] else attrs.get("min")
    hi = ctx.static(node.input[2]) if len(node.input) > 2 and node.input[2] else attrs.get("max")
    if len(node.input) > 1 and node.input[1] and lo is None:
        lo = ctx.plain(node.input[1])
    if len(node.input) > 2 and node.input[2] and hi is None:
        hi = ctx.plain(node.input[2])
    if isinstance(lo, (np.ndarray, float, int, np.generic)) and isinstance(hi, (np.ndarray, float, int, np.generic)) \
            and float(lo) == 0.0 and float(hi) == 6.0 and x.dtype.is_floating:
        y = tf.nn.relu6(x)
    else:
        y = x
        if lo is not None:
            y = tf.maximum(y, tf.cast(lo, x.dtype))
        if hi is not None:
            y = tf.minimum(y, tf.cast(hi, x.dtype))
    ctx.set(node.output[0], y, nhwc)


_BINARY = {
    "Add": tf.add, "Sub": tf.subtract, "Mul": tf.multiply, "Equal": tf.equal, "Less": tf.less,
    "Greater": tf.greater, "LessOrEqual": tf.less_equal, "GreaterOrEqual": tf.greater_equal,
    "And": tf.logical_and, "Or": tf.logical_or, "Xor": tf.math.logical_xor,
    "BitwiseAnd": tf.bitwise.bitwise_and, "BitwiseOr": tf.bitwise.bitwise_or, "BitwiseXor": tf.bitwise.bitwise_xor,
}
_VARIADIC = {"Max": tf.maximum, "Min": tf.minimum, "Sum": tf.add, "Mean": tf.add}
_BINARY_LAYOUT_FREE = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum", "Mean"}


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


def _maximum(a, b):
    if a.dtype == tf.bool:
        return tf.logical_or(a, b)
    if a.dtype.is_floating:  # NaN wins, as in numpy and onnxruntime
        return tf.where(tf.math.is_nan(a) | tf.math.is_nan(b), a + b, tf.maximum(a, b))
    return tf.maximum(a, b)


def _minimum(a, b):
    if a.dtype == tf.bool:
        return tf.logical_and(a, b)
    if a.dtype.is_floating:
        return tf.where(tf.math.is_nan(a) | tf.math.is_nan(b), a + b, tf.minimum(a, b))
    return tf.minimum(a, b)


@register("Max", "Min", "Sum", "Mean", since=8)  # variadic with numpy-style broadcasting
def _variadic(ctx, node, attrs):
    xs, nhwc = _binary_operands(ctx, node)
    fn = {"Max": _maximum, "Min": _minimum}.get(node.op_type, tf.add)
    y = xs[0]
    for x in xs[1:]:
        y = fn(y, x)
    if len(xs) == 1:
        y = tf.identity(y)
    if node.op_type == "Mean":
        y = y / tf.cast(len(xs), y.dtype)
    ctx.set(node.output[0], y, nhwc)


@register(*_BINARY, "Div", "Pow", since=7)  # version 7 on: numpy-style broadcasting
def _binary(ctx, node, attrs):
    xs, nhwc = _binary_operands(ctx, node)
    op = node.op_type
    a, b = xs
    if op == "Div":
        if a.dtype.is_integer:
            y = tf.truncatediv(a, b) if not a.dtype.is_unsigned else tf.math.floordiv(a, b)
        else:
            y = a / b
    elif op == "Pow":
        exponent = ctx.static(node.input[1])
        if exponent is not None and np.asarray(exponent).size == 1 and float(exponent) == 2.0:
            y = tf.square(a)
        elif exponent is not None and np.asarray(exponent).size == 1 and float(exponent) == 0.5 and a.dtype.is_floating:
            y = tf.sqrt(a)
        elif a.dtype.is_integer:
            y = tf.cast(tf.round(tf.pow(tf.cast(a, tf.float64), tf.cast(b, tf.float64))), a.dtype)
        else:
            y = tf.pow(a, tf.cast(b, a.dtype))
    else:
        if a.dtype != b.dtype and op in ("Add", "Sub", "Mul"):
            b = tf.cast(b, a.dtype)
        if op in ("Sub", "Add", "Mul") and a.dtype.is_unsigned and a.dtype in (tf.uint32, tf.uint64):
            wide = tf.int64 if a.dtype == tf.uint32 else None
            y = _BINARY[op](a, b) if wide is None else tf.cast(_BINARY[op](tf.cast(a, wide), tf.cast(b, wide)), a.dtype)
        else:
            y = _BINARY[op](a, b)
    ctx.set(node.output[0], y, nhwc)


@register("BitShift", since=11)
def _bit_shift(ctx, node, attrs):
    x, y = plain_inputs(ctx, node)
    direction = attrs["direction"]
    direction = attr_text(direction)
    y = tf.cast(y, x.dtype)
    x, y = tf.broadcast_to(x, tf.broadcast_dynamic_shape(tf.shape(x), tf.shape(y))), y + tf.zeros_like(x)
    outside = (y < 0) | (y >= x.dtype.size * 8)  # shifts by the width or more, or negative ones
    safe = tf.where(outside, tf.zeros_like(y), y)
    if direction == "LEFT":
        z = tf.where(outside, tf.zeros_like(x), tf.bitwise.left_shift(x, safe))
    else:
        fill = tf.where(x < 0, -tf.ones_like(x), tf.zeros_like(x)) if not x.dtype.is_unsigned else tf.zeros_like(x)
        z = tf.where(outside, fill, tf.bitwise.right_shift(x, safe))
    ctx.set(node.output[0], z)


@register("Mod", since=10)
def _mod(ctx, node, attrs):
    a, b = plain_inputs(ctx, node)
    if attrs.get("fmod", 0):
        y = tf.cast(tf.truncatemod(tf.cast(a, tf.float32), tf.cast(b, tf.float32)), a.dtype) \
            if a.dtype in (tf.float16, tf.bfloat16) else tf.truncatemod(a, b)
    else:
        y = tf.math.floormod(a, b)
    ctx.set(node.output[0], y)


@register("Where", since=9)
def _where(ctx, node, attrs):
    c, a, b = plain_inputs(ctx, node)
    ctx.set(node.output[0], tf.where(c, a, b))


def _coerced(x: tf.Tensor, axis: int, fn) -> tf.Tensor:
    """Versions before 13 of Softmax, LogSoftmax and Hardmax: the input as a 2-D matrix (the
    dimensions before ``axis`` times those from it), ``fn`` along its rows, reshaped back."""
    shape = tf.shape(x)
    flat = tf.reshape(x, tf.stack([tf.reduce_prod(shape[:axis]), tf.reduce_prod(shape[axis:])]))
    return tf.reshape(fn(flat), shape)


def _hardmax(x: tf.Tensor, axis: int) -> tf.Tensor:
    return tf.one_hot(tf.argmax(x, axis=axis), tf.shape(x)[axis], axis=axis, dtype=x.dtype)


@register("Softmax", "LogSoftmax", "Hardmax", since=1)  # before 13: coerced to 2-D
def _softmax(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    fn = {"Softmax": tf.nn.softmax, "LogSoftmax": tf.nn.log_softmax,
          "Hardmax": lambda t, axis: _hardmax(t, axis)}[node.op_type]
    if ctx.version < 13:
        axis = attrs.get("axis", 1)
        axis = axis + x.shape.rank if axis < 0 else axis
        ctx.set(node.output[0], _coerced(x, axis, lambda t: fn(t, axis=-1)))
        return
    axis = attrs.get("axis", -1)
    if x.dtype in (tf.float16, tf.bfloat16) and node.op_type != "Hardmax":  # in float32, rounded once
        ctx.set(node.output[0], tf.cast(fn(tf.cast(x, tf.float32), axis=axis), x.dtype))
        return
    ctx.set(node.output[0], fn(x, axis=axis))


# ------------------------------------------------------------------ matrix products

def _widened(fn):
    """``fn`` of float16/bfloat16 operands computed in float32 and rounded once at the end (as numpy and
    onnxruntime accumulate half-precision products)."""
    def run(ctx, node, attrs):
        names = [n for n in node.input if n]
        dtype = ctx.plain(names[0]).dtype
        if dtype not in (tf.float16, tf.bfloat16):
            return fn(ctx, node, attrs)
        saved = {n: ctx.values[n] for n in names}
        for n in names:
            ctx.values[n] = Value(tf.cast(ctx.plain(n), tf.float32))
        try:
            fn(ctx, node, attrs)
        finally:
            ctx.values.update(saved)
        out = node.output[0]
        ctx.set(out, tf.cast(ctx.plain(out), dtype))
    return run


@register("MatMul", since=1)
@_widened
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


@register("Gemm", since=7)
@_widened
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
        bias = c.shape.rank == 1 and c.shape[0] is not None and c.shape[0] == y.shape[-1] and c.shape[0] > 1
        y = tf.nn.bias_add(y, c) if bias else y + c
    ctx.set(node.output[0], y)


@register("LayerNormalization", since=17)
def _layer_norm(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    rank = x.shape.rank
    axis = attrs.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    eps = attrs.get("epsilon", 1e-5)
    dtype = x.dtype
    if dtype in (tf.float16, tf.bfloat16) and attrs.get("stash_type", 1) == 1:  # statistics in float32
        x = tf.cast(x, tf.float32)
    mean, var = tf.nn.moments(x, axes, keepdims=True)
    inv = tf.math.rsqrt(var + eps)
    y = tf.cast((x - mean) * inv, dtype) * ctx.plain(node.input[1])
    if len(node.input) > 2 and node.input[2]:
        y = y + ctx.plain(node.input[2])
    ctx.set(node.output[0], y)
    if len(node.output) > 1:
        ctx.set(node.output[1], mean)
    if len(node.output) > 2:
        ctx.set(node.output[2], inv)
