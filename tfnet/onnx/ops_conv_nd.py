"""ONNX ``Conv``, ``MaxPool`` and ``AveragePool`` of every rank (2-D ones through :mod:`tfnet.onnx.ops_nn`'s
NHWC helpers, 1-D and 3-D ones here), and ``ConvTranspose`` (1-D, 2-D, 3-D), as TensorFlow ops.

A 1-D op runs as the 2-D one on a height-1 NHWC image (``(N, C, L) -> (N, 1, L, C)``), so it shares
the 2-D code's padding, grouping and ``ceil_mode``. A 3-D op runs in NDHWC with explicit padding.
``ConvTranspose`` is TensorFlow's ``conv2d_transpose`` or ``conv3d_transpose`` without padding,
cropped by ONNX's ``pads``.
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register
from tfnet.onnx.ops_nn import conv_nhwc, pool_nhwc

_TO_NDHWC, _TO_NCDHW = (0, 2, 3, 4, 1), (0, 4, 1, 2, 3)


def _as_2d(attrs) -> dict:
    """1-D attributes as those of the same op on a height-1 image."""
    a = dict(attrs)
    for key, fill in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("output_padding", 0), ("output_shape", 1)):
        if key in a:
            a[key] = [fill, *a[key]]
    if "pads" in a:
        a["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
    return a


def _to_image(x):  # (N, C, L) -> (N, 1, L, C)
    return tf.expand_dims(tf.transpose(x, [0, 2, 1]), 1)


def _from_image(y):  # (N, 1, L, C) -> (N, C, L)
    return tf.transpose(tf.squeeze(y, 1), [0, 2, 1])


def _bias(ctx, node):
    return ctx.plain(node.input[2]) if len(node.input) > 2 and node.input[2] else None


def conv_nd(ctx: Ctx, node, attrs) -> None:
    x, w, b = ctx.plain(node.input[0]), ctx.plain(node.input[1]), _bias(ctx, node)
    if w.shape.rank == 3:
        y = conv_nhwc(node, _as_2d(attrs), _to_image(x), w[:, :, None, :])
        ctx.set(node.output[0], _from_image(y if b is None else tf.nn.bias_add(y, b)))
        return
    if w.shape.rank != 5:
        raise OnnxConversionError(f"Conv {node.name!r}: a {w.shape.rank - 2}-D kernel is not supported (1-D, 2-D, 3-D are).")
    x = tf.transpose(x, _TO_NDHWC)
    kernel = list(attrs.get("kernel_shape", w.shape.as_list()[2:]))
    strides, dilations = list(attrs.get("strides", [1] * 3)), list(attrs.get("dilations", [1] * 3))
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    x = tf.pad(x, [[0, 0], *_pads_3d(node, attrs, x, spans, strides), [0, 0]])
    group = attrs.get("group", 1)
    parts = [_conv3d(a, tf.transpose(k, [2, 3, 4, 1, 0]), strides, dilations)
             for a, k in zip(tf.split(x, group, axis=4), tf.split(w, group, axis=0))]
    y = parts[0] if group == 1 else tf.concat(parts, axis=4)
    ctx.set(node.output[0], tf.transpose(y if b is None else tf.nn.bias_add(y, b), _TO_NCDHW))


def _conv3d(x: tf.Tensor, kernel: tf.Tensor, strides: list[int], dilations: list[int]) -> tf.Tensor:
    """A VALID 3-D convolution of padded NDHWC ``x`` with DHWIO ``kernel``. Dilated ones run as
    ``tf.nn.convolution`` runs them (space-to-batch, at stride 1; every ``s``-th result kept): TensorFlow's
    CPU ``Conv3D`` takes no dilations."""
    if dilations == [1, 1, 1]:
        return tf.nn.conv3d(x, kernel, [1, *strides, 1], "VALID")
    y = tf.nn.convolution(x, kernel, padding="VALID", dilations=dilations)
    return y if strides == [1, 1, 1] else y[:, ::strides[0], ::strides[1], ::strides[2], :]


def _pads_3d(node, attrs, x, kernel, strides) -> list[list[int]]:
    """(begin, end) per spatial dimension of NDHWC ``x``, from ``pads``, ``auto_pad`` and ``ceil_mode``."""
    dims = x.shape.as_list()[1:4]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = attr_text(auto_pad)
    if auto_pad == "VALID":
        return [[0, 0]] * 3
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") or attrs.get("ceil_mode", 0):
        if any(d is None for d in dims):
            raise OnnxConversionError(f"{node.op_type} {node.name!r}: auto_pad or ceil_mode needs static spatial dimensions.")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s in zip(dims, kernel, strides):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            small, big = total // 2, total - total // 2
            out.append([small, big] if auto_pad == "SAME_UPPER" else [big, small])
        return out
    pads = list(attrs.get("pads", [0] * 6))
    pairs = [[pads[i], pads[i + 3]] for i in range(3)]
    if attrs.get("ceil_mode", 0):
        for i, (size, k, s) in enumerate(zip(dims, kernel, strides)):
            span = size + pairs[i][0] + pairs[i][1] - k
            extra = (-(-span // s) - span // s) * s
            if extra and (-(-span // s)) * s >= size + pairs[i][0]:  # the last window must start inside
                extra = 0
            pairs[i][1] += extra
    return pairs


def pool_nd(ctx: Ctx, node, attrs, kind: str) -> None:
    if len([o for o in node.output if o]) > 1:
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: the Indices output is not supported.")
    x = ctx.plain(node.input[0])
    kernel = list(attrs["kernel_shape"])
    if len(kernel) == 1:
        ctx.set(node.output[0], _from_image(pool_nhwc(node, _as_2d(attrs), _to_image(x), kind)))
        return
    if len(kernel) != 3:
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: a {len(kernel)}-D window is not supported.")
    strides = list(attrs.get("strides", [1, 1, 1]))
    x = tf.transpose(x, _TO_NDHWC)
    pads = [[0, 0], *_pads_3d(node, attrs, x, kernel, strides), [0, 0]]
    k5, s5 = [1, *kernel, 1], [1, *strides, 1]
    if kind == "max":
        y = tf.nn.max_pool3d(tf.pad(x, pads, constant_values=x.dtype.min), k5, s5, "VALID")
    else:
        y = tf.nn.avg_pool3d(tf.pad(x, pads), k5, s5, "VALID")
        if any(p for pair in pads for p in pair) and not attrs.get("count_include_pad", 0):
            ones = tf.pad(tf.ones_like(x[:1, :, :, :, :1]), pads)
            y = y / tf.nn.avg_pool3d(ones, k5, s5, "VALID")
    ctx.set(node.output[0], tf.transpose(y, _TO_NCDHW))


@register("ConvTranspose", since=1)
def _conv_transpose(ctx: Ctx, node, attrs):
    w, b = ctx.plain(node.input[1]), _bias(ctx, node)
    if w.shape.rank == 3:
        y = _conv_transpose_channels_last(node, _as_2d(attrs), _to_image(ctx.plain(node.input[0])), w[:, :, None, :])
        ctx.set(node.output[0], _from_image(y if b is None else tf.nn.bias_add(y, b)))
        return
    if w.shape.rank == 5:
        x = tf.transpose(ctx.plain(node.input[0]), _TO_NDHWC)
        y = _conv_transpose_channels_last(node, attrs, x, w)
        ctx.set(node.output[0], tf.transpose(y if b is None else tf.nn.bias_add(y, b), _TO_NCDHW))
        return
    if w.shape.rank != 4:
        raise OnnxConversionError(f"ConvTranspose {node.name!r}: a {w.shape.rank - 2}-D kernel is not supported.")
    y = _conv_transpose_channels_last(node, attrs, ctx.nhwc(node.input[0]), w)
    ctx.set(node.output[0], y if b is None else tf.nn.bias_add(y, b), nhwc=True)


def _conv_transpose_channels_last(node, attrs, x, w):
    """ONNX ``ConvTranspose`` of channels-last ``x`` (NHWC or NDHWC) with kernel ``w``
    (``C_in, C_out / group, *window``)."""
    n = x.shape.rank - 2
    dims = x.shape.as_list()[1:-1]
    if any(d is None for d in dims):
        raise OnnxConversionError(f"ConvTranspose {node.name!r} needs static spatial dimensions; input has shape {x.shape}.")
    dilations = list(attrs.get("dilations", [1] * n))
    if dilations != [1] * n:  # a dilated kernel is the kernel with zeros between its taps
        w = _dilate(w, dilations)
    kernel = w.shape.as_list()[2:]
    strides = list(attrs.get("strides", [1] * n))
    extra = list(attrs.get("output_padding", [0] * n))
    full = [(d - 1) * s + k + e for d, s, k, e in zip(dims, strides, kernel, extra)]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = attr_text(auto_pad)
    if "output_shape" in attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        want = list(attrs["output_shape"])[-n:] if "output_shape" in attrs else [d * s for d, s in zip(dims, strides)]
        totals = [f - o for f, o in zip(full, want)]
        upper = auto_pad == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in totals]
        end = [t - bg for t, bg in zip(totals, begin)]
    elif auto_pad == "VALID":
        begin, end = [0] * n, [0] * n
    else:
        pads = list(attrs.get("pads", [0] * 2 * n))
        begin, end = pads[:n], pads[n:]
    group = attrs.get("group", 1)
    shape = tf.stack([tf.shape(x)[0], *full, w.shape[1]])
    conv, perm = (tf.nn.conv2d_transpose, [2, 3, 1, 0]) if n == 2 else (tf.nn.conv3d_transpose, [2, 3, 4, 1, 0])
    parts = [conv(a, tf.transpose(k, perm), shape, [1, *strides, 1], "VALID")
             for a, k in zip(tf.split(x, group, axis=n + 1), tf.split(w, group, axis=0))]
    y = parts[0] if group == 1 else tf.concat(parts, axis=n + 1)
    if min(begin + end) < 0:  # an output_shape past the full output: positions no input reaches are zeros
        y = tf.pad(y, [[0, 0], *[[max(-b, 0), max(-e, 0)] for b, e in zip(begin, end)], [0, 0]])
        full = [f + max(-b, 0) + max(-e, 0) for f, b, e in zip(full, begin, end)]
        begin, end = [max(b, 0) for b in begin], [max(e, 0) for e in end]
    return y[(slice(None), *[slice(b, f - e) for b, f, e in zip(begin, full, end)], slice(None))]


def _dilate(w: tf.Tensor, dilations: list[int]) -> tf.Tensor:
    """Kernel ``w`` (``C_in, C_out, *window``) with ``d - 1`` zeros between neighbouring taps per axis."""
    for i, d in enumerate(dilations):
        if d == 1:
            continue
        axis = 2 + i
        k = w.shape[axis]
        spread = tf.pad(tf.expand_dims(w, axis + 1), [[0, 0]] * (axis + 1) + [[0, d - 1]] + [[0, 0]] * (w.shape.rank - axis - 1))
        shape = w.shape.as_list()
        shape[axis] = k * d
        w = tf.reshape(spread, shape)
        w = w[tuple(slice(None) if j != axis else slice(0, (k - 1) * d + 1) for j in range(w.shape.rank))]
    return w


# ---- the handlers, by the rank of their input


@register("Conv", since=1)
def _conv(ctx: Ctx, node, attrs):
    w = ctx.plain(node.input[1])
    if w.shape.rank != 4:  # 1-D and 3-D convolutions
        return conv_nd(ctx, node, attrs)
    y = conv_nhwc(node, attrs, ctx.nhwc(node.input[0]), w)
    if len(node.input) > 2 and node.input[2]:
        y = tf.nn.bias_add(y, ctx.plain(node.input[2]))
    ctx.set(node.output[0], y, nhwc=True)


@register("MaxPool", since=1)
def _max_pool(ctx, node, attrs):
    _pool(ctx, node, attrs, "max")


@register("AveragePool", since=7)  # version 7 on: count_include_pad (version 1 counted the pads)
def _avg_pool(ctx, node, attrs):
    _pool(ctx, node, attrs, "avg")


def _pool(ctx, node, attrs, kind):
    from tfnet.onnx.ops_pool import needs_offsets, pool

    if needs_offsets(node, attrs):  # dilated windows, SAME_LOWER, MaxPool's Indices
        return pool(ctx, node, attrs, kind)
    if len(attrs["kernel_shape"]) != 2:  # 1-D and 3-D pools
        return pool_nd(ctx, node, attrs, kind)
    ctx.set(node.output[0], pool_nhwc(node, attrs, ctx.nhwc(node.input[0]), kind), nhwc=True)
