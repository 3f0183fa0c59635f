"""ONNX shape and indexing operators as TensorFlow ops.

Shapes known while converting (constants, static dimensions) are used as Python values; the rest
(a dynamic batch dimension) become TensorFlow shape ops, so the batch stays dynamic.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.dtypes import carrier_array, is_carried
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import plain_inputs, register

_INT64_BIG = 2**62


def int_list(ctx: Ctx, node, index: int, attr: str, attrs) -> list[int] | None:
    """An int list given as an attribute (older opsets) or a constant input (newer ones)."""
    if len(node.input) > index and node.input[index]:
        value = ctx.static_ints(node.input[index])
        if value is None:
            raise OnnxConversionError(f"{node.op_type} {node.name!r}: input {index} ({attr}) must be a constant.")
        return value
    value = attrs.get(attr)
    return None if value is None else [int(v) for v in value]


@register("Constant", since=1)
def _constant(ctx, node, attrs):
    from onnx import numpy_helper

    if "value" in attrs:
        value = numpy_helper.to_array(attrs["value"])
        if is_carried(attrs["value"].data_type):
            ctx.onnx_types[node.output[0]] = attrs["value"].data_type
            value = carrier_array(value)
    elif "value_float" in attrs:
        value = np.asarray(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        value = np.asarray(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        value = np.asarray(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        value = np.asarray(attrs["value_ints"], np.int64)
    elif "value_string" in attrs:
        value = np.asarray(attrs["value_string"], object)
    elif "value_strings" in attrs:
        value = np.asarray(attrs["value_strings"], object)
    else:
        raise OnnxConversionError(f"Constant {node.name!r}: attributes {sorted(attrs)} are not supported.")
    ctx.set(node.output[0], tf.constant(value))


@register("ConstantOfShape", since=9)
def _constant_of_shape(ctx, node, attrs):
    from onnx import numpy_helper

    value = numpy_helper.to_array(attrs["value"]).reshape(-1)[0] if "value" in attrs else np.float32(0)
    shape = ctx.static_ints(node.input[0])
    if shape is None:
        ctx.set(node.output[0], tf.fill(ctx.plain(node.input[0]), tf.constant(value)))
        return
    key = ("ConstantOfShape", tuple(shape), value.dtype.str, value.tobytes())
    if key not in ctx.shared:
        ctx.shared[key] = tf.fill(shape, tf.constant(value))
    ctx.set(node.output[0], ctx.shared[key])


@register("Shape", since=1)
def _shape(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    start, end = attrs.get("start", 0), attrs.get("end")
    static = x.shape.as_list() if x.shape.rank is not None else None
    if static is not None and all(d is not None for d in static[start:end]):
        ctx.set(node.output[0], tf.constant(np.asarray(static[start:end], np.int64)))
    else:
        ctx.set(node.output[0], tf.shape(x, out_type=tf.int64)[start:end])
        if static is not None:  # Gather and Slice of the static entries give constants
            ctx.shapes[node.output[0]] = static[start:end]


@register("Size", since=1)
def _size(ctx, node, attrs):
    ctx.set(node.output[0], tf.size(ctx.plain(node.input[0]), out_type=tf.int64))


@register("Reshape", since=5)  # version 1 took the shape as an attribute
def _reshape(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    shape = ctx.static_ints(node.input[1])
    if shape is None:
        target = tf.cast(ctx.plain(node.input[1]), tf.int64)
        entries = ctx.partial_ints(node.input[1])
        keep_zero = bool(attrs.get("allowzero", 0))
        if entries is not None and x.shape.rank is not None and (keep_zero or len(entries) <= x.shape.rank):
            # the entries known while converting as constants, so that TensorFlow's shape inference
            # (also of the graph tfnet imports later) knows those dimensions
            here = tf.shape(x, out_type=tf.int64)
            parts = []
            for i, d in enumerate(entries):
                if d is None:
                    parts.append(target[i])
                elif d == 0 and not keep_zero:
                    parts.append(tf.constant(x.shape[i], tf.int64) if x.shape[i] is not None else here[i])
                else:
                    parts.append(tf.constant(d, tf.int64))
            target = tf.stack(parts)
        elif not keep_zero:
            n = target.shape[0]
            here = tf.shape(x, out_type=tf.int64)
            if n is not None and x.shape.rank is not None and n <= x.shape.rank:
                target = tf.where(tf.equal(target, 0), here[:n], target)
        y = tf.reshape(x, target)
        y.set_shape(y.shape.merge_with(_partial_shape(ctx.plain(node.input[1]), y.shape.rank)))
        ctx.set(node.output[0], y)
        return
    if not attrs.get("allowzero", 0) and 0 in shape:
        dims = x.shape.as_list()
        dynamic = tf.shape(x)
        parts = [d if d != 0 else (dims[i] if dims[i] is not None else dynamic[i]) for i, d in enumerate(shape)]
        if any(isinstance(p, tf.Tensor) for p in parts):
            ctx.set(node.output[0], tf.reshape(x, tf.stack([tf.cast(p, tf.int32) for p in parts])))
            return
        shape = parts
    ctx.set(node.output[0], tf.reshape(x, shape))


def _partial_shape(target: tf.Tensor, rank: int | None) -> tf.TensorShape:
    """What TensorFlow can tell of a shape tensor built from ``Shape`` slices and constants, such as
    ``Concat(Shape(x)[:1], [-1], Shape(x)[3:])`` (unknown entries, 0 and -1 as None)."""
    from tensorflow.python.framework import tensor_util

    try:
        shape = tensor_util.constant_value_as_shape(target)
    except (TypeError, ValueError):
        return tf.TensorShape(None)
    if shape.rank is None or (rank is not None and shape.rank != rank):
        return tf.TensorShape(None)
    return tf.TensorShape([d if d not in (None, 0, -1) else None for d in shape.as_list()])


@register("Flatten", since=1)
def _flatten(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", 1)
    rank = x.shape.rank
    axis = axis + rank if axis < 0 else axis
    dims = x.shape.as_list()
    tail = dims[axis:]
    if all(d is not None for d in tail):
        inner = int(np.prod(tail)) if tail else 1
        ctx.set(node.output[0], tf.reshape(x, [-1, inner]))
    else:
        shape = tf.shape(x)
        ctx.set(node.output[0], tf.reshape(x, tf.stack([tf.reduce_prod(shape[:axis]), tf.reduce_prod(shape[axis:])])))


@register("Transpose", since=1)
def _transpose(ctx, node, attrs):
    name = node.input[0]
    perm = attrs.get("perm")
    if ctx.is_nhwc(name) and perm is not None and list(perm) == [0, 2, 3, 1]:
        ctx.set(node.output[0], tf.identity(ctx.nhwc(name)))  # NCHW -> NHWC: already there
        return
    x = ctx.plain(name)
    ctx.set(node.output[0], tf.transpose(x, perm=None if perm is None else list(perm)))


def _axes(axes: list[int], rank: int) -> list[int]:
    return sorted(a + rank if a < 0 else a for a in axes)


@register("Unsqueeze", since=1)
def _unsqueeze(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axes = int_list(ctx, node, 1, "axes", attrs)
    if x.shape.rank is None:  # a Loop's stacked outputs: known rank or not, new axes counted from the front insert
        if min(axes) < 0:
            raise OnnxConversionError(f"Unsqueeze {node.name!r}: negative axes {axes} on a value of unknown rank.")
        for a in sorted(axes):
            x = tf.expand_dims(x, a)
        ctx.set(node.output[0], x)
        return
    axes = _axes(axes, x.shape.rank + len(axes))
    dims = x.shape.as_list()
    if len(axes) > 1 and sum(d is None for d in dims) <= 1 and 0 not in dims:  # one Reshape, not an ExpandDims an axis
        for a in axes:
            dims.insert(a, 1)
        ctx.set(node.output[0], tf.reshape(x, [-1 if d is None else d for d in dims]))
        return
    for a in axes:
        x = tf.expand_dims(x, a)
    ctx.set(node.output[0], x)


@register("Squeeze", since=1)
def _squeeze(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axes = int_list(ctx, node, 1, "axes", attrs)
    ctx.set(node.output[0], tf.squeeze(x, axis=None if axes is None else _axes(axes, x.shape.rank)))


@register("Concat", since=4)
def _concat(ctx, node, attrs):
    names = [n for n in node.input if n]
    axis = attrs["axis"]
    if len(names) > 1 and all(ctx.is_nhwc(n) for n in names) and axis in (1, -3):
        ctx.set(node.output[0], tf.concat([ctx.nhwc(n) for n in names], axis=3), True)
        return
    xs = [ctx.plain(n) for n in names]
    ctx.set(node.output[0], tf.concat(xs, axis=axis) if len(xs) > 1 else tf.identity(xs[0]))


@register("Split", since=2)
def _split(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", 0)
    axis = axis + x.shape.rank if axis < 0 else axis
    outs = list(node.output)
    if len(node.input) > 1 and node.input[1] and ctx.static(node.input[1]) is None:
        parts = tf.split(x, tf.cast(ctx.plain(node.input[1]), tf.int64), num=len(outs), axis=axis)
    else:
        sizes = int_list(ctx, node, 1, "split", attrs)
        if sizes is None and "num_outputs" in attrs and x.shape[axis] is not None:
            n, dim = attrs["num_outputs"], x.shape[axis]
            chunk = -(-dim // n)  # ceil: the last part is smaller when the dimension does not divide
            sizes = [min(chunk, dim - i * chunk) for i in range(n)]
        parts = tf.split(x, sizes if sizes is not None else len(outs), axis=axis)
    for name, part in zip(outs, parts):
        ctx.set(name, part)


def _static_part(ctx: Ctx, node, picked) -> bool:
    """Sets the output to a constant when it takes only static entries of a ``Shape`` output."""
    known = ctx.shapes.get(node.input[0])
    if known is None or picked is None:
        return False
    values = np.asarray(known, dtype=object)[picked]
    if any(v is None for v in np.asarray(values).reshape(-1)):
        return False
    ctx.set(node.output[0], tf.constant(np.asarray(values, np.int64)))
    return True


@register("Gather", since=1)
def _gather(ctx, node, attrs):
    params = ctx.plain(node.input[0])
    axis = attrs.get("axis", 0)
    static = ctx.static(node.input[1])
    if static is not None and _static_part(ctx, node, np.asarray(static)):
        return
    if static is not None:
        static = np.asarray(static)
        dim = params.shape[axis]
        if (static < 0).any():
            if dim is None:
                idx = ctx.plain(node.input[1])
                idx = tf.where(idx < 0, idx + tf.shape(params, out_type=idx.dtype)[axis], idx)
                ctx.set(node.output[0], tf.gather(params, idx, axis=axis))
                return
            static = np.where(static < 0, static + dim, static)
        ctx.set(node.output[0], tf.gather(params, tf.constant(static), axis=axis))
        return
    idx = ctx.plain(node.input[1])
    if not idx.dtype.is_unsigned:
        idx = tf.where(idx < 0, idx + tf.shape(params, out_type=idx.dtype)[axis], idx)
    ctx.set(node.output[0], tf.gather(params, idx, axis=axis))


def _bound(ctx: Ctx, name: str, i: int):
    static = ctx.static(name)
    if static is not None:
        v = int(np.asarray(static).reshape(-1)[i])
        return None if abs(v) >= _INT64_BIG else v
    return ctx.plain(name)[i]


@register("Slice", since=10)  # version 1 took starts and ends as attributes
def _slice(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    rank = x.shape.rank
    starts, ends = node.input[1], node.input[2]
    n = len(ctx.static_ints(starts)) if ctx.static(starts) is not None else ctx.plain(starts).shape[0]
    axes = int_list(ctx, node, 3, "axes", {}) if len(node.input) > 3 and node.input[3] else None
    if n is None:  # starts computed at run time (inside a Loop): as many as ends or axes, or the one axis there is
        n = ctx.plain(ends).shape[0] if axes is None else len(axes)
        n = 1 if n is None and rank == 1 else n
        if n is None and (len(node.input) <= 4 or not node.input[4]):  # the leading axes, as many as given
            ctx.set(node.output[0], _leading_slice(x, ctx.plain(starts), ctx.plain(ends)))
            return
        if n is None:
            raise OnnxConversionError(f"Slice {node.name!r}: the number of sliced axes must be known while "
                                      "converting.")
    axes = list(range(n)) if axes is None else axes
    steps = int_list(ctx, node, 4, "steps", {}) if len(node.input) > 4 and node.input[4] else [1] * n
    index = [slice(None)] * rank
    for i, (axis, step) in enumerate(zip(axes, steps)):
        axis = axis + rank if axis < 0 else axis
        index[axis] = slice(_bound(ctx, starts, i), _bound(ctx, ends, i), step)
    if rank == 1 and all(isinstance(b, (int, type(None))) for b in (index[0].start, index[0].stop)) and \
            _static_part(ctx, node, index[0]):
        return
    ctx.set(node.output[0], x[tuple(index)])


def _leading_slice(x: tf.Tensor, starts: tf.Tensor, ends: tf.Tensor) -> tf.Tensor:
    """``Slice`` of the leading axes of ``x`` by ``starts`` and ``ends`` of a length known only at run time."""
    rank = x.shape.rank
    starts, ends = tf.cast(starts, tf.int64), tf.cast(ends, tf.int64)
    rest = rank - tf.size(starts, out_type=tf.int64)
    begin = tf.concat([starts, tf.zeros([rest], tf.int64)], 0)
    end = tf.concat([ends, tf.fill([rest], tf.constant(np.iinfo(np.int64).max, tf.int64))], 0)
    y = tf.strided_slice(x, begin, end, tf.ones([rank], tf.int64))
    return tf.ensure_shape(y, [None] * rank)


@register("Expand", since=8)
def _expand(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    shape = ctx.static_ints(node.input[1])
    target = tf.constant(shape, tf.int64) if shape is not None else tf.cast(ctx.plain(node.input[1]), tf.int64)
    full = tf.broadcast_dynamic_shape(tf.shape(x, out_type=tf.int64), target)
    ctx.set(node.output[0], tf.broadcast_to(x, full))


@register("Tile", since=6)
def _tile(ctx, node, attrs):
    x, reps = plain_inputs(ctx, node)
    ctx.set(node.output[0], tf.tile(x, reps))


@register("Range", since=11)
def _range(ctx, node, attrs):
    start, limit, delta = (tf.reshape(t, []) for t in plain_inputs(ctx, node))  # scalars (or one-element)
    ctx.set(node.output[0], tf.range(start, limit, delta))
