"""ONNX ``DeformConv`` (19, 22): a 2-D convolution whose every kernel tap reads the input at a learned offset.

As torchvision's ``deform_conv2d`` (which exports to it) and onnx's reference define it: the tap ``(a, b)`` of
output position ``(i, j)`` reads the input at ``(i * stride - pad + a * dilation + dy, j * stride - pad + b *
dilation + dx)``, bilinearly, a neighbour outside the input reading zero, times the mask (modulated deformable
convolution, v2) when one is given; the taps are then weighted as by a (grouped) convolution. The offsets and the mask
are per offset group, a contiguous block of input channels. Here the taps are gathered channels last (one
``gather_nd`` per bilinear neighbour), and the weights applied by one ``einsum``: gradients reach the input, the
offsets, the mask, the weights and the bias. Half precision is computed in float32 and cast back.
"""

from __future__ import annotations

import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import register


def _sample_at(data: tf.Tensor, y: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """``data`` (N, G, H, W, C) read bilinearly at ``(y, x)`` (N, G, ...), zeros outside: (N, G, ..., C)."""
    height, width = (tf.cast(tf.shape(data)[k], y.dtype) if data.shape[k] is None else data.shape[k] for k in (2, 3))
    y0, x0 = tf.floor(y), tf.floor(x)
    total = None
    for ny, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for nx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            inside = (ny >= 0) & (ny <= height - 1) & (nx >= 0) & (nx <= width - 1)
            index = tf.stack([tf.cast(tf.clip_by_value(ny, 0, height - 1), tf.int32),
                              tf.cast(tf.clip_by_value(nx, 0, width - 1), tf.int32)], -1)
            weight = tf.where(inside, wy * wx, tf.zeros([], y.dtype))
            tap = tf.gather_nd(data, index, batch_dims=2) * weight[..., None]
            total = tap if total is None else total + tap
    return total


@register("DeformConv", since=19)
def _deform_conv(ctx: Ctx, node, attrs):
    w = ctx.plain(node.input[1])
    if w.shape.rank != 4:
        raise OnnxConversionError(
            f"DeformConv {node.name!r}: a {w.shape.rank - 2}-D deformable convolution is not converted (2-D is, as "
            "torchvision's deform_conv2d exports it).")
    x = ctx.nhwc(node.input[0])  # (N, H, W, C)
    offset = ctx.nhwc(node.input[2])  # (N, oh, ow, offset groups * kh * kw * 2): the output's spatial size
    bias = ctx.plain(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    mask = ctx.nhwc(node.input[4]) if len(node.input) > 4 and node.input[4] else None
    channels = x.shape[3]
    out_channels, group_channels, *kernel = w.shape
    kernel = [int(k) for k in attrs.get("kernel_shape", kernel)]
    if None in (channels, group_channels, *kernel):
        raise OnnxConversionError(
            f"DeformConv {node.name!r}: the input's channels and the weights' shape must be known while converting "
            f"(input {x.shape} channels last, weights {w.shape}).")
    groups, offset_groups = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
    strides = [int(s) for s in attrs.get("strides", [1, 1])]
    dilations = [int(d) for d in attrs.get("dilations", [1, 1])]
    pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
    taps = kernel[0] * kernel[1]
    if channels != groups * group_channels or channels % offset_groups or \
            (offset.shape[-1] is not None and offset.shape[-1] != offset_groups * taps * 2):
        raise OnnxConversionError(
            f"DeformConv {node.name!r}: {channels} input channels, weights {w.shape} in {groups} group(s) and "
            f"offsets of {offset.shape[-1]} channels for {offset_groups} offset group(s) of a {kernel} kernel do not "
            "agree (ONNX asks for channels = group x weights' axis 1, and 2 x offset groups x kernel taps offsets).")
    dtype = x.dtype if x.dtype in (tf.float32, tf.float64) else tf.float32
    out_h, out_w = (offset.shape[k] if offset.shape[k] is not None else tf.shape(offset)[k] for k in (1, 2))
    n = tf.shape(x)[0]
    # (N, offset groups, taps, oh, ow, 2) offsets; (N, offset groups, taps, oh, ow) mask
    offset = tf.cast(offset, dtype)
    offset = tf.transpose(tf.reshape(offset, [n, out_h, out_w, offset_groups, taps, 2]), [0, 3, 4, 1, 2, 5])
    # where each tap reads before its offset, per axis: the output position's window start plus the tap's place
    ky, kx = tf.meshgrid(tf.range(kernel[0]), tf.range(kernel[1]), indexing="ij")
    rows = tf.reshape(ky, [taps, 1, 1]) * dilations[0] + tf.reshape(tf.range(out_h) * strides[0] - pads[0], [1, -1, 1])
    cols = tf.reshape(kx, [taps, 1, 1]) * dilations[1] + tf.reshape(tf.range(out_w) * strides[1] - pads[1], [1, 1, -1])
    base = [tf.cast(rows, dtype), tf.cast(cols, dtype)]  # (taps, oh, 1) and (taps, 1, ow)
    y = base[0][None, None] + offset[..., 0]  # (N, G, taps, oh, ow)
    x_at = base[1][None, None] + offset[..., 1]
    data = tf.cast(x, dtype)
    height, width = (x.shape[k] if x.shape[k] is not None else tf.shape(x)[k] for k in (1, 2))
    data = tf.transpose(tf.reshape(data, [n, height, width, offset_groups, channels // offset_groups]),
                        [0, 3, 1, 2, 4])  # (N, G, H, W, C / G)
    columns = _sample_at(data, y, x_at)  # (N, G, taps, oh, ow, C / G)
    if mask is not None:
        mask = tf.reshape(tf.cast(mask, dtype), [n, out_h, out_w, offset_groups, taps])
        columns = columns * tf.transpose(mask, [0, 3, 4, 1, 2])[..., None]
    # the channels back in order (offset groups are contiguous blocks), split by convolution group
    columns = tf.transpose(columns, [0, 3, 4, 2, 1, 5])  # (N, oh, ow, taps, G, C / G)
    columns = tf.reshape(columns, [n, out_h, out_w, taps, groups, group_channels])
    kernel_weights = tf.reshape(tf.cast(w, dtype), [groups, out_channels // groups, group_channels, taps])
    out = tf.einsum("nyxtgc,goct->nyxgo", columns, kernel_weights)
    out = tf.reshape(out, [n, out_h, out_w, out_channels])
    if bias is not None:
        out = out + tf.cast(bias, dtype)
    ctx.set(node.output[0], tf.cast(out, x.dtype), nhwc=True)
