"""ONNX ``Pad`` and ``Resize`` as TensorFlow ops, in the layout their input is held in.

``Pad``: constant, reflect and edge modes (edge as a gather of clipped indices), negative pads as
crops, the opset-18 ``axes`` input. ``Resize``: nearest, linear and cubic modes, separable along each
resized axis, as gathers with weights computed while converting from ONNX's coordinate transformations
(``half_pixel``, ``pytorch_half_pixel``, ``align_corners``, ``asymmetric``, ``tf_half_pixel_for_nn``)
and nearest modes, so results and gradients equal onnxruntime's and PyTorch's. Sizes known only at run time take
:mod:`tfnet.onnx.resize_run_time` (nearest, linear, cubic).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx import resize_run_time
from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register

_NCHW_TO_NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}



def _input(node, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _layout(ctx: Ctx, name: str) -> tuple[tf.Tensor, bool]:
    return (ctx.nhwc(name), True) if ctx.is_nhwc(name) else (ctx.plain(name), False)


def _tf_axis(axis: int, nhwc: bool) -> int:
    return _NCHW_TO_NHWC_AXIS[axis] if nhwc else axis


@register("Pad", since=2)  # version 1 named the pads paddings
def _pad(ctx: Ctx, node, attrs):
    mode = attr_text(attrs.get("mode", b"constant"))
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise OnnxConversionError(f"Pad {node.name!r}: mode {mode!r} is not supported (constant, reflect, edge, wrap are).")
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
    elif mode == "wrap":  # version 19: the other end of the axis, as numpy.pad(mode="wrap")
        y = x
        for axis, (b, e) in enumerate(pairs):
            if b or e:
                n = y.shape[axis] if y.shape[axis] is not None else tf.shape(y)[axis]
                y = tf.gather(y, tf.math.floormod(tf.range(-b, n + e), n), axis=axis)
    else:
        y = x
        for axis, (b, e) in enumerate(pairs):
            if b or e:
                n = y.shape[axis] if y.shape[axis] is not None else tf.shape(y)[axis]
                y = tf.gather(y, tf.clip_by_value(tf.range(-b, n + e), 0, n - 1), axis=axis)
    ctx.set(node.output[0], y, nhwc)


def _resize_at_run_time(ctx: Ctx, node, attrs, x, nhwc, dims, mode, axes, scales, sizes, scale_values,
                        size_values) -> None:
    """Resize where a size is known only at run time (:mod:`tfnet.onnx.resize_run_time`) of ``x`` (held in NHWC with
    ``nhwc``; ``dims`` its ONNX shape)."""
    coord = attr_text(attrs.get("coordinate_transformation_mode", b"half_pixel"))
    nearest = attr_text(attrs.get("nearest_mode", b"round_prefer_floor"))
    resize_run_time.check(node.name, mode, coord, nearest, attr_text(attrs.get("keep_aspect_ratio_policy", b"stretch")),
                          bool(attrs.get("antialias", 0)))
    if sizes:
        wanted = tf.cast(ctx.plain(sizes), tf.int64)
        known = size_values or [None] * len(axes)
    else:
        factors = scale_values if scale_values is not None else tf.cast(ctx.plain(scales), tf.float64)
    y = x
    for i, a in enumerate(axes):
        axis = _tf_axis(a, nhwc)
        if sizes:
            if (known[i] is not None and known[i] == dims[a]) or (known[i] is None and dims[a] is None and a < 2):
                continue  # as the while-converting path: a batch of run-time size keeps it
            out, scale = wanted[i], None
        else:
            scale = factors[i]
            if isinstance(scale, float) and scale == 1.0:
                continue
            scale = tf.cast(scale, tf.float64)
            out = tf.cast(tf.floor(tf.cast(tf.shape(y)[axis], tf.float64) * scale), tf.int64)
        y = resize_run_time.resize_axis(y, axis, out, scale, mode, coord, nearest, attrs.get("cubic_coeff_a", -0.75),
                                        bool(attrs.get("exclude_outside", 0)))
    ctx.set(node.output[0], tf.identity(y), nhwc)


def _sizes(ctx: Ctx, name: str) -> list[int | None] | None:
    """Resize's ``sizes``, where the batch entry may be known only at run time (``Shape(x)[:2]``
    concatenated with the spatial sizes of another tensor, as PyTorch writes
    ``F.interpolate(x, size=y.shape[-2:])``)."""
    return ctx.partial_ints(name)


def _coordinates(mode: str, out: int, size: int, scale: float, roi) -> tuple[np.ndarray, np.ndarray | None]:
    """Source coordinates of the ``out`` output positions along an axis of ``size`` (ONNX's
    ``coordinate_transformation_mode``), and for ``tf_crop_and_resize`` which fall outside the input."""
    y = np.arange(out, dtype=np.float64)
    width = scale * size  # the output length before rounding: align_corners and half_pixel_symmetric use it
    outside = None
    if mode == "align_corners":
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        start, end = roi
        x = np.full(out, (end - start) * (size - 1) / 2) if width == 1 else y * (end - start) * (size - 1) / (width - 1)
        x = x + start * (size - 1)
        outside = (x < 0) | (x > size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        x = size / 2 * (1 - out / width) + (y + 0.5) / scale - 0.5
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    else:
        raise OnnxConversionError(f"coordinate_transformation_mode {mode!r} is not supported.")
    return x, outside


def _nearest_coeffs(ratio: float, mode: str) -> list[float]:
    if ratio == 1.0:  # an exact source position
        return [0.0, 1.0]
    if mode == "round_prefer_floor":
        return [float(ratio <= 0.5), float(ratio > 0.5)]
    if mode == "round_prefer_ceil":
        return [float(ratio < 0.5), float(ratio >= 0.5)]
    if mode == "floor":
        return [1.0, 0.0]
    if mode == "ceil":
        return [0.0, 1.0]
    raise OnnxConversionError(f"nearest_mode {mode!r} is not supported.")


def _cubic_coeffs(ratio: float, scale: float, a: float, antialias: bool) -> list[float]:
    def kernel(x):
        x = abs(x)
        if x <= 1:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2:
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return 0.0

    if not antialias:
        return [kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)]
    scale = min(scale, 1.0)
    start = int(np.floor(-2 / scale) + 1)
    coeffs = [kernel(scale * (i - ratio)) for i in range(start, 2 - start)]
    return [c / sum(coeffs) for c in coeffs]


def _linear_coeffs(ratio: float, scale: float, antialias: bool) -> list[float]:
    if not antialias:
        return [1 - ratio, ratio]
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
    coeffs = np.clip(1 - np.abs(args), 0, 1)
    return list(coeffs / coeffs.sum())


def axis_taps(attrs, mode: str, size: int, out: int, scale: float, roi=None):
    """ONNX's resize along one axis as ``(indices, weights, outside)``: each output position is
    ``sum_j weights[:, j] * input[indices[:, j]]`` (indices clamped to the edge), and positions in
    ``outside`` (``tf_crop_and_resize`` only, else None) take ``extrapolation_value``. As onnx's
    reference implementation (onnx.reference.ops.op_resize) computes it."""
    coord = attr_text(attrs.get("coordinate_transformation_mode", b"half_pixel"))
    x, outside = _coordinates(coord, out, size, scale, roi)
    base = np.floor(x).astype(np.int64)
    ratios = np.where(x == base, 1.0, x - base)  # ratio in (0, 1]: prefer the pixel left of x
    antialias = bool(attrs.get("antialias", 0))
    if mode == "nearest":
        nearest = attr_text(attrs.get("nearest_mode", b"round_prefer_floor"))
        coeffs = np.asarray([_nearest_coeffs(r, nearest) for r in ratios])
    elif mode == "linear":
        coeffs = np.asarray([_linear_coeffs(r, scale, antialias) for r in ratios])
    else:
        a = attrs.get("cubic_coeff_a", -0.75)
        coeffs = np.asarray([_cubic_coeffs(r, scale, a, antialias) for r in ratios])
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    padded = x + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    indices = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if attrs.get("exclude_outside", 0):
        coeffs = np.where((indices < 0) | (indices >= size), 0.0, coeffs)
        total = coeffs.sum(-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(indices, 0, size - 1), coeffs, outside


@register("Resize", since=10)  # version 10: (X, scales), asymmetric coordinates and floor for nearest
def _resize(ctx: Ctx, node, attrs):
    attrs = dict(attrs)
    if ctx.version < 11:
        attrs.update(coordinate_transformation_mode=b"asymmetric", nearest_mode=b"floor")
        _resize_with(ctx, node, attrs, roi="", scales=_input(node, 1), sizes="")
    else:
        _resize_with(ctx, node, attrs, roi=_input(node, 1), scales=_input(node, 2), sizes=_input(node, 3))


@register("Upsample", since=7)  # deprecated: nearest (repeat) or linear, asymmetric coordinates
def _upsample(ctx: Ctx, node, attrs):
    attrs = dict(attrs, coordinate_transformation_mode=b"asymmetric", nearest_mode=b"floor")
    if ctx.version < 9:
        scales = np.asarray(attrs["scales"], np.float32)
        ctx.set(node.output[0] + "/scales", tf.constant(scales))
        _resize_with(ctx, node, attrs, roi="", scales=node.output[0] + "/scales", sizes="")
    else:
        _resize_with(ctx, node, attrs, roi="", scales=node.input[1], sizes="")


def _resize_with(ctx: Ctx, node, attrs, roi: str, scales: str, sizes: str) -> None:
    mode = attr_text(attrs.get("mode", b"nearest"))
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise OnnxConversionError(f"Resize {node.name!r}: mode {mode!r} is not supported (nearest, linear, cubic are).")
    x, nhwc = _layout(ctx, node.input[0])
    rank = x.shape.rank
    dims = ctx.plain(node.input[0]).shape.as_list() if not nhwc else [x.shape[i] for i in (0, 3, 1, 2)]
    axes = [a + rank if a < 0 else a for a in attrs.get("axes", range(rank))]
    scale_values = ctx.static(scales) if scales else None
    size_values = _sizes(ctx, sizes) if sizes else None
    roi_values = ctx.static(roi) if roi else None
    unknown_size = size_values is not None and any(
        v is None and (a >= 2 or dims[a] is not None) for v, a in zip(size_values, axes))  # only a dynamic batch
    if (scales and scale_values is None) or (sizes and size_values is None) or unknown_size or any(
            dims[a] is None and a >= 2 for a in axes):
        _resize_at_run_time(ctx, node, attrs, x, nhwc, dims, mode, axes, scales, sizes, scale_values, size_values)
        return
    scale_values = None if scale_values is None or np.asarray(scale_values).size == 0 else \
        [float(s) for s in np.asarray(scale_values)]
    size_values = None if size_values is None or len(size_values) == 0 else size_values
    if scale_values is None and size_values is None:
        raise OnnxConversionError(f"Resize {node.name!r} has neither scales nor sizes.")
    roi_values = None if roi_values is None or np.asarray(roi_values).size == 0 else \
        np.asarray(roi_values, np.float64).reshape(-1)
    policy = attr_text(attrs.get("keep_aspect_ratio_policy", b"stretch"))
    if size_values is not None and policy != "stretch":
        known = [(s, dims[a]) for s, a in zip(size_values, axes)]
        if any(d is None or o is None for o, d in known):
            raise OnnxConversionError(f"Resize {node.name!r}: keep_aspect_ratio_policy needs static sizes.")
        ratio = (min if policy == "not_larger" else max)(o / d for o, d in known)
        scale_values = [ratio] * len(axes)
        size_values = [int(ratio * d + 0.5) for _, d in known]
    crop = attr_text(attrs.get("coordinate_transformation_mode", b"")) == "tf_crop_and_resize"
    if crop and roi_values is None:
        raise OnnxConversionError(f"Resize {node.name!r}: tf_crop_and_resize needs a constant roi.")
    y = x
    for i, a in enumerate(axes):
        size = dims[a]
        out = size_values[i] if size_values is not None else None
        scale = scale_values[i] if scale_values is not None else None
        span = (roi_values[i], roi_values[i + len(axes)]) if crop else None
        unchanged = (out is None or out == size) and (scale is None or scale == 1.0) and \
            (span is None or (span[0] == 0.0 and span[1] == 1.0))
        if unchanged or (size is None and out is None and scale == 1.0):
            continue
        if size is None:  # the batch or channel axis, of a size known only at run time, resized by a scale
            raise OnnxConversionError(f"Resize {node.name!r} resizes axis {a}, of a size known only at run time.")
        if out is None:
            out = int(size * scale)
        if scale is None or size_values is not None and policy == "stretch":
            scale = out / size
        indices, weights, outside = axis_taps(attrs, mode, size, out, scale, span)
        axis = _tf_axis(a, nhwc)
        shape = [1] * rank
        shape[axis] = out
        if mode == "nearest":
            picked = indices[np.arange(out), np.argmax(weights, 1)]
            y = tf.gather(y, tf.constant(picked), axis=axis)
        else:
            y = tf.add_n([tf.gather(y, tf.constant(indices[:, j]), axis=axis) *
                          tf.constant(weights[:, j].reshape(shape), y.dtype) for j in range(indices.shape[1])
                          if np.any(weights[:, j])])
        if outside is not None and outside.any():
            fill = tf.cast(attrs.get("extrapolation_value", 0.0), y.dtype)
            y = tf.where(tf.constant(outside.reshape(shape)), fill, y)
    ctx.set(node.output[0], tf.identity(y), nhwc)
