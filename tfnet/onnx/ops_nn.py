"""ONNX convolution, pooling and batch-norm operators as TensorFlow ops, in NHWC.

Kernels stay in ONNX layout (``OIHW``) as weights, so weight names, shapes and gradients are
PyTorch's; the graph transposes them to TensorFlow's ``HWIO`` (a weight-sized op). Batch norm
becomes an inference-mode ``FusedBatchNormV3``, which tfnet folds into the convolution before it.
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfnet import kernels
from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register


def _spatial_attrs(node, attrs, x: tf.Tensor, kernel: list[int]):
    """(strides, dilations, TF padding) for a 2-D window op on NHWC ``x``."""
    if len(kernel) != 2:
        raise OnnxConversionError(
            f"{node.op_type} {node.name!r} has a {len(kernel)}-D window {kernel}; tfnet converts 2-D ones (NCHW images)."
        )
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = attr_text(auto_pad)
    if auto_pad == "VALID":
        return strides, dilations, "VALID"
    if auto_pad == "SAME_UPPER":
        return strides, dilations, "SAME"
    if auto_pad == "SAME_LOWER":  # as SAME_UPPER, with the odd pixel of padding before instead of after
        same = _same_pads(x, kernel, strides, dilations)
        if same is None:
            raise OnnxConversionError(f"{node.op_type} {node.name!r}: auto_pad=SAME_LOWER needs static spatial sizes.")
        return strides, dilations, [[0, 0], [same[2], same[0]], [same[3], same[1]], [0, 0]]
    if auto_pad not in ("NOTSET", ""):
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: auto_pad={auto_pad} is not supported.")
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if attrs.get("ceil_mode", 0):
        pads = _ceil_pads(node, x, kernel, strides, dilations, pads)
    if not any(pads):
        return strides, dilations, "VALID"
    if _same_pads(x, kernel, strides, dilations) == pads:
        return strides, dilations, "SAME"
    return strides, dilations, [[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]]


def _same_pads(x, kernel, strides, dilations):
    dims = x.shape.as_list()[1:3]
    if any(d is None for d in dims):
        return None
    before, after = [], []
    for size, k, s, d in zip(dims, kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        before.append(total // 2)
        after.append(total - total // 2)
    return [before[0], before[1], after[0], after[1]]


def _ceil_pads(node, x, kernel, strides, dilations, pads):
    dims = x.shape.as_list()[1:3]
    if any(d is None for d in dims):
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: ceil_mode=1 needs static spatial dimensions.")
    pads = list(pads)
    for i, (size, k, s, d) in enumerate(zip(dims, kernel, strides, dilations)):
        span = size + pads[i] + pads[i + 2] - ((k - 1) * d + 1)
        out_floor, out_ceil = span // s + 1, -(-span // s) + 1
        if (out_ceil - 1) * s >= size + pads[i]:  # the last window must start inside the input
            out_ceil -= 1
        pads[i + 2] += (out_ceil - out_floor) * s
    return pads


def conv_nhwc(node, attrs, x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """A 2-D ONNX convolution (kernel ``w`` in OIHW) of NHWC ``x``, without bias, in NHWC."""
    kernel = list(attrs.get("kernel_shape", w.shape.as_list()[2:]))
    strides, dilations, padding = _spatial_attrs(node, attrs, x, kernel)
    group = attrs.get("group", 1)
    c_in = x.shape[-1]
    out_ch, in_per_group = w.shape[0], w.shape[1]
    s4, d4 = [1, *strides, 1], [1, *dilations, 1]
    if group == 1:
        y = _conv2d(x, tf.transpose(w, [2, 3, 1, 0]), s4, d4, padding)
    elif group == c_in and in_per_group == 1 and strides[0] == strides[1] and (
            dilations == [1, 1] or strides == [1, 1]):
        hwio = tf.transpose(w, [2, 3, 0, 1])  # (kh, kw, O, 1) -> (kh, kw, C, O / C)
        dw = tf.reshape(hwio, [kernel[0], kernel[1], c_in, out_ch // c_in])
        if isinstance(padding, list):  # EXPLICIT padding on a depthwise conv crashes grappler's cost model
            x, padding = tf.pad(x, padding), "VALID"
        if dilations != [1, 1]:  # DepthwiseConv2dNative's gradients are wrong for dilated kernels (TF 2.21)
            y = tf.nn.depthwise_conv2d(x, dw, s4, padding, dilations=dilations)
        else:
            y = tf.raw_ops.DepthwiseConv2dNative(input=x, filter=dw, strides=s4, dilations=d4, data_format="NHWC",
                                                 padding=padding)
    else:
        xs = tf.split(x, group, axis=3)
        ws = tf.split(w, group, axis=0)
        y = tf.concat([_conv2d(a, tf.transpose(b, [2, 3, 1, 0]), s4, d4, padding) for a, b in zip(xs, ws)], axis=3)
    return y


def _conv2d(x, kernel, strides, dilations, padding):
    """``Conv2D`` of NHWC ``x`` with HWIO ``kernel`` (``strides`` and ``dilations`` of length 4), in the form
    whose gradients every x86-64 CPU computes right (tfnet.kernels says which forms and why)."""
    return kernels.conv2d(x, kernel, strides[1:3], dilations[1:3], padding)


@register("BatchNormalization", since=9)  # version 7 had the spatial attribute
def _batch_norm(ctx: Ctx, node, attrs):
    if attrs.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
        raise OnnxConversionError(
            f"BatchNormalization {node.name!r} is in training mode; tfnet imports inference graphs "
            "(export with model.eval())."
        )
    eps = attrs.get("epsilon", 1e-5)
    x_name, scale, bias, mean, var = node.input[:5]
    stats = []
    for stat in (mean, var):
        source = ctx.aliases.get(stat, stat)  # the initializer, also through the exporter's Identity nodes
        if source in ctx.stat_copies:  # shared with a trainable use: this use reads its frozen copy
            stats.append(ctx.stat_copies[source])
            ctx.statistics.append(stats[-1].op.name)
            continue
        if source in ctx.weight_tf_names:
            ctx.statistics.append(ctx.weight_tf_names[source])
        stats.append(ctx.plain(stat))
    params = [ctx.plain(scale), ctx.plain(bias), *stats]
    rank = (ctx.nhwc(x_name) if ctx.is_nhwc(x_name) else ctx.plain(x_name)).shape.rank
    if rank == 4:
        y = tf.raw_ops.FusedBatchNormV3(
            x=ctx.nhwc(x_name), scale=params[0], offset=params[1], mean=params[2], variance=params[3],
            epsilon=eps, data_format="NHWC", is_training=False,
        )[0]
        ctx.set(node.output[0], y, nhwc=True)
        return
    x = ctx.plain(x_name)
    shape = [-1] + [1] * (rank - 2)
    s, b, m, v = (tf.reshape(p, shape) for p in params)
    ctx.set(node.output[0], (x - m) * (s * tf.math.rsqrt(v + eps)) + b)


def pool_nhwc(node, attrs, x: tf.Tensor, kind: str) -> tf.Tensor:
    """A 2-D ONNX max or average pool of NHWC ``x``, in NHWC."""
    kernel = list(attrs["kernel_shape"])
    strides, dilations, padding = _spatial_attrs(node, attrs, x, kernel)
    if dilations != [1, 1]:
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: dilated pooling is not supported.")
    k4, s4 = [1, *kernel, 1], [1, *strides, 1]
    if kind == "max":
        if isinstance(padding, list):
            x = tf.pad(x, padding, constant_values=x.dtype.min)
            padding = "VALID"
        return tf.nn.max_pool2d(x, k4, s4, padding)
    include_pad = bool(attrs.get("count_include_pad", 0))
    if padding == "VALID" or (padding == "SAME" and not include_pad):
        return tf.nn.avg_pool2d(x, k4, s4, padding)
    pads = padding if isinstance(padding, list) else _pairs(_same_pads(x, kernel, strides, dilations))
    total = tf.nn.avg_pool2d(tf.pad(x, pads), k4, s4, "VALID")
    if include_pad:
        return total
    ones = tf.pad(tf.ones_like(x[:1, :, :, :1]), pads)
    return total / tf.nn.avg_pool2d(ones, k4, s4, "VALID")


def _pairs(pads):
    return [[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]]


@register("GlobalAveragePool", "GlobalMaxPool", since=1)
def _global_pool(ctx, node, attrs):
    name = node.input[0]
    fn = tf.reduce_mean if node.op_type == "GlobalAveragePool" else tf.reduce_max
    if ctx.is_nhwc(name) or ctx.plain(name).shape.rank == 4:
        ctx.set(node.output[0], fn(ctx.nhwc(name), axis=[1, 2], keepdims=True), nhwc=True)
        return
    x = ctx.plain(name)
    ctx.set(node.output[0], fn(x, axis=list(range(2, x.shape.rank)), keepdims=True))
