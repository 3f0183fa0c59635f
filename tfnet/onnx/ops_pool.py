"""Pooling windows that TensorFlow's pools do not take as they are.

Dilated windows (with strides) and ``auto_pad=SAME_LOWER`` of float max and average pools run on
TensorFlow's pools over explicitly padded strided views or through space-to-batch, as ``tf.nn.pool`` does
(:func:`pool_by_views`). MaxPool's ``Indices`` output, integer inputs, ``LpPool`` and ``GlobalLpPool`` (1, 2
or 3 spatial dimensions) take one strided slice per window offset, reduced together
(:func:`pool_by_offsets`). The output sizes, ``ceil_mode`` and ``count_include_pad`` follow ONNX's
definitions. The common undilated max and average pools keep TensorFlow's own kernels
(:mod:`tfnet.onnx.ops_nn`, :mod:`tfnet.onnx.ops_conv_nd`). ``MaxUnpool`` puts MaxPool's values back at its indices.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register


def window(node, attrs, dims: list[int]) -> tuple[list, list, list, list[tuple[int, int]], list[int]]:
    """``(kernel, strides, dilations, pads, output sizes)`` of an ONNX pool over spatial ``dims``."""
    n = len(dims)
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1] * n))
    dilations = list(attrs.get("dilations", [1] * n))
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    auto_pad = attr_text(attrs.get("auto_pad", b"NOTSET"))
    if any(d is None for d in dims):
        raise OnnxConversionError(f"{node.op_type} {node.name!r} needs static spatial dimensions; it has {dims}.")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(size / s) for size, s in zip(dims, strides)]
        totals = [max((o - 1) * s + span - size, 0) for o, s, span, size in zip(out, strides, spans, dims)]
        small = [t // 2 for t in totals]
        pads = [(t - sm, sm) if auto_pad == "SAME_LOWER" else (sm, t - sm) for t, sm in zip(totals, small)]
        return kernel, strides, dilations, pads, out
    flat = list(attrs.get("pads", [0] * 2 * n)) if auto_pad != "VALID" else [0] * 2 * n
    pads = [(flat[i], flat[i + n]) for i in range(n)]
    out = []
    for size, (b, e), span, s in zip(dims, pads, spans, strides):
        length = size + b + e - span
        o = (-(-length // s) if attrs.get("ceil_mode", 0) else length // s) + 1
        if attrs.get("ceil_mode", 0) and (o - 1) * s >= size + b:  # the last window must start inside
            o -= 1
        out.append(o)
    return kernel, strides, dilations, pads, out


def _offsets(x: tf.Tensor, kernel, strides, dilations, pads, out, fill) -> tuple[list[tf.Tensor], list[tuple]]:
    """Per window offset, the strided slice of channels-last ``x`` (padded with ``fill``) it reads."""
    n = len(kernel)
    dims = x.shape.as_list()[1:-1]
    extra = [max((o - 1) * s + (k - 1) * d + 1 - (size + b + e), 0)
             for o, s, k, d, size, (b, e) in zip(out, strides, kernel, dilations, dims, pads)]
    padding = [[0, 0], *[[b, e + x_] for (b, e), x_ in zip(pads, extra)], [0, 0]]
    padded = tf.pad(x, padding, constant_values=fill) if any(p for pair in padding for p in pair) else x
    slices, offsets = [], []
    for offset in itertools.product(*[range(k) for k in kernel]):
        index = [slice(None)]
        for i in range(n):
            start = offset[i] * dilations[i]
            index.append(slice(start, start + (out[i] - 1) * strides[i] + 1, strides[i]))
        slices.append(padded[tuple(index + [slice(None)])])
        offsets.append(offset)
    return slices, offsets


def pool_by_offsets(node, attrs, x: tf.Tensor, kind: str, p: int = 2):
    """An ONNX pool (``kind`` "max", "avg" or "lp") of channels-last ``x`` (N, spatial..., C), with the
    flat NCHW-order indices of the maxima for ``kind`` "max" (None otherwise)."""
    dims = x.shape.as_list()[1:-1]
    kernel, strides, dilations, pads, out = window(node, attrs, dims)
    if kind == "max":
        fill = x.dtype.min if x.dtype.is_floating or x.dtype.is_integer else 0
        parts, offsets = _offsets(x, kernel, strides, dilations, pads, out, fill)
        stacked = tf.stack(parts, 0)
        return tf.reduce_max(stacked, 0), (stacked, offsets, pads, strides, dilations, dims)
    if kind == "lp":
        parts, _ = _offsets(tf.pow(tf.abs(x), p), kernel, strides, dilations, pads, out, 0)
        return tf.pow(tf.add_n(parts), 1.0 / p), None
    parts, _ = _offsets(x, kernel, strides, dilations, pads, out, 0)
    total = tf.add_n(parts)
    ones = tf.ones([1, *dims, 1], x.dtype)
    if attrs.get("count_include_pad", 0):  # the explicit pads count, what ceil_mode adds does not
        ones = tf.pad(ones, [[0, 0], *[[b, e] for b, e in pads], [0, 0]], constant_values=1)
        counts, _ = _offsets(ones, kernel, strides, dilations, [(0, 0)] * len(dims), out, 0)
    else:
        counts, _ = _offsets(ones, kernel, strides, dilations, pads, out, 0)
    return total / tf.add_n(counts), None


def max_indices(argmax_info, storage_order: int) -> tf.Tensor:
    """Flat indices (row-major N, C, spatial...; column-major spatial when ``storage_order`` is 1) of the
    maxima, channels-last like the pooled values."""
    stacked, offsets, pads, strides, dilations, dims = argmax_info
    best = tf.argmax(stacked, 0, output_type=tf.int64)  # the first offset of equal maxima
    shape = tf.shape(stacked, out_type=tf.int64)[1:]
    n = len(dims)
    table = np.asarray(offsets, np.int64)  # offset number -> window position per spatial axis
    coords = []
    for i in range(n):
        o = tf.range(shape[1 + i], dtype=tf.int64) * strides[i] - pads[i][0]
        o = tf.reshape(o, [1] * (1 + i) + [-1] + [1] * (n - i))
        coords.append(o + tf.gather(table[:, i] * dilations[i], best))
    batch = tf.reshape(tf.range(shape[0], dtype=tf.int64), [-1] + [1] * (n + 1))
    channel = tf.reshape(tf.range(shape[-1], dtype=tf.int64), [1] * (n + 1) + [-1])
    channels = shape[-1]
    if storage_order:
        spatial = tf.zeros_like(coords[0])
        for i in reversed(range(n)):
            spatial = spatial * dims[i] + coords[i]
    else:
        spatial = tf.zeros_like(coords[0])
        for i in range(n):
            spatial = spatial * dims[i] + coords[i]
    return (batch * channels + channel) * int(np.prod(dims)) + spatial


def to_channels_last(x: tf.Tensor) -> tf.Tensor:
    rank = x.shape.rank
    return tf.transpose(x, [0, *range(2, rank), 1])


def from_channels_last(y: tf.Tensor) -> tf.Tensor:
    rank = y.shape.rank
    return tf.transpose(y, [0, rank - 1, *range(1, rank - 1)])


def needs_offsets(node, attrs) -> bool:
    """Whether a max or average pool needs :func:`pool_by_offsets` rather than TensorFlow's pools."""
    n = len(attrs["kernel_shape"])
    return (list(attrs.get("dilations", [1] * n)) != [1] * n or attr_text(attrs.get("auto_pad", b"")) == "SAME_LOWER"
            or len([o for o in node.output if o]) > 1)


def pool_by_views(node, attrs, x: tf.Tensor, kind: str) -> tf.Tensor:
    """An ONNX max or average pool (``kind`` "max" or "avg") of channels-last float ``x`` with dilated windows
    or ``SAME_LOWER``, through TensorFlow's own pools, as ``tf.nn.pool`` does it: on an axis whose stride is a
    multiple of its dilation, every window reads the strided view ``x[::d]`` and is an undilated window there
    (stride ``s / d``); the other dilated axes pool at stride 1 through space-to-batch (``tf.nn.pool``'s
    ``dilations``) and keep every ``s``-th result. Its cost is that of the undilated pool, not one slice
    per window offset."""
    dims = x.shape.as_list()[1:-1]
    n = len(dims)
    kernel, strides, dilations, pads, out = window(node, attrs, dims)
    extra = [max((o - 1) * s + (k - 1) * d + 1 - (size + b + e), 0)
             for o, s, k, d, size, (b, e) in zip(out, strides, kernel, dilations, dims, pads)]
    padding = [[0, 0], *[[b, e + x_] for (b, e), x_ in zip(pads, extra)], [0, 0]]
    fill = x.dtype.min if kind == "max" else 0

    def pooled(t: tf.Tensor, how: str) -> tf.Tensor:
        view, steps, rates = t, [], []
        for i, (s, d) in enumerate(zip(strides, dilations)):
            if d > 1 and s % d == 0:  # every window starts on a multiple of d: an undilated window of x[::d]
                view = view[(slice(None),) * (i + 1) + (slice(None, None, d),)]
                s, d = s // d, 1
            steps.append(s)
            rates.append(d)
        if rates == [1] * n:
            y = tf.nn.pool(view, kernel, how, strides=steps, padding="VALID")
        else:  # space-to-batch at stride 1, then every s-th window
            y = tf.nn.pool(view, kernel, how, strides=[1] * n, padding="VALID", dilations=rates)
            y = y[(slice(None), *[slice(None, None, s) for s in steps])]
        return y[(slice(None), *[slice(0, o) for o in out])]

    padded = tf.pad(x, padding, constant_values=fill) if any(p for pair in padding for p in pair) else x
    if kind == "max":
        return pooled(padded, "MAX")
    ones = tf.ones([1, *dims, 1], x.dtype)  # which positions the mean counts: x, and the pads if counted
    if attrs.get("count_include_pad", 0):
        counted = tf.pad(ones, [[0, 0], *[[b, e] for b, e in pads], [0, 0]], constant_values=1)
        counted = tf.pad(counted, [[0, 0], *[[0, x_] for x_ in extra], [0, 0]])
    else:
        counted = tf.pad(ones, padding)
    return pooled(padded, "AVG") / pooled(counted, "AVG")


def pool(ctx: Ctx, node, attrs, kind: str) -> None:
    """A max or average pool through :func:`pool_by_views` (or :func:`pool_by_offsets` for MaxPool's
    ``Indices`` and integer inputs), in NHWC for 2-D inputs."""
    name = node.input[0]
    two_d = len(attrs["kernel_shape"]) == 2
    x = ctx.nhwc(name) if two_d else to_channels_last(ctx.plain(name))
    if len([o for o in node.output if o]) == 1 and x.dtype.is_floating:
        y = pool_by_views(node, attrs, x, kind)
        if two_d:
            ctx.set(node.output[0], y, nhwc=True)
        else:
            ctx.set(node.output[0], from_channels_last(y))
        return
    y, info = pool_by_offsets(node, attrs, x, kind)
    if two_d:
        ctx.set(node.output[0], y, nhwc=True)
    else:
        ctx.set(node.output[0], from_channels_last(y))
    if len(node.output) > 1 and node.output[1]:
        ctx.set(node.output[1], from_channels_last(max_indices(info, attrs.get("storage_order", 0))))


@register("LpPool", since=11)  # version 11 on: p an integer attribute
def _lp_pool(ctx: Ctx, node, attrs):
    x = to_channels_last(ctx.plain(node.input[0]))
    y, _ = pool_by_offsets(node, attrs, x, "lp", attrs.get("p", 2))
    ctx.set(node.output[0], from_channels_last(y))


@register("GlobalLpPool", since=2)
def _global_lp_pool(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    p = attrs.get("p", 2)
    axes = list(range(2, x.shape.rank))
    ctx.set(node.output[0], tf.pow(tf.reduce_sum(tf.pow(tf.abs(x), p), axes, keepdims=True), 1.0 / p))


@register("MaxUnpool", since=9)
def _max_unpool(ctx: Ctx, node, attrs):
    """MaxPool's inverse: each value written where its ``Indices`` (flat over the whole N, C, spatial tensor, as
    MaxPool gives them) point, in a zero tensor of ``output_shape`` where given (the pool's input's shape: the
    indices address it), else of ``(in - 1) * stride - pads + kernel``. As onnxruntime and PyTorch's
    ``max_unpool`` do; onnx 1.23's reference scatters into the inferred shape and pads it to ``output_shape``,
    which its maintainers call inconsistent (onnx/onnx#8413), so its ``test_maxunpool_export_with_output_shape``
    differs. A value a pool's overlapping windows both picked lands once."""
    x = ctx.plain(node.input[0])
    where = tf.reshape(tf.cast(ctx.plain(node.input[1]), tf.int64), [-1, 1])
    kernel = list(attrs["kernel_shape"])
    n = len(kernel)
    strides = list(attrs.get("strides", [1] * n))
    pads = list(attrs.get("pads", [0] * 2 * n))
    shape = tf.shape(x, out_type=tf.int64)
    if len(node.input) > 2 and node.input[2]:
        out = tf.cast(ctx.plain(node.input[2]), tf.int64)
    else:
        out = tf.concat([shape[:2], (shape[2:] - 1) * strides - [pads[d] + pads[d + n] for d in range(n)] + kernel], 0)
    # an index two windows share is written once (its first value), so that its gradient also reaches one value
    _, group = tf.unique(where[:, 0])
    firsts = tf.math.unsorted_segment_min(tf.range(tf.shape(group)[0]), group,
                                          tf.maximum(tf.reduce_max(group) + 1, 0))  # nothing pooled: no segment
    once = tf.scatter_nd(firsts[:, None], tf.ones_like(firsts, x.dtype), tf.shape(group))
    flat = tf.tensor_scatter_nd_add(tf.zeros(tf.reduce_prod(out)[None], x.dtype), where, tf.reshape(x, [-1]) * once)
    ctx.set(node.output[0], tf.reshape(flat, out))
