"""ONNX operators as TensorFlow ops: element-wise, shape, tensor and normalisation ops.

Each handler takes ``(ctx, node, attrs)``, reads its inputs from ``ctx`` and stores its outputs with
``ctx.set``. :data:`HANDLERS` maps operator names to handlers; the convolution, pooling, batch-norm
and recurrent operators live in :mod:`tfnet.onnx.ops_nn` and register themselves here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError

HANDLERS: dict[str, Callable] = {}

_INT64_BIG = 2**62


def register(*names: str):
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco


def tf_dtype(onnx_type: int) -> tf.DType:
    from onnx import helper

    return tf.as_dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def _inputs(ctx: Ctx, node) -> list[tf.Tensor | None]:
    return [ctx.plain(i) if i else None for i in node.input]


# ------------------------------------------------------------------ element-wise

_UNARY = {
    "Relu": tf.nn.relu, "Sigmoid": tf.sigmoid, "Tanh": tf.tanh, "Exp": tf.exp, "Log": tf.math.log,
    "Sqrt": tf.sqrt, "Neg": tf.negative, "Abs": tf.abs, "Erf": tf.math.erf, "Reciprocal": tf.math.reciprocal,
    "Floor": tf.floor, "Ceil": tf.math.ceil, "Softplus": tf.nn.softplus, "Sin": tf.sin, "Cos": tf.cos,
    "Identity": tf.identity, "Not": tf.logical_not, "Sign": tf.sign, "Round": tf.round,
}
_LAYOUT_FREE = set(_UNARY) - {"Not"}  # element-wise: any layout in, the same layout out


def _unary_layout(ctx: Ctx, name: str) -> tuple[tf.Tensor, bool]:
    if ctx.is_nhwc(name):
        return ctx.nhwc(name), True
    return ctx.plain(name), False


@register(*_UNARY)
def _unary(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], _UNARY[node.op_type](x), nhwc)


@register("Dropout")
def _dropout(ctx, node, attrs):
    if len(node.input) > 2 and node.input[2]:
        mode = ctx.static(node.input[2])
        if mode is None or bool(mode):
            raise OnnxConversionError(f"Dropout {node.name!r} runs in training mode; tfnet imports inference graphs.")
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], tf.identity(x), nhwc)
    if len(node.output) > 1 and node.output[1]:
        ctx.set(node.output[1], tf.ones_like(ctx.plain(node.input[0]), dtype=tf.bool))


@register("LeakyRelu")
def _leaky(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], tf.nn.leaky_relu(x, alpha=attrs.get("alpha", 0.01)), nhwc)


@register("Elu")
def _elu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    alpha = attrs.get("alpha", 1.0)
    y = tf.nn.elu(x) if alpha == 1.0 else tf.where(x > 0, x, alpha * (tf.exp(x) - 1))
    ctx.set(node.output[0], y, nhwc)


@register("HardSigmoid")
def _hard_sigmoid(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    y = tf.clip_by_value(attrs.get("alpha", 0.2) * x + attrs.get("beta", 0.5), 0.0, 1.0)
    ctx.set(node.output[0], y, nhwc)


@register("HardSwish")
def _hard_swish(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    ctx.set(node.output[0], x * tf.nn.relu6(x + 3.0) / 6.0, nhwc)


@register("Gelu")
def _gelu(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    approximate = attrs.get("approximate", b"none")
    ctx.set(node.output[0], tf.nn.gelu(x, approximate=approximate in (b"tanh", "tanh")), nhwc)


@register("Clip")
def _clip(ctx, node, attrs):
    x, nhwc = _unary_layout(ctx, node.input[0])
    lo = ctx.static(node.input[1]) if len(node.input) > 1 and node.input[1] else attrs.get("min")
    hi = ctx.static(node.input[2]) if len(node.input) > 2 and node.input[2] else attrs.get("max")
    if len(node.input) > 1 and node.input[1] and lo is None:
        lo = ctx.plain(node.input[1])
    if len(node.input) > 2 and node.input[2] and hi is None:
        hi = ctx.plain(node.input[2])
    if isinstance(lo, (np.ndarray, float, int, np.generic)) and isinstance(hi, (np.ndarray, float, int, np.generic)) \
            and float(lo) == 0.0 and float(hi) == 6.0:
        y = tf.nn.relu6(x)
    else:
        y = x
        if lo is not None:
            y = tf.maximum(y, tf.cast(lo, x.dtype))
        if hi is not None:
            y = tf.minimum(y, tf.cast(hi, x.dtype))
    ctx.set(node.output[0], y, nhwc)


_BINARY = {
    "Add": tf.add, "Sub": tf.subtract, "Mul": tf.multiply, "Max": tf.maximum, "Min": tf.minimum,
    "Equal": tf.equal, "Less": tf.less, "Greater": tf.greater, "LessOrEqual": tf.less_equal,
    "GreaterOrEqual": tf.greater_equal, "And": tf.logical_and, "Or": tf.logical_or, "Xor": tf.math.logical_xor,
}
_BINARY_LAYOUT_FREE = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum"}


def _scalar_like(ctx: Ctx, name: str) -> bool:
    shape = ctx.plain(name).shape if not ctx.is_nhwc(name) else None
    return shape is not None and shape.rank is not None and shape.num_elements() == 1


def _binary_operands(ctx: Ctx, node) -> tuple[list[tf.Tensor], bool]:
    """Operands in NHWC when one is NHWC and every other is NHWC too or a single number."""
    names = list(node.input)
    if node.op_type in _BINARY_LAYOUT_FREE and any(ctx.is_nhwc(n) for n in names):
        if all(ctx.is_nhwc(n) or _scalar_like(ctx, n) for n in names):
            return [ctx.nhwc(n) if ctx.is_nhwc(n) else ctx.plain(n) for n in names], True
    return [ctx.plain(n) for n in names], False


@register(*_BINARY, "Div", "Pow", "Sum", "Mean")
def _binary(ctx, node, attrs):
    xs, nhwc = _binary_operands(ctx, node)
    op = node.op_type
    if op in ("Sum", "Mean"):
        y = xs[0]
        for x in xs[1:]:
            y = y + x
        if op == "Mean":
            y = y / len(xs)
    elif op == "Div":
        a, b = xs
        y = tf.truncatediv(a, b) if a.dtype.is_integer else a / b
    elif op == "Pow":
        a, b = xs
        exponent = ctx.static(node.input[1])
        if exponent is not None and np.asarray(exponent).size == 1 and float(exponent) == 2.0:
            y = tf.square(a)
        elif exponent is not None and np.asarray(exponent).size == 1 and float(exponent) == 0.5:
            y = tf.sqrt(a)
        else:
            y = tf.pow(a, tf.cast(b, a.dtype))
    else:
        a, b = xs
        if op in ("Add", "Sub", "Mul", "Max", "Min") and a.dtype != b.dtype:
            b = tf.cast(b, a.dtype)
        y = _BINARY[op](a, b)
    ctx.set(node.output[0], y, nhwc)


@register("Mod")
def _mod(ctx, node, attrs):
    a, b = _inputs(ctx, node)
    fn = tf.truncatemod if attrs.get("fmod", 0) else tf.math.floormod
    ctx.set(node.output[0], fn(a, b))


@register("Where")
def _where(ctx, node, attrs):
    c, a, b = _inputs(ctx, node)
    ctx.set(node.output[0], tf.where(c, a, b))


@register("Softmax", "LogSoftmax")
def _softmax(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", -1)
    fn = tf.nn.softmax if node.op_type == "Softmax" else tf.nn.log_softmax
    ctx.set(node.output[0], fn(x, axis=axis))


@register("Cast")
def _cast(ctx, node, attrs):
    ctx.set(node.output[0], tf.cast(ctx.plain(node.input[0]), tf_dtype(attrs["to"])))


@register("CastLike")
def _cast_like(ctx, node, attrs):
    ctx.set(node.output[0], tf.cast(ctx.plain(node.input[0]), ctx.plain(node.input[1]).dtype))


# ------------------------------------------------------------------ matrix products

@register("MatMul")
def _matmul(ctx, node, attrs):
    a, b = _inputs(ctx, node)
    if a.shape.rank == 1 or b.shape.rank == 1:
        a2 = a[None] if a.shape.rank == 1 else a
        b2 = b[:, None] if b.shape.rank == 1 else b
        y = tf.linalg.matmul(a2, b2)
        if a.shape.rank == 1:
            y = tf.squeeze(y, -2)
        if b.shape.rank == 1:
            y = tf.squeeze(y, -1)
    elif b.shape.rank == 2 and a.shape.rank > 2:  # (..., K) @ (K, N): one 2-D matmul
        lead = tf.shape(a)[:-1]
        y = tf.linalg.matmul(tf.reshape(a, [-1, a.shape[-1] or tf.shape(a)[-1]]), b)
        y = tf.reshape(y, tf.concat([lead, tf.shape(b)[-1:]], 0))
    else:
        y = tf.linalg.matmul(a, b)
    ctx.set(node.output[0], y)


@register("Gemm")
def _gemm(ctx, node, attrs):
    a = ctx.plain(node.input[0])
    b = ctx.plain(node.input[1])
    y = tf.linalg.matmul(a, b, transpose_a=bool(attrs.get("transA", 0)), transpose_b=bool(attrs.get("transB", 0)))
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if len(node.input) > 2 and node.input[2]:
        c = ctx.plain(node.input[2])
        if beta != 1.0:
            c = c * beta
        y = tf.nn.bias_add(y, c) if c.shape.rank == 1 else y + c
    ctx.set(node.output[0], y)


# ------------------------------------------------------------------ shapes and indexing

def _int_list(ctx: Ctx, node, index: int, attr: str, attrs) -> list[int] | None:
    """An int list given as an attribute (older opsets) or a constant input (newer ones)."""
    if len(node.input) > index and node.input[index]:
        value = ctx.static_ints(node.input[index])
        if value is None:
            raise OnnxConversionError(f"{node.op_type} {node.name!r}: input {index} ({attr}) must be a constant.")
        return value
    value = attrs.get(attr)
    return None if value is None else [int(v) for v in value]


@register("Constant")
def _constant(ctx, node, attrs):
    from onnx import numpy_helper

    if "value" in attrs:
        value = numpy_helper.to_array(attrs["value"])
    elif "value_float" in attrs:
        value = np.asarray(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        value = np.asarray(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        value = np.asarray(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        value = np.asarray(attrs["value_ints"], np.int64)
    else:
        raise OnnxConversionError(f"Constant {node.name!r}: attributes {sorted(attrs)} are not supported.")
    ctx.set(node.output[0], tf.constant(value))


@register("ConstantOfShape")
def _constant_of_shape(ctx, node, attrs):
    from onnx import numpy_helper

    value = numpy_helper.to_array(attrs["value"]).reshape(-1)[0] if "value" in attrs else np.float32(0)
    shape = ctx.static_ints(node.input[0])
    shape = shape if shape is not None else ctx.plain(node.input[0])
    ctx.set(node.output[0], tf.fill(shape, tf.constant(value)))


@register("Shape")
def _shape(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    start, end = attrs.get("start", 0), attrs.get("end")
    static = x.shape.as_list() if x.shape.rank is not None else None
    if static is not None and all(d is not None for d in static[start:end]):
        ctx.set(node.output[0], tf.constant(np.asarray(static[start:end], np.int64)))
    else:
        ctx.set(node.output[0], tf.shape(x, out_type=tf.int64)[start:end])


@register("Size")
def _size(ctx, node, attrs):
    ctx.set(node.output[0], tf.size(ctx.plain(node.input[0]), out_type=tf.int64))


@register("Reshape")
def _reshape(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    shape = ctx.static_ints(node.input[1])
    if shape is None:
        target = tf.cast(ctx.plain(node.input[1]), tf.int64)
        if not attrs.get("allowzero", 0):
            n = target.shape[0]
            here = tf.shape(x, out_type=tf.int64)
            if n is not None and x.shape.rank is not None and n <= x.shape.rank:
                target = tf.where(tf.equal(target, 0), here[:n], target)
        ctx.set(node.output[0], tf.reshape(x, target))
        return
    if not attrs.get("allowzero", 0) and 0 in shape:
        dims = x.shape.as_list()
        dynamic = tf.shape(x)
        parts = [d if d != 0 else (dims[i] if dims[i] is not None else dynamic[i]) for i, d in enumerate(shape)]
        if any(isinstance(p, tf.Tensor) for p in parts):
            ctx.set(node.output[0], tf.reshape(x, tf.stack([tf.cast(p, tf.int32) for p in parts])))
            return
        shape = parts
    if shape.count(-1) == 0 and x.shape.rank and x.shape[0] is None and shape and len(shape) > 1:
        pass  # a fixed batch in the target shape stays as exported
    ctx.set(node.output[0], tf.reshape(x, shape))


@register("Flatten")
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


@register("Transpose")
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


@register("Unsqueeze")
def _unsqueeze(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axes = _axes(_int_list(ctx, node, 1, "axes", attrs), x.shape.rank + len(_int_list(ctx, node, 1, "axes", attrs)))
    for a in axes:
        x = tf.expand_dims(x, a)
    ctx.set(node.output[0], x)


@register("Squeeze")
def _squeeze(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axes = _int_list(ctx, node, 1, "axes", attrs)
    ctx.set(node.output[0], tf.squeeze(x, axis=None if axes is None else _axes(axes, x.shape.rank)))


@register("Concat")
def _concat(ctx, node, attrs):
    names = [n for n in node.input if n]
    axis = attrs["axis"]
    if len(names) > 1 and all(ctx.is_nhwc(n) for n in names) and axis in (1, -3):
        ctx.set(node.output[0], tf.concat([ctx.nhwc(n) for n in names], axis=3), True)
        return
    xs = [ctx.plain(n) for n in names]
    ctx.set(node.output[0], tf.concat(xs, axis=axis) if len(xs) > 1 else tf.identity(xs[0]))


@register("Split")
def _split(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", 0)
    sizes = _int_list(ctx, node, 1, "split", attrs)
    outs = [o for o in node.output]
    parts = tf.split(x, sizes if sizes is not None else len(outs), axis=axis)
    for name, part in zip(outs, parts):
        ctx.set(name, part)


@register("Gather")
def _gather(ctx, node, attrs):
    params = ctx.plain(node.input[0])
    axis = attrs.get("axis", 0)
    static = ctx.static(node.input[1])
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


@register("Slice")
def _slice(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    rank = x.shape.rank
    starts, ends = node.input[1], node.input[2]
    n = len(ctx.static_ints(starts)) if ctx.static(starts) is not None else ctx.plain(starts).shape[0]
    axes = _int_list(ctx, node, 3, "axes", {}) if len(node.input) > 3 and node.input[3] else list(range(n))
    steps = _int_list(ctx, node, 4, "steps", {}) if len(node.input) > 4 and node.input[4] else [1] * n
    index = [slice(None)] * rank
    for i, (axis, step) in enumerate(zip(axes, steps)):
        axis = axis + rank if axis < 0 else axis
        index[axis] = slice(_bound(ctx, starts, i), _bound(ctx, ends, i), step)
    ctx.set(node.output[0], x[tuple(index)])


@register("Expand")
def _expand(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    shape = ctx.static_ints(node.input[1])
    target = tf.constant(shape, tf.int64) if shape is not None else tf.cast(ctx.plain(node.input[1]), tf.int64)
    full = tf.broadcast_dynamic_shape(tf.shape(x, out_type=tf.int64), target)
    ctx.set(node.output[0], tf.broadcast_to(x, full))


@register("Tile")
def _tile(ctx, node, attrs):
    x, reps = _inputs(ctx, node)
    ctx.set(node.output[0], tf.tile(x, reps))


@register("Range")
def _range(ctx, node, attrs):
    start, limit, delta = _inputs(ctx, node)
    ctx.set(node.output[0], tf.range(start, limit, delta))


_REDUCE = {
    "ReduceMean": tf.reduce_mean, "ReduceSum": tf.reduce_sum, "ReduceMax": tf.reduce_max,
    "ReduceMin": tf.reduce_min, "ReduceProd": tf.reduce_prod,
}


@register(*_REDUCE)
def _reduce(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axes = _int_list(ctx, node, 1, "axes", attrs)
    keep = bool(attrs.get("keepdims", 1))
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            ctx.set(node.output[0], tf.identity(x))
            return
        axes = None
    ctx.set(node.output[0], _REDUCE[node.op_type](x, axis=axes, keepdims=keep))


@register("ArgMax", "ArgMin")
def _argmax(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", 0)
    fn = tf.argmax if node.op_type == "ArgMax" else tf.argmin
    y = fn(x, axis=axis, output_type=tf.int64)
    if attrs.get("keepdims", 1):
        y = tf.expand_dims(y, axis)
    ctx.set(node.output[0], y)


@register("LayerNormalization")
def _layer_norm(ctx, node, attrs):
    x = ctx.plain(node.input[0])
    rank = x.shape.rank
    axis = attrs.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    eps = attrs.get("epsilon", 1e-5)
    mean, var = tf.nn.moments(x, axes, keepdims=True)
    inv = tf.math.rsqrt(var + eps)
    y = (x - mean) * inv * ctx.plain(node.input[1])
    if len(node.input) > 2 and node.input[2]:
        y = y + ctx.plain(node.input[2])
    ctx.set(node.output[0], y)
    if len(node.output) > 1:
        ctx.set(node.output[1], mean)
    if len(node.output) > 2:
        ctx.set(node.output[2], inv)


def supported_operators() -> list[str]:
    from tfnet.onnx import ops_nn  # noqa: F401  (registers its handlers)

    return sorted(HANDLERS)
