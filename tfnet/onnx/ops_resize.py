"""ONNX ``Pad`` and ``Resize`` as TensorFlow ops, in the layout their input is held in.

``Pad``: constant, reflect and edge modes (edge as a gather of clipped indices), negative pads as
crops, the opset-18 ``axes`` input. ``Resize``: nearest, linear and cubic modes, separable along each
resized axis, as gathers with weights computed while converting from ONNX's coordinate transformations
(``half_pixel``, ``pytorch_half_pixel``, ``align_corners``, ``asymmetric``, ``tf_half_pixel_for_nn``)
and nearest modes, so results and gradients equal onnxruntime's and PyTorch's; it needs static sizes.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import register

_NCHW_TO_NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _input(node, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _layout(ctx: Ctx, name: str) -> tuple[tf.Tensor, bool]:
    return (ctx.nhwc(name), True) if ctx.is_nhwc(name) else (ctx.plain(name), False)


def _tf_axis(axis: int, nhwc: bool) -> int:
    return _NCHW_TO_NHWC_AXIS[axis] if nhwc else axis


@register("Pad")
def _pad(ctx: Ctx, node, attrs):
    mode = _text(attrs.get("mode", b"constant"))
    if mode not in ("constant", "reflect", "edge"):
        raise OnnxConversionError(f"Pad {node.name!r}: mode {mode!r} is not supported (constant, reflect, edge are).")
    x, nhwc = _layout(ctx, node.input[0])
    rank = x.shape.rank
    pads = ctx.static_ints(node.input[1]) if _input(node, 1) else [int(p) for p in attrs.get("pads", [])]
    if pads is None:
        raise OnnxConversionError(f"Pad {node.name!r}: the pads must be known while converting (a constant).")
    axes = ctx.static_ints(_input(node, 3)) if _input(node, 3) else list(range(rank))
    axes = [a + rank if a < 0 else a for a in axes]
    pairs = [[0, 0] for _ in range(rank)]
    for i, a in enumerate(axes):
        pairs[_tf_axis(a, nhwc)] = [pads[i], pads[i + len(axes)]]
    if any(p < 0 for pair in pairs for p in pair):  # negative pads crop
        x = x[tuple(slice(max(-b, 0), None if e >= 0 else e) for b, e in pairs)]
        pairs = [[max(b, 0), max(e, 0)] for b, e in pairs]
    if mode == "constant":
        value = ctx.static(_input(node, 2)) if _input(node, 2) else attrs.get("value", 0.0)
        if value is None:
            value = ctx.plain(node.input[2])
        y = tf.pad(x, pairs, constant_values=tf.cast(tf.reshape(value, []), x.dtype))
    elif mode == "reflect":
        y = tf.pad(x, pairs, mode="REFLECT")
    else:
        y = x
        for axis, (b, e) in enumerate(pairs):
            if b or e:
                n = y.shape[axis] if y.shape[axis] is not None else tf.shape(y)[axis]
                y = tf.gather(y, tf.clip_by_value(tf.range(-b, n + e), 0, n - 1), axis=axis)
    ctx.set(node.output[0], y, nhwc)


def _sizes(ctx: Ctx, name: str) -> list[int | None] | None:
    """Resize's ``sizes``, where the batch entry may be known only at run time (``Shape(x)[:2]``
    concatenated with constant spatial sizes)."""
    static = ctx.static_ints(name)
    if static is not None:
        return static
    from tensorflow.python.framework import tensor_util

    try:
        shape = tensor_util.constant_value_as_shape(ctx.plain(name))
    except (TypeError, ValueError):
        return None
    return None if shape.rank is None else shape.as_list()


def _source_coordinates(mode: str, out: int, size: int, scale: float) -> np.ndarray:
    x = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":
        return x * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    raise OnnxConversionError(f"coordinate_transformation_mode {mode!r} is not supported.")


def _nearest(coords: np.ndarray, mode: str) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.where(coords - np.floor(coords) == 0.5, np.floor(coords), np.round(coords))
    if mode == "round_prefer_ceil":
        return np.floor(coords + 0.5)
    if mode == "floor":
        return np.floor(coords)
    if mode == "ceil":
        return np.ceil(coords)
    raise OnnxConversionError(f"nearest_mode {mode!r} is not supported.")


@register("Resize")
def _resize(ctx: Ctx, node, attrs):
    mode = _text(attrs.get("mode", b"nearest"))
    coord = _text(attrs.get("coordinate_transformation_mode", b"half_pixel"))
    nearest_mode = _text(attrs.get("nearest_mode", b"round_prefer_floor"))
    if mode not in ("nearest", "linear", "cubic"):
        raise OnnxConversionError(f"Resize {node.name!r}: mode {mode!r} is not supported (nearest, linear, cubic are).")
    if attrs.get("antialias", 0) or _text(attrs.get("keep_aspect_ratio_policy", b"stretch")) != "stretch":
        raise OnnxConversionError(f"Resize {node.name!r}: antialias and keep_aspect_ratio_policy are not supported.")
    x, nhwc = _layout(ctx, node.input[0])
    rank = x.shape.rank
    dims = ctx.plain(node.input[0]).shape.as_list() if not nhwc else [x.shape[i] for i in (0, 3, 1, 2)]
    axes = [a + rank if a < 0 else a for a in attrs.get("axes", range(rank))]
    scales = ctx.static(_input(node, 2)) if _input(node, 2) else None
    sizes = _sizes(ctx, _input(node, 3)) if _input(node, 3) else None
    if (_input(node, 2) and scales is None) or (_input(node, 3) and sizes is None):
        raise OnnxConversionError(f"Resize {node.name!r}: scales and sizes must be known while converting.")
    scales = None if scales is None or np.asarray(scales).size == 0 else [float(s) for s in np.asarray(scales)]
    y = x
    for i, a in enumerate(axes):
        size = dims[a]
        scale = scales[i] if scales is not None else None
        out = sizes[i] if sizes is not None else None
        if (scale is None or scale == 1.0) and (out is None or out == size) or (a < 2 and sizes and out is None):
            continue
        if size is None or a < 2:
            raise OnnxConversionError(
                f"Resize {node.name!r} resizes axis {a} of an input with shape {dims}; tfnet resizes static spatial "
                "axes (2 and up) only.")
        if out is None:
            out = int(math.floor(size * scale))
        if scale is None:
            scale = out / size
        coords = _source_coordinates(coord, out, size, scale)
        axis = _tf_axis(a, nhwc)
        if mode == "nearest":
            idx = np.clip(_nearest(coords, nearest_mode), 0, size - 1).astype(np.int64)
            y = tf.gather(y, tf.constant(idx), axis=axis)
            continue
        shape = [1] * rank
        shape[axis] = out
        taps = _taps(mode, coords, size, attrs.get("cubic_coeff_a", -0.75), attrs.get("exclude_outside", 0))
        y = tf.add_n([tf.gather(y, tf.constant(idx), axis=axis) * tf.constant(wt.reshape(shape), y.dtype)
                      for idx, wt in taps])
    ctx.set(node.output[0], tf.identity(y), nhwc)


def _taps(mode: str, coords: np.ndarray, size: int, a: float, exclude_outside: int) -> list:
    """(source indices, weights) per tap of a linear (2 taps, coordinates clamped, as onnxruntime
    does) or cubic (4 taps, Keys' kernel with coefficient ``a``, indices clamped to the edge) resize."""
    if mode == "linear":
        coords = np.clip(coords, 0, size - 1)
        lo = np.floor(coords).astype(np.int64)
        frac = coords - lo
        return [(lo, 1.0 - frac), (np.minimum(lo + 1, size - 1), frac)]
    base = np.floor(coords).astype(np.int64)
    frac = coords - base
    taps = []
    for offset in (-1, 0, 1, 2):
        d = np.abs(frac - offset)
        w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a)
        idx = base + offset
        if exclude_outside:
            w = np.where((idx < 0) | (idx >= size), 0.0, w)
        taps.append((np.clip(idx, 0, size - 1), w))
    if exclude_outside:
        total = sum(w for _, w in taps)
        taps = [(i, w / total) for i, w in taps]
    return taps
