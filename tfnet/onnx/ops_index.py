"""ONNX indexing, scattering and rearranging operators as TensorFlow ops.

``GatherElements``, ``GatherND``, ``ScatterND`` and ``ScatterElements`` (every ``reduction``; Swin's
shifted-window mask is a ``ScatterND``), ``OneHot``, ``Trilu`` (a causal mask from ``torch.triu``),
``DepthToSpace`` (``nn.PixelShuffle``) and ``SpaceToDepth`` (in NHWC where the input is held so),
``EyeLike``, ``Compress``, ``NonZero``, ``ReverseSequence``, ``CumProd``, ``Unique`` and ``Det``.
Negative indices count from the end, as ONNX defines them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, plain_inputs, register


def _wrap(indices: tf.Tensor, size) -> tf.Tensor:
    """Negative indices counted from the end of a dimension of ``size``."""
    indices = tf.cast(indices, tf.int64)
    return tf.where(indices < 0, indices + tf.cast(size, tf.int64), indices)


def _positions(shape: tf.Tensor, rank: int) -> list[tf.Tensor]:
    """Per axis, every element's coordinate along it, for a tensor of ``shape``."""
    grids = tf.meshgrid(*[tf.range(shape[i], dtype=tf.int64) for i in range(rank)], indexing="ij")
    return list(grids)


@register("GatherElements", since=11)
def _gather_elements(ctx: Ctx, node, attrs):
    data, indices = plain_inputs(ctx, node)
    rank = data.shape.rank
    axis = attrs.get("axis", 0)
    axis = axis + rank if axis < 0 else axis
    idx = _wrap(indices, tf.shape(data, out_type=tf.int64)[axis])
    coords = _positions(tf.shape(idx, out_type=tf.int64), rank)
    coords[axis] = idx
    ctx.set(node.output[0], tf.gather_nd(data, tf.stack(coords, -1)))


@register("GatherND", since=11)
def _gather_nd(ctx: Ctx, node, attrs):
    data, indices = plain_inputs(ctx, node)
    batch = attrs.get("batch_dims", 0)
    k = indices.shape[-1]
    shape = tf.shape(data, out_type=tf.int64)[batch:batch + k]
    ctx.set(node.output[0], tf.gather_nd(data, _wrap(indices, shape), batch_dims=batch))


_COMBINE = {
    "add": (tf.math.unsorted_segment_sum, tf.add), "mul": (tf.math.unsorted_segment_prod, tf.multiply),
    "max": (tf.math.unsorted_segment_max, tf.maximum), "min": (tf.math.unsorted_segment_min, tf.minimum),
}


def scatter_nd(data: tf.Tensor, indices: tf.Tensor, updates: tf.Tensor, reduction: str) -> tf.Tensor:
    """ONNX ``ScatterND``: ``indices`` (``[..., k]``) address the first ``k`` dimensions of ``data``;
    ``reduction`` none (the last update of an index wins), add, mul, max or min."""
    k = indices.shape[-1]
    if k is None:
        raise OnnxConversionError("ScatterND needs the last dimension of its indices known while converting.")
    shape = tf.shape(data, out_type=tf.int64)
    idx = _wrap(indices, shape[:k])
    strides = tf.math.cumprod(shape[:k], exclusive=True, reverse=True)
    linear = tf.reshape(tf.reduce_sum(idx * strides, -1), [-1])
    rows = tf.reduce_prod(shape[:k])
    flat = tf.reshape(data, tf.concat([[rows], shape[k:]], 0))
    flat_updates = tf.reshape(updates, tf.concat([[-1], shape[k:]], 0))
    if reduction == "none":
        out = tf.tensor_scatter_nd_update(flat, linear[:, None], flat_updates)
    else:
        segment, combine = _COMBINE[reduction]
        hit = tf.math.unsorted_segment_sum(tf.ones_like(linear), linear, rows) > 0
        merged = segment(flat_updates, linear, rows)
        hit = tf.reshape(hit, tf.concat([[rows], tf.ones_like(shape[k:])], 0))
        out = tf.where(hit, combine(flat, merged), flat)
    return tf.reshape(out, shape)


def _reduction(node, attrs) -> str:
    reduction = attr_text(attrs.get("reduction", b"none"))
    if reduction not in ("none", *_COMBINE):
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: reduction {reduction!r} is not supported.")
    return reduction


@register("ScatterND", since=11)
def _scatter_nd(ctx: Ctx, node, attrs):
    data, indices, updates = plain_inputs(ctx, node)
    ctx.set(node.output[0], scatter_nd(data, indices, updates, _reduction(node, attrs)))


@register("ScatterElements", "Scatter", since=9)
def _scatter_elements(ctx: Ctx, node, attrs):
    data, indices, updates = plain_inputs(ctx, node)
    rank = data.shape.rank
    axis = attrs.get("axis", 0)
    axis = axis + rank if axis < 0 else axis
    coords = _positions(tf.shape(indices, out_type=tf.int64), rank)
    coords[axis] = _wrap(indices, tf.shape(data, out_type=tf.int64)[axis])
    ctx.set(node.output[0], scatter_nd(data, tf.stack(coords, -1), updates, _reduction(node, attrs)))


@register("TensorScatter", since=24)
def _tensor_scatter(ctx: Ctx, node, attrs):
    """A key-value cache update: ``update`` written into ``past_cache`` along ``axis`` at each batch
    row's ``write_indices`` (``linear`` mode; ``circular`` wraps around)."""
    cache, update = ctx.plain(node.input[0]), ctx.plain(node.input[1])
    rank = cache.shape.rank
    axis = attrs.get("axis", -2)
    axis = axis + rank if axis < 0 else axis
    mode = attr_text(attrs.get("mode", b"linear"))
    shape = tf.shape(update, out_type=tf.int64)
    starts = ctx.plain(node.input[2]) if len(node.input) > 2 and node.input[2] else tf.zeros(shape[:1], tf.int64)
    coords = _positions(shape, rank)
    position = coords[axis] + tf.reshape(tf.cast(starts, tf.int64), [-1] + [1] * (rank - 1))
    if mode == "circular":
        position = tf.math.floormod(position, tf.shape(cache, out_type=tf.int64)[axis])
    coords[axis] = position
    ctx.set(node.output[0], scatter_nd(cache, tf.stack(coords, -1), update, "none"))


@register("OneHot", since=9)
def _one_hot(ctx: Ctx, node, attrs):
    indices, depth, values = plain_inputs(ctx, node)
    depth_value = ctx.static(node.input[1])
    depth = int(np.asarray(depth_value).reshape(-1)[0]) if depth_value is not None else \
        tf.cast(tf.reshape(depth, []), tf.int32)
    idx = _wrap(tf.cast(indices, tf.int64), depth)
    off, on = values[0], values[1]
    axis = attrs.get("axis", -1)
    axis = axis + indices.shape.rank + 1 if axis < 0 else axis
    ctx.set(node.output[0], tf.one_hot(idx, depth, on, off, axis=axis, dtype=values.dtype))


def _diagonal_offsets(x: tf.Tensor) -> tf.Tensor:
    """``column - row`` for every element of the last two dimensions of ``x``."""
    shape = tf.shape(x, out_type=tf.int64)
    rows = tf.range(shape[-2], dtype=tf.int64)[:, None]
    cols = tf.range(shape[-1], dtype=tf.int64)[None, :]
    return cols - rows


@register("Trilu", since=14)
def _trilu(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    k = ctx.static(node.input[1]) if len(node.input) > 1 and node.input[1] else 0
    k = tf.cast(tf.reshape(ctx.plain(node.input[1]), []), tf.int64) if k is None else int(np.asarray(k).reshape(-1)[0])
    offsets = _diagonal_offsets(x)
    keep = offsets >= k if attrs.get("upper", 1) else offsets <= k
    ctx.set(node.output[0], tf.where(keep, x, tf.zeros_like(x)))


@register("EyeLike", since=9)
def _eye_like(ctx: Ctx, node, attrs):
    from tfnet.onnx.ops import tf_dtype

    x = ctx.plain(node.input[0])
    dtype = tf_dtype(attrs["dtype"]) if "dtype" in attrs else x.dtype
    ctx.set(node.output[0], tf.cast(tf.equal(_diagonal_offsets(x), attrs.get("k", 0)), dtype))


def _block(node, attrs) -> tuple[int, str]:
    return int(attrs["blocksize"]), attr_text(attrs.get("mode", b"DCR"))


@register("DepthToSpace", since=1)  # version 1 had no mode: DCR, the default since
def _depth_to_space(ctx: Ctx, node, attrs):
    b, mode = _block(node, attrs)
    name = node.input[0]
    if mode == "DCR":  # TensorFlow's depth_to_space, in NHWC
        ctx.set(node.output[0], tf.nn.depth_to_space(ctx.nhwc(name), b), nhwc=True)
        return
    x = ctx.plain(name)
    n, c, h, w = _dims(x)
    y = tf.reshape(x, tf.stack([n, c // (b * b), b, b, h, w]))
    y = tf.transpose(y, [0, 1, 4, 2, 5, 3])
    ctx.set(node.output[0], tf.reshape(y, tf.stack([n, c // (b * b), h * b, w * b])))


@register("SpaceToDepth", since=1)
def _space_to_depth(ctx: Ctx, node, attrs):
    b, mode = _block(node, attrs)
    name = node.input[0]
    if mode == "DCR":
        ctx.set(node.output[0], tf.nn.space_to_depth(ctx.nhwc(name), b), nhwc=True)
        return
    x = ctx.plain(name)
    n, c, h, w = _dims(x)
    y = tf.reshape(x, tf.stack([n, c, h // b, b, w // b, b]))
    y = tf.transpose(y, [0, 1, 3, 5, 2, 4])
    ctx.set(node.output[0], tf.reshape(y, tf.stack([n, c * b * b, h // b, w // b])))


def _dims(x: tf.Tensor) -> list:
    """Each dimension of 4-D ``x``: an int where static, else a scalar tensor."""
    dynamic = tf.shape(x)
    return [d if d is not None else dynamic[i] for i, d in enumerate(x.shape.as_list())]


@register("Compress", since=9)
def _compress(ctx: Ctx, node, attrs):
    x, condition = plain_inputs(ctx, node)
    axis = attrs.get("axis")
    if axis is None:
        x, axis = tf.reshape(x, [-1]), 0
    axis = axis + x.shape.rank if axis < 0 else axis
    dim = tf.shape(x)[axis]
    cond = tf.cast(condition, tf.bool)[:dim]  # a shorter condition leaves the rest out
    cond = tf.pad(cond, [[0, dim - tf.shape(cond)[0]]])
    ctx.set(node.output[0], tf.boolean_mask(x, cond, axis=axis))


@register("NonZero", since=9)
def _non_zero(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    found = tf.where(tf.not_equal(x, tf.zeros([], x.dtype)))
    ctx.set(node.output[0], tf.transpose(found) if x.shape.rank else tf.zeros([0, tf.shape(found)[0]], tf.int64))


@register("ReverseSequence", since=10)
def _reverse_sequence(ctx: Ctx, node, attrs):
    x, lens = plain_inputs(ctx, node)
    ctx.set(node.output[0], tf.reverse_sequence(x, tf.cast(lens, tf.int64), seq_axis=attrs.get("time_axis", 0),
                                                batch_axis=attrs.get("batch_axis", 1)))


@register("CumProd", since=26)
def _cumprod(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = ctx.static_ints(node.input[1])
    if axis is None:
        raise OnnxConversionError(f"CumProd {node.name!r}: the axis must be known while converting (a constant).")
    ctx.set(node.output[0], tf.math.cumprod(x, axis=axis[0], exclusive=bool(attrs.get("exclusive", 0)),
                                            reverse=bool(attrs.get("reverse", 0))))


@register("Det", since=11)
def _det(ctx: Ctx, node, attrs):
    ctx.set(node.output[0], tf.linalg.det(ctx.plain(node.input[0])))


@register("Unique", since=11)
def _unique(ctx: Ctx, node, attrs):
    """Unique elements (or slices along ``axis``), sorted (the default) or in order of first
    occurrence, with the index of each one's first occurrence, the inverse indices and the counts."""
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis")
    if axis is None:
        x, axis = tf.reshape(x, [-1]), 0
    axis = axis + x.shape.rank if axis < 0 else axis
    moved = tf.experimental.numpy.moveaxis(x, axis, 0)
    rows = tf.reshape(moved, tf.stack([tf.shape(moved)[0], -1]))
    width = rows.shape[1]
    if width is None:
        raise OnnxConversionError(f"Unique {node.name!r}: the slices along axis {axis} need a static size.")
    _, inverse, _ = tf.raw_ops.UniqueWithCountsV2(x=rows, axis=[0], out_idx=tf.int64)
    n = tf.shape(rows, out_type=tf.int64)[0]
    groups = tf.where(n > 0, tf.reduce_max(inverse) + 1, 0)
    first = tf.math.unsorted_segment_min(tf.range(n), inverse, groups)
    counts = tf.math.unsorted_segment_sum(tf.ones([n], tf.int64), inverse, groups)
    if attrs.get("sorted", 1):  # lexicographic order of the slices: stable sorts, last column first
        values = tf.gather(rows, first)
        order = tf.range(groups)
        for col in range(width - 1, -1, -1):
            order = tf.gather(order, tf.argsort(tf.gather(values[:, col], order), stable=True))
        rank = tf.math.invert_permutation(order)
        first, counts, inverse = tf.gather(first, order), tf.gather(counts, order), tf.gather(rank, inverse)
    unique = tf.gather(moved, first)
    outs = [tf.experimental.numpy.moveaxis(unique, 0, axis), first, inverse, counts]
    for name, value in zip(node.output, outs):
        ctx.set(name, value)
