"""ONNX element types that TensorFlow cannot compute with, held in a wider *carrier* type.

The 8-bit floats (``FLOAT8E4M3FN``, ``FLOAT8E4M3FNUZ``, ``FLOAT8E5M2``, ``FLOAT8E5M2FNUZ``,
``FLOAT8E8M0``) and ``FLOAT4E2M1`` are held as float32 holding exactly the representable values;
``INT4`` and ``INT2`` as int8, ``UINT4`` and ``UINT2`` as uint8. A net's input or output of such a type
takes or gives the carrier type. A ``Cast`` (or ``QuantizeLinear``) into one rounds to the type's
values as ONNX defines it: to nearest even with saturation (``saturate=1``) or overflow to infinity
or NaN for the 8-bit floats, the exponent-only ``FLOAT8E8M0`` by ``round_mode``, and wrap-around for
the small integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf


@dataclass(frozen=True)
class FloatFormat:
    mantissa_bits: int
    min_exponent: int  # of the smallest normal number
    largest: float
    has_inf: bool
    fnuz: bool  # no negative zero, no infinity (FLOAT8E*FNUZ)


_FLOATS = {  # ONNX TensorProto element type name -> format
    "FLOAT8E4M3FN": FloatFormat(3, -6, 448.0, False, False),
    "FLOAT8E4M3FNUZ": FloatFormat(3, -7, 240.0, False, True),
    "FLOAT8E5M2": FloatFormat(2, -14, 57344.0, True, False),
    "FLOAT8E5M2FNUZ": FloatFormat(2, -15, 57344.0, False, True),
    "FLOAT4E2M1": FloatFormat(1, 0, 6.0, False, False),
}
_INTS = {"INT4": (4, True), "UINT4": (4, False), "INT2": (2, True), "UINT2": (2, False)}


def _type_name(onnx_type: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(onnx_type)


def is_carried(onnx_type: int) -> bool:
    """Whether TensorFlow holds this element type in a wider carrier type."""
    name = _type_name(onnx_type)
    return name in _FLOATS or name in _INTS or name == "FLOAT8E8M0"


def tf_type(onnx_type: int) -> tf.DType:
    """The TensorFlow dtype that holds values of ``onnx_type`` (its carrier where it has one)."""
    from onnx import helper

    name = _type_name(onnx_type)
    if name in _FLOATS or name == "FLOAT8E8M0":
        return tf.float32
    if name in _INTS:
        return tf.int8 if _INTS[name][1] else tf.uint8
    return tf.as_dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def carrier_array(value: np.ndarray) -> np.ndarray:
    """A numpy array of a carried type (ml_dtypes' float8, float4, int4, int2) as its carrier."""
    name = value.dtype.name
    if name.startswith(("float8", "float4")):
        return value.astype(np.float32)
    if name in ("int4", "int2"):
        return value.astype(np.int8)
    if name in ("uint4", "uint2"):
        return value.astype(np.uint8)
    return value


def round_to(x: tf.Tensor, onnx_type: int, saturate: bool = True, round_mode: str = "up") -> tf.Tensor:
    """``x`` rounded to the values of a carried ``onnx_type``, in its carrier dtype."""
    name = _type_name(onnx_type)
    if name in _FLOATS:
        return _round_float(x, _FLOATS[name], saturate)
    if name == "FLOAT8E8M0":
        return _round_e8m0(x, saturate, round_mode)
    bits, signed = _INTS[name]
    return _wrap_int(x, bits, signed)


def _round_float(x: tf.Tensor, fmt: FloatFormat, saturate: bool) -> tf.Tensor:
    """Round to nearest even on ``fmt``'s grid (exact powers of two, computed in float64)."""
    x64 = tf.cast(x, tf.float64)
    a = tf.abs(x64)
    exponent = tf.bitwise.right_shift(tf.bitcast(a, tf.int64), 52) - 1023
    exponent = tf.maximum(exponent, fmt.min_exponent)
    quantum = tf.pow(tf.constant(2.0, tf.float64), tf.cast(exponent - fmt.mantissa_bits, tf.float64))
    r = tf.round(a / quantum) * quantum  # tf.round rounds half to even
    too_big = (r > fmt.largest) | tf.math.is_inf(a)
    finite_only = fmt is _FLOATS["FLOAT4E2M1"]  # no infinity, no NaN: always saturates, NaN becomes 0
    if saturate or finite_only:
        r = tf.where(too_big, tf.constant(fmt.largest, tf.float64), r)
    else:
        r = tf.where(too_big, tf.constant(np.inf if fmt.has_inf else np.nan, tf.float64), r)
    nan = tf.constant(0.0 if finite_only else np.nan, tf.float64)
    r = tf.where(tf.math.is_nan(a), nan, r)
    return tf.cast(tf.where(x64 < 0, -r, r), tf.float32)


def _round_e8m0(x: tf.Tensor, saturate: bool, round_mode: str) -> tf.Tensor:
    """``FLOAT8E8M0`` (a power of two, ``2**(e - 127)``): the exponent of float32 ``x``, rounded by
    ``round_mode`` ("up", "down", "nearest"), as onnx.numpy_helper.to_float8e8m0 does."""
    bits = tf.bitcast(tf.cast(x, tf.float32), tf.int32)
    exponent = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 23), 0xFF)
    special = tf.equal(exponent, 0xFF)
    mantissa = tf.bitwise.bitwise_and(bits, 0x7FFFFF)
    if round_mode == "nearest":
        g = tf.bitwise.bitwise_and(bits, 0x400000) > 0
        r = tf.bitwise.bitwise_and(bits, 0x200000) > 0
        s = tf.bitwise.bitwise_and(bits, 0x1FFFFF) > 0
        up = g & (r | s | (exponent > 0))
    elif round_mode == "up":
        up = mantissa > 0
    else:
        up = tf.zeros_like(special)
    if saturate:
        up = up & tf.not_equal(exponent, 0xFE)
    exponent = tf.where(up & ~special, exponent + 1, exponent)
    value = tf.pow(tf.constant(2.0, tf.float64), tf.cast(exponent - 127, tf.float64))
    value = tf.where(special | tf.equal(exponent, 0xFF), tf.constant(np.nan, tf.float64), value)
    return tf.cast(value, tf.float32)


def _wrap_int(x: tf.Tensor, bits: int, signed: bool) -> tf.Tensor:
    """Truncated toward zero and wrapped around into ``bits`` bits (two's complement when signed)."""
    if x.dtype.is_floating:
        x = tf.cast(tf.where(tf.math.is_finite(x), x, tf.zeros_like(x)), tf.int64)
    v = tf.math.floormod(tf.cast(x, tf.int64), 1 << bits)
    if signed:
        v = tf.where(v >= 1 << (bits - 1), v - (1 << bits), v)
        return tf.cast(v, tf.int8)
    return tf.cast(v, tf.uint8)


def narrow_int_range(onnx_type: int) -> tuple[int, int] | None:
    """The smallest and largest value of a 2- or 4-bit integer ``onnx_type``; None for every other type."""
    name = _type_name(onnx_type)
    if name not in _INTS:
        return None
    bits, signed = _INTS[name]
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def saturate_int(x: tf.Tensor, onnx_type: int) -> tf.Tensor:
    """Integers clipped to the range of ``onnx_type`` (carried or not), in its TensorFlow dtype."""
    narrow = narrow_int_range(onnx_type)
    if narrow is not None:
        lo, hi = narrow
    else:
        dtype = tf_type(onnx_type)
        lo, hi = dtype.min, dtype.max
    return tf.cast(tf.clip_by_value(tf.cast(x, tf.float64), float(lo), float(hi)), tf_type(onnx_type))
