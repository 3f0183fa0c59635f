"""ONNX casts and quantization as TensorFlow ops.

``Cast`` and ``CastLike`` (every element type, the 8-bit and 4-bit ones through their carrier types,
:mod:`tfnet.onnx.dtypes`; ``saturate`` and ``round_mode``; to and from strings), ``BitCast``,
``QuantizeLinear`` and ``DequantizeLinear`` (per tensor, per axis and blocked), and the integer ops
built on them: ``MatMulInteger``, ``ConvInteger``, ``QLinearMatMul``, ``QLinearConv``. Quantized
arithmetic is done exactly (integers in float64) and rounded as ONNX defines it, half to even.
"""

from __future__ import annotations

import tensorflow as tf

from tfnet.onnx import dtypes
from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register


def _input(node, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def cast_to(x: tf.Tensor, to: int, saturate: bool = True, round_mode: str = "up", from_type: int | None = None):
    """``x`` cast to ONNX element type ``to`` (in its carrier dtype where TensorFlow has none)."""
    from onnx import TensorProto

    if dtypes.is_carried(to):
        return dtypes.round_to(x, to, saturate, round_mode)
    target = dtypes.tf_type(to)
    if to == TensorProto.STRING:
        if x.dtype == tf.string:
            return x
        if x.dtype == tf.bool:
            return tf.where(x, tf.constant("True"), tf.constant("False"))
        return tf.strings.as_string(x, shortest=True) if x.dtype.is_floating else tf.strings.as_string(x)
    if x.dtype == tf.string:
        if target == tf.bool:
            return tf.not_equal(tf.strings.to_number(x, tf.float64), 0.0)
        if target.is_integer:
            return tf.cast(tf.strings.to_number(x, tf.int64), target)
        return tf.cast(tf.strings.to_number(x, tf.float64), target)
    return tf.cast(x, target)


@register("Cast", since=6)  # version 1 named the type by a string
def _cast(ctx: Ctx, node, attrs):
    to = attrs["to"]
    x = ctx.plain(node.input[0])
    y = cast_to(x, to, bool(attrs.get("saturate", 1)), attr_text(attrs.get("round_mode", b"up")))
    ctx.set(node.output[0], y)
    ctx.onnx_types[node.output[0]] = to


@register("CastLike", since=15)
def _cast_like(ctx: Ctx, node, attrs):
    to = ctx.onnx_type(node.input[1])
    y = cast_to(ctx.plain(node.input[0]), to, bool(attrs.get("saturate", 1)), attr_text(attrs.get("round_mode", b"up")))
    ctx.set(node.output[0], y)
    ctx.onnx_types[node.output[0]] = to


@register("BitCast", since=26)
def _bit_cast(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    to = dtypes.tf_type(attrs["to"])
    if dtypes.is_carried(attrs["to"]) or dtypes.is_carried(ctx.onnx_type(node.input[0])):
        raise OnnxConversionError(f"BitCast {node.name!r}: 8-bit floats and 4-bit or 2-bit integers are not supported.")
    if x.dtype == tf.bool or to == tf.bool:
        y = tf.cast(tf.cast(x, tf.uint8) if x.dtype == tf.bool else tf.bitcast(x, tf.uint8), to)
    else:
        y = tf.bitcast(x, to)
    ctx.set(node.output[0], y)


def _along(scale: tf.Tensor, x: tf.Tensor, axis: int, block: int) -> tf.Tensor:
    """A scale or zero point shaped to multiply ``x``: a scalar as it is, a 1-D one along ``axis``,
    a blocked one (``block`` > 0) repeated ``block`` times along ``axis`` and cut to ``x``'s size."""
    rank = x.shape.rank
    axis = axis + rank if axis < 0 else axis
    if block:
        repeated = tf.repeat(scale, block, axis=axis)
        return repeated[tuple(slice(None) if i != axis else slice(0, tf.shape(x)[axis]) for i in range(rank))]
    if scale.shape.rank == 1 and rank > 1:
        shape = [1] * rank
        shape[axis] = -1
        return tf.reshape(scale, shape)
    return scale


def quantize(x: tf.Tensor, scale: tf.Tensor, zero: tf.Tensor | None, to: int, saturate: bool = True) -> tf.Tensor:
    """ONNX ``QuantizeLinear`` of ``x`` with a scale (and zero point) already shaped to it. The
    division is in ``x``'s float type (float32 for others), as onnx's reference divides, so that the
    halves it rounds (to even) are the same."""
    dtype = x.dtype if x.dtype in (tf.float32, tf.float64) else tf.float32
    scaled = tf.cast(tf.cast(x, dtype) / tf.cast(scale, dtype), tf.float64)
    if not dtypes.tf_type(to).is_integer:  # 8-bit and 4-bit floats: a cast, saturating or not
        if zero is not None:
            scaled = scaled + tf.cast(zero, tf.float64)
        return dtypes.round_to(scaled, to, saturate)
    q = tf.round(scaled)  # half to even
    if zero is not None:
        q = q + tf.cast(zero, tf.float64)
    return dtypes.saturate_int(q, to)


def _quant_axis(attrs, version: int) -> tuple[int, int]:
    return attrs.get("axis", 1), attrs.get("block_size", 0)


@register("QuantizeLinear", since=10)
def _quantize_linear(ctx: Ctx, node, attrs):
    from onnx import TensorProto

    x, scale = ctx.plain(node.input[0]), ctx.plain(node.input[1])
    zp_name = _input(node, 2)
    to = attrs.get("output_dtype", 0) or (ctx.onnx_type(zp_name) if zp_name else TensorProto.UINT8)
    axis, block = _quant_axis(attrs, ctx.version)
    zero = _along(ctx.plain(zp_name), x, axis, block) if zp_name else None
    y = quantize(x, _along(scale, x, axis, block), zero, to, bool(attrs.get("saturate", 1)))
    ctx.set(node.output[0], y)
    ctx.onnx_types[node.output[0]] = to


def dequantize(x: tf.Tensor, scale: tf.Tensor, zero: tf.Tensor | None, dtype: tf.DType) -> tf.Tensor:
    value = tf.cast(x, tf.float64)
    if zero is not None:
        value = value - tf.cast(zero, tf.float64)
    return tf.cast(value * tf.cast(scale, tf.float64), dtype)


@register("DequantizeLinear", since=10)
def _dequantize_linear(ctx: Ctx, node, attrs):
    x, scale = ctx.plain(node.input[0]), ctx.plain(node.input[1])
    zp_name = _input(node, 2)
    axis, block = _quant_axis(attrs, ctx.version)
    zero = _along(ctx.plain(zp_name), x, axis, block) if zp_name else None
    dtype = dtypes.tf_type(attrs["output_dtype"]) if attrs.get("output_dtype") else scale.dtype
    ctx.set(node.output[0], dequantize(x, _along(scale, x, axis, block), zero, dtype))


def _centered(ctx: Ctx, node, value: int, zero: int, axis: int | None = None) -> tf.Tensor:
    """Input ``value`` minus input ``zero`` (its zero point, if given), in float64. A 1-D zero point
    lies along ``axis`` when one is given, else it broadcasts against the last dimension."""
    x = tf.cast(ctx.plain(node.input[value]), tf.float64)
    name = _input(node, zero)
    if not name:
        return x
    z = tf.cast(ctx.plain(name), tf.float64)
    if axis is not None and z.shape.rank == 1 and x.shape.rank and x.shape.rank > 1:
        z = _along(z, x, axis, 0)
    return x - z


@register("MatMulInteger", since=10)
def _matmul_integer(ctx: Ctx, node, attrs):
    a = _centered(ctx, node, 0, 2, axis=-2)  # A's zero point per row, B's per column
    b = _centered(ctx, node, 1, 3)
    ctx.set(node.output[0], tf.cast(tf.round(tf.linalg.matmul(a, b)), tf.int32))


@register("QLinearMatMul", since=10)
def _qlinear_matmul(ctx: Ctx, node, attrs):
    a = _centered(ctx, node, 0, 2, axis=-2)
    b = _centered(ctx, node, 3, 5)
    a_scale, b_scale, y_scale = (tf.cast(ctx.plain(node.input[i]), tf.float64) for i in (1, 4, 6))
    if a_scale.shape.rank == 1 and a.shape.rank and a.shape.rank > 1:
        a_scale = _along(a_scale, a, -2, 0)
    acc = tf.linalg.matmul(a, b) * a_scale * b_scale
    to = ctx.onnx_type(node.input[7])
    ctx.set(node.output[0], quantize(acc, y_scale, ctx.plain(node.input[7]), to))
    ctx.onnx_types[node.output[0]] = to


def _conv(node, attrs, x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """A 2-D ONNX convolution of NCHW float64 ``x`` with OIHW ``w``, in NCHW (float64 is exact for the
    integer products of quantized convolutions)."""
    from tfnet.onnx.ops_nn import conv_nhwc

    if w.shape.rank != 4:
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: only 2-D convolutions are supported.")
    y = conv_nhwc(node, attrs, tf.transpose(tf.cast(x, tf.float32), [0, 2, 3, 1]), tf.cast(w, tf.float32))
    return tf.cast(tf.transpose(y, [0, 3, 1, 2]), tf.float64)


@register("ConvInteger", since=10)
def _conv_integer(ctx: Ctx, node, attrs):
    x = _centered(ctx, node, 0, 2)
    w = _centered(ctx, node, 1, 3, axis=0)
    ctx.set(node.output[0], tf.cast(tf.round(_conv(node, attrs, x, w)), tf.int32))


@register("QLinearConv", since=10)
def _qlinear_conv(ctx: Ctx, node, attrs):
    x = _centered(ctx, node, 0, 2)
    w = _centered(ctx, node, 3, 5, axis=0)
    x_scale, w_scale, y_scale = (tf.cast(ctx.plain(node.input[i]), tf.float64) for i in (1, 4, 6))
    acc = _conv(node, attrs, x, w)
    if _input(node, 8):
        acc = acc + tf.reshape(tf.cast(ctx.plain(node.input[8]), tf.float64), [1, -1, 1, 1])
    w_scale = tf.reshape(w_scale, [1, -1, 1, 1]) if w_scale.shape.rank == 1 else w_scale
    to = ctx.onnx_type(node.input[7])
    ctx.set(node.output[0], quantize(acc * x_scale * w_scale, y_scale, ctx.plain(node.input[7]), to))
    ctx.onnx_types[node.output[0]] = to

