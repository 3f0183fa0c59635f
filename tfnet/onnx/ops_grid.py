"""ONNX ``GridSample`` (2-D and, from version 20, N-D), ``RoiAlign``, ``MaxRoiPool`` and ``NonMaxSuppression`` as
TensorFlow gathers.

Each output position samples the input at the grid's normalised coordinate (``align_corners``),
``nearest`` (rounded half to even), ``linear`` (2 taps a dimension) or ``cubic`` (4 taps, Keys'
``a = -0.75``); taps outside the input read zeros, the border pixel, or their reflection
(``padding_mode``), as onnx's reference implementation defines them. The taps are gathered from the
input held channels last, one ``gather_nd`` per tap combination, weighted and summed, so that gradients
reach both the input and the grid.
"""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register

_MODES = {"bilinear": "linear", "bicubic": "cubic"}



def _reflect(x: tf.Tensor, lo: float, hi: float) -> tf.Tensor:
    """``x`` reflected by the nearer border until it lies in ``[lo, hi]``."""
    span = hi - lo
    below, above = x < lo, x > hi
    dx = tf.where(below, lo - x, x - hi)
    n = tf.floor(dx / span)
    r = dx - n * span
    even = tf.equal(tf.math.floormod(n, 2.0), 0.0)
    return tf.where(below, tf.where(even, lo + r, hi - r), tf.where(above, tf.where(even, hi - r, lo + r), x))


def _cubic(t: tf.Tensor) -> list[tf.Tensor]:
    a = -0.75

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@register("GridSample", since=16)
def _grid_sample(ctx: Ctx, node, attrs):
    x, grid = ctx.plain(node.input[0]), ctx.plain(node.input[1])
    mode = attr_text(attrs.get("mode", b"linear" if ctx.version >= 20 else b"bilinear"))
    mode = _MODES.get(mode, mode)
    padding = attr_text(attrs.get("padding_mode", b"zeros"))
    corners = bool(attrs.get("align_corners", 0))
    rank = x.shape.rank
    dims = x.shape.as_list()[2:]
    if any(d is None for d in dims) or mode not in ("nearest", "linear", "cubic"):
        raise OnnxConversionError(
            f"GridSample {node.name!r}: mode {mode!r} on an input of shape {x.shape} is not converted (nearest, "
            "linear and cubic on static spatial sizes are).")
    n = len(dims)
    dtype = x.dtype
    data = tf.transpose(x, [0, *range(2, rank), 1])  # channels last
    grid = tf.cast(grid, dtype)
    coords = []
    for i, size in enumerate(dims):  # the grid's last axis lists x (the last dimension) first
        g = grid[..., n - 1 - i]
        c = (g + 1) / 2 * (size - 1) if corners else ((g + 1) * size - 1) / 2
        lo, hi = (0.0, size - 1.0) if corners else (-0.5, size - 0.5)
        if mode == "nearest":
            c = tf.round(c)
        if padding == "border":
            c = tf.where((c < lo) | (c > hi), tf.clip_by_value(c, 0.0, size - 1.0), c)
        elif padding == "reflection":
            c = _reflect(c, lo, hi)
        coords.append((c, size, lo, hi))
    taps = []  # per dimension: [(index, weight)]
    for c, *_ in coords:
        if mode == "nearest":
            taps.append([(c, None)])
            continue
        base = tf.floor(c)
        t = c - base
        weights = [1 - t, t] if mode == "linear" else _cubic(t)
        offsets = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
        taps.append([(base + o, w) for o, w in zip(offsets, weights)])
    total = None
    for combo in itertools.product(*taps):
        indices, valid, weight = [], None, None
        for (index, w), (_, size, lo, hi) in zip(combo, coords):
            if padding == "zeros":
                inside = (index >= 0) & (index <= size - 1)
                valid = inside if valid is None else valid & inside
                index = tf.clip_by_value(index, 0.0, size - 1.0)
            elif padding == "border":
                index = tf.clip_by_value(index, 0.0, size - 1.0)
            else:
                index = tf.clip_by_value(_reflect(index, lo, hi), 0.0, size - 1.0)
            indices.append(tf.cast(index, tf.int64))
            if w is not None:
                weight = w if weight is None else weight * w
        sample = tf.gather_nd(data, tf.stack(indices, -1), batch_dims=1)
        if valid is not None:
            weight = tf.cast(valid, dtype) if weight is None else weight * tf.cast(valid, dtype)
        if weight is not None:
            sample = sample * weight[..., None]
        total = sample if total is None else total + sample
    ctx.set(node.output[0], tf.transpose(total, [0, rank - 1, *range(1, rank - 1)]))


@register("NonMaxSuppression", since=10)
def _non_max_suppression(ctx: Ctx, node, attrs):
    """Per batch entry and class, TensorFlow's ``non_max_suppression`` (greedy, by descending score);
    the selected ``(batch, class, box)`` triples in that order. The batch and class counts must be static. A limit
    past TensorFlow's int32 (torchvision's ``batched_nms`` exports int64's largest: no limit) is no limit."""
    boxes, scores = ctx.plain(node.input[0]), ctx.plain(node.input[1])
    limit = ctx.static_ints(node.input[2]) if len(node.input) > 2 and node.input[2] else [0]
    iou = ctx.static(node.input[3]) if len(node.input) > 3 and node.input[3] else 0.0
    threshold = ctx.static(node.input[4]) if len(node.input) > 4 and node.input[4] else None
    batches, classes = scores.shape[0], scores.shape[1]
    if limit is None or iou is None or (len(node.input) > 4 and node.input[4] and threshold is None) \
            or batches is None or classes is None:
        raise OnnxConversionError(
            f"NonMaxSuppression {node.name!r}: max_output_boxes_per_class, iou_threshold and score_threshold must "
            "be known while converting, and the batch and class counts static.")
    if attrs.get("center_point_box", 0):  # [x_center, y_center, width, height] -> corners
        xc, yc, w, h = tf.unstack(boxes, axis=-1)
        boxes = tf.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], -1)
    found = []
    for b in range(batches):
        for c in range(classes):
            keep = tf.image.non_max_suppression(
                boxes[b], scores[b, c], max_output_size=min(int(limit[0]), 2 ** 31 - 1), iou_threshold=_number(iou),
                score_threshold=_number(threshold) if threshold is not None else float("-inf"))
            keep = tf.cast(keep, tf.int64)[:, None]
            prefix = tf.tile(tf.constant([[b, c]], tf.int64), tf.stack([tf.shape(keep)[0], 1]))
            found.append(tf.concat([prefix, keep], 1))
    ctx.set(node.output[0], tf.concat(found, 0) if found else tf.zeros([0, 3], tf.int64))


def _number(value) -> float:
    return float(np.asarray(value).reshape(-1)[0])


@register("RoiAlign", since=10)
def _roi_align(ctx: Ctx, node, attrs):
    """Each region of interest cut into ``output_height x output_width`` bins, each bin the average (or maximum) of
    ``sampling_ratio``\\ :sup:`2` bilinear samples, as onnx's reference (Caffe2's and onnxruntime's kernel) computes
    them: samples more than one pixel outside the map are zeros and count, coordinates are clamped to the map, and
    ``max`` takes the largest of the four weighted taps. ``sampling_ratio`` 0 (adaptive: ``ceil(roi size / bins)``
    samples a side, per region) samples every region on the largest region's grid and masks what lies beyond its own,
    so its memory grows with the largest region. ``half_pixel`` (the default from version 16) shifts the regions by
    half a pixel; ``output_half_pixel`` (version 10's only mode) does not and makes a region at least 1 x 1. The
    gradient reaches the feature map, not the regions (as torchvision's)."""
    x = ctx.nhwc(node.input[0])  # (N, H, W, C): one gather reads every channel of a tap
    rois, batch = ctx.plain(node.input[1]), tf.cast(ctx.plain(node.input[2]), tf.int64)
    dtype = x.dtype if x.dtype in (tf.float32, tf.float64) else tf.float32  # half precision sums in float32
    data = tf.cast(x, dtype)
    out_h, out_w = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    mode = attr_text(attrs.get("mode", b"avg"))
    half = ctx.version >= 16 and attr_text(attrs.get("coordinate_transformation_mode", b"half_pixel")) == "half_pixel"
    if mode not in ("avg", "max"):
        raise OnnxConversionError(f"RoiAlign {node.name!r}: mode {mode!r} is not one of 'avg' and 'max'.")
    # the regions are read, not differentiated, as torchvision's roi_align (and Detectron2's) defines its gradient: a
    # detector's heads train on their boxes as given
    boxes = tf.cast(tf.stop_gradient(rois), dtype) * scale - (0.5 if half else 0.0)  # x1, y1, x2, y2
    sizes = tf.shape(data, out_type=tf.int64)
    axes = []  # per axis (y, then x): taps (low, high index), weights (low, high), inside, grid mask, samples a side
    for start, end, bins, size in ((boxes[:, 1], boxes[:, 3], out_h, sizes[1]), (boxes[:, 0], boxes[:, 2], out_w,
                                                                                   sizes[2])):
        extent = end - start
        if not half:
            extent = tf.maximum(extent, 1.0)
        step = extent / bins
        if ratio > 0:
            grid = tf.fill(tf.shape(start), tf.constant(ratio, dtype))
            most = tf.constant(ratio, tf.int64)
        else:
            grid = tf.math.ceil(step)
            most = tf.maximum(tf.cast(tf.reduce_max(tf.concat([grid, [1.0]], 0)), tf.int64), 1)
        k = tf.cast(tf.range(most), dtype)
        # (R, bins, samples): the bin's start plus (k + 1/2) sample steps
        at = ((start[:, None, None] + tf.range(bins, dtype=dtype)[None, :, None] * step[:, None, None])
              + (k[None, None, :] + 0.5) * step[:, None, None] / tf.maximum(grid, 1.0)[:, None, None])
        on_grid = k[None, None, :] < grid[:, None, None]
        limit = tf.cast(size, dtype)
        # The one step of the sampling: a sample more than a pixel outside reads zero. A sample exactly on that edge
        # (an integer region cut in thirds) lands a rounding either side of it, by the order TensorFlow's optimiser
        # gives the sums and products; within a few roundings it is inside, as it is in exact arithmetic.
        slack = 8 * np.finfo(dtype.as_numpy_dtype).eps * (limit + 1.0)
        inside = (at >= -1.0 - slack) & (at <= limit + slack)
        at = tf.maximum(at, 0.0)
        low = tf.floor(at)
        last = low >= limit - 1
        low = tf.where(last, limit - 1, low)
        at = tf.where(last, low, at)
        high = tf.where(last, low, low + 1)
        frac = at - low
        axes.append(((tf.cast(low, tf.int64), tf.cast(high, tf.int64)), (1 - frac, frac), inside, on_grid, grid))
    (ys, wy, in_y, grid_y, count_y), (xs, wx, in_x, grid_x, count_x) = axes
    r = tf.shape(rois, out_type=tf.int64)[0]
    shape = tf.stack([r, out_h, tf.shape(ys[0], out_type=tf.int64)[2], out_w, tf.shape(xs[0], out_type=tf.int64)[2]])
    b = tf.broadcast_to(batch[:, None, None, None, None], shape)
    taps = []  # (R, out_h, samples, out_w, samples, C) per corner, weighted
    for yi, y_weight in zip(ys, wy):
        for xi, x_weight in zip(xs, wx):
            index = tf.stack([b, tf.broadcast_to(yi[:, :, :, None, None], shape),
                              tf.broadcast_to(xi[:, None, None, :, :], shape)], -1)
            weight = y_weight[:, :, :, None, None] * x_weight[:, None, None, :, :]
            taps.append(tf.gather_nd(data, index) * weight[..., None])
    inside = (in_y[:, :, :, None, None] & in_x[:, None, None, :, :])[..., None]
    on_grid = (grid_y[:, :, :, None, None] & grid_x[:, None, None, :, :])[..., None]
    if mode == "avg":
        total = tf.where(inside & on_grid, tf.add_n(taps), tf.zeros([], dtype))
        count = tf.maximum(count_y * count_x, 1.0)[:, None, None, None]
        pooled = tf.reduce_sum(total, [2, 4]) / count
    else:
        sample = tf.where(inside, tf.reduce_max(tf.stack(taps), 0), tf.zeros([], dtype))  # outside: 0, and counted
        sample = tf.where(on_grid, sample, tf.constant(float("-inf"), dtype))
        pooled = tf.reduce_max(sample, [2, 4])
        pooled = tf.where(tf.math.is_inf(pooled), tf.zeros([], dtype), pooled)  # a region with no sample: 0
    ctx.set(node.output[0], tf.cast(pooled, x.dtype), nhwc=True)  # (R, out_h, out_w, C)


@register("MaxRoiPool", since=1)
def _max_roi_pool(ctx: Ctx, node, attrs):
    """Fast R-CNN's region pooling, as torchvision's ``roi_pool`` (which the legacy exporter writes as this operator),
    Caffe and onnxruntime's kernel compute it: a region's corners scaled by ``spatial_scale`` and rounded half away
    from zero, the region at least one pixel a side, cut into ``pooled_shape`` bins of whole pixels (from the floor of
    a bin's start to the ceiling of its end, clipped to the map); each bin's maximum, 0 for an empty bin. One region
    at a time (``tf.map_fn``), the maxima taken along the width, then the height: memory for one region's
    (H, bins, W, C), not every region's. The gradient reaches the feature map (shared between equal maxima, where
    torchvision gives it to the first), not the regions."""
    x = ctx.nhwc(node.input[0])  # (N, H, W, C)
    rois = tf.stop_gradient(ctx.plain(node.input[1]))  # (R, 5): batch index, x1, y1, x2, y2
    if "pooled_shape" not in attrs:
        raise OnnxConversionError(f"MaxRoiPool {node.name!r}: the pooled_shape attribute is missing (ONNX requires it).")
    bins = [int(v) for v in attrs["pooled_shape"]]
    scale = float(attrs.get("spatial_scale", 1.0))
    real = rois.dtype if rois.dtype in (tf.float32, tf.float64) else tf.float32
    scaled = tf.cast(rois[:, 1:], real) * tf.constant(scale, real)
    corners = tf.cast(tf.sign(scaled) * tf.floor(tf.abs(scaled) + 0.5), tf.int32)  # C's round()
    sizes = tf.shape(x)[1:3]
    masks = []  # per axis (y, then x): (R, bins, size), which pixels each bin of each region covers
    for start, end, count, size in ((corners[:, 1], corners[:, 3], bins[0], sizes[0]),
                                    (corners[:, 0], corners[:, 2], bins[1], sizes[1])):
        step = tf.cast(tf.maximum(end - start + 1, 1), real) / count
        k = tf.range(count, dtype=real)[None, :]
        low = tf.clip_by_value(tf.cast(tf.floor(k * step[:, None]), tf.int32) + start[:, None], 0, size)
        high = tf.clip_by_value(tf.cast(tf.math.ceil((k + 1) * step[:, None]), tf.int32) + start[:, None], 0, size)
        at = tf.range(size)[None, None, :]
        masks.append((at >= low[..., None]) & (at < high[..., None]))
    lowest = tf.constant(float("-inf"), x.dtype)

    def pool(region):
        b, rows, cols = region  # (), (bins_y, H), (bins_x, W)
        feature = tf.gather(x, b)  # (H, W, C)
        across = tf.reduce_max(tf.where(cols[None, :, :, None], feature[:, None, :, :], lowest), axis=2)
        pooled = tf.reduce_max(tf.where(rows[:, :, None, None], across[None], lowest), axis=1)  # (bins_y, bins_x, C)
        return tf.where(tf.equal(pooled, lowest), tf.zeros([], x.dtype), pooled)  # an empty bin: 0

    pooled = tf.map_fn(pool, (tf.cast(rois[:, 0], tf.int32), masks[0], masks[1]),
                       fn_output_signature=tf.TensorSpec([bins[0], bins[1], x.shape[3]], x.dtype))
    ctx.set(node.output[0], pooled, nhwc=True)  # (R, bins_y, bins_x, C)
