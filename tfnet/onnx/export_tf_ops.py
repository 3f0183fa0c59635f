"""The TensorFlow ops :class:`tfnet.onnx.export_tf.HeadWriter` writes as ONNX nodes, one handler each.

Each handler takes ``(writer, node, data_inputs)``, writes nodes through ``writer.emit`` and returns
the ONNX name of the op's first output. Shape arithmetic (``Shape``, ``GatherV2``, ``Prod``, ``Pack``,
``StridedSlice``, as ``Dense`` on a sequence computes its ``Tensordot`` reshapes) is written in int64.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfnet.onnx.errors import OnnxExportError

_INT64_MAX = np.iinfo(np.int64).max

_UNARY = {
    "Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
    "Neg": "Neg", "Abs": "Abs", "Erf": "Erf", "Softplus": "Softplus", "Reciprocal": "Reciprocal",
    "Inv": "Reciprocal", "Floor": "Floor", "Ceil": "Ceil", "Selu": "Selu", "Softsign": "Softsign",
    "Sign": "Sign", "Sin": "Sin", "Cos": "Cos",
}
_BINARY = {"AddV2": "Add", "Add": "Add", "BiasAdd": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div",
           "Maximum": "Max", "Minimum": "Min", "Pow": "Pow"}
_REDUCE = {"Mean": "ReduceMean", "Max": "ReduceMax", "Min": "ReduceMin", "Sum": "ReduceSum", "Prod": "ReduceProd"}


def supported_tf_ops() -> list[str]:
    return sorted(set(HANDLERS) | {"Identity", "StopGradient", "PreventGradient", "Snapshot", "Const"})


# -------------------------------------------------------------------- handlers


def _unary(w, node, data):
    return w.emit(_UNARY[node.op], [w.value(data[0])], node.name)


def _binary(w, node, data):
    if node.op == "BiasAdd" and node.attr["data_format"].s == b"NCHW":
        raise OnnxExportError(f"save_onnx: BiasAdd {node.name!r} in NCHW is not supported.")
    return w.emit(_BINARY[node.op], [w.value(data[0]), w.value(data[1])], node.name)


def _matmul(w, node, data):
    a, b = w.value(data[0]), w.value(data[1])
    if node.attr["transpose_a"].b:
        a = w.emit("Transpose", [a], node.name + "/a_t", perm=[1, 0])
    if node.attr["transpose_b"].b:
        b = w.emit("Transpose", [b], node.name + "/b_t", perm=[1, 0])
    return w.emit("MatMul", [a, b], node.name)


def _rsqrt(w, node, data):
    return w.emit("Reciprocal", [w.emit("Sqrt", [w.value(data[0])], node.name + "/sqrt")], node.name)


def _erfc(w, node, data):
    x = w.value(data[0])
    one = w.constant(np.ones((), w.graph.get_tensor_by_name(node.name + ":0").dtype.as_numpy_dtype), node.name + "/one")
    return w.emit("Sub", [one, w.emit("Erf", [x], node.name + "/erf")], node.name)


def _square(w, node, data):
    x = w.value(data[0])
    return w.emit("Mul", [x, x], node.name)


def _squared_difference(w, node, data):
    d = w.emit("Sub", [w.value(data[0]), w.value(data[1])], node.name + "/d")
    return w.emit("Mul", [d, d], node.name)


def _relu6(w, node, data):
    dtype = w.graph.get_tensor_by_name(node.name + ":0").dtype.as_numpy_dtype
    lo, hi = w.constant(np.zeros((), dtype), node.name + "/min"), w.constant(np.full((), 6, dtype), node.name + "/max")
    return w.emit("Clip", [w.value(data[0]), lo, hi], node.name)


def _elu(w, node, data):
    return w.emit("Elu", [w.value(data[0])], node.name, alpha=1.0)


def _leaky(w, node, data):
    return w.emit("LeakyRelu", [w.value(data[0])], node.name, alpha=float(node.attr["alpha"].f))


def _softmax(w, node, data):
    return w.emit(node.op, [w.value(data[0])], node.name, axis=-1)


def _transpose(w, node, data):
    perm = [int(p) for p in w.const_input(node, 1)]
    return w.emit("Transpose", [w.value(data[0])], node.name, perm=perm)


def _reshape(w, node, data):
    shape = w.static_shape(node.name + ":0")
    if shape is not None and sum(d is None for d in shape) <= 1:  # TensorFlow knows it: -1 for the batch
        target = w.constant(np.asarray([-1 if d is None else d for d in shape], np.int64), node.name + "/shape")
    else:  # computed at run time (Tensordot's reshapes): the computation, in ONNX
        target = w.value(data[1])
    return w.emit("Reshape", [w.value(data[0]), target], node.name)


def _shape(w, node, data):
    return w.emit("Shape", [w.value(data[0])], node.name)


def _gather(w, node, data):
    axis = int(w.const_input(node, 2))
    return w.emit("Gather", [w.value(data[0]), w.value(data[1])], node.name, axis=axis)


def _pack(w, node, data):
    axis = node.attr["axis"].i
    parts = [w.emit("Unsqueeze", [w.value(d), _axes_input(w, node, [axis])], f"{node.name}/{i}") for i, d in enumerate(data)]
    return w.emit("Concat", parts, node.name, axis=axis)


def _strided_slice(w, node, data):
    begin, end, strides = (np.asarray(w.const_input(node, i)).reshape(-1) for i in (1, 2, 3))
    masks = {k: node.attr[k].i for k in ("begin_mask", "end_mask", "shrink_axis_mask", "ellipsis_mask", "new_axis_mask")}
    if masks["ellipsis_mask"] or masks["new_axis_mask"]:
        raise OnnxExportError(f"save_onnx: StridedSlice {node.name!r} with an ellipsis or new axis is not supported.")
    starts, ends, shrink = [], [], []
    for i, (b, e, st) in enumerate(zip(begin, end, strides)):
        if masks["shrink_axis_mask"] >> i & 1:
            e, shrink = b + 1 if b != -1 else _INT64_MAX, shrink + [i]
        starts.append((0 if st > 0 else -1) if masks["begin_mask"] >> i & 1 else b)
        ends.append((_INT64_MAX if st > 0 else -_INT64_MAX) if masks["end_mask"] >> i & 1 else e)
    inputs = [w.value(data[0])] + [w.constant(np.asarray(v, np.int64), f"{node.name}/{k}") for k, v in
                                   (("starts", starts), ("ends", ends), ("axes", range(len(starts))), ("steps", strides))]
    y = w.emit("Slice", inputs, node.name + ("/slice" if shrink else ""))
    return w.emit("Squeeze", [y, _axes_input(w, node, shrink)], node.name) if shrink else y


def _axes_input(w, node, axes) -> str:
    return w.constant(np.asarray(axes, np.int64).reshape(-1), node.name + "/axes")


def _squeeze(w, node, data):
    axes = list(node.attr["squeeze_dims"].list.i)
    inputs = [w.value(data[0])] + ([_axes_input(w, node, axes)] if axes else [])
    return w.emit("Squeeze", inputs, node.name)


def _expand_dims(w, node, data):
    return w.emit("Unsqueeze", [w.value(data[0]), _axes_input(w, node, w.const_input(node, 1))], node.name)


def _concat(w, node, data):
    axis = int(w.const_input(node, len(data) - 1))
    return w.emit("Concat", [w.value(d) for d in data[:-1]], node.name, axis=axis)


def _cast(w, node, data):
    from onnx import helper

    to = helper.np_dtype_to_tensor_dtype(np.dtype(tf.as_dtype(node.attr["DstT"].type).as_numpy_dtype))
    return w.emit("Cast", [w.value(data[0])], node.name, to=to)


def _reduce(w, node, data):
    axes = [int(a) for a in np.asarray(w.const_input(node, 1)).reshape(-1)]
    keep = int(node.attr["keep_dims"].b)
    onnx_op = _REDUCE[node.op]
    if onnx_op == "ReduceSum" or w.opset >= 18:
        return w.emit(onnx_op, [w.value(data[0]), _axes_input(w, node, axes)], node.name, keepdims=keep)
    return w.emit(onnx_op, [w.value(data[0])], node.name, axes=axes, keepdims=keep)


def _pool(w, node, data):
    fmt = node.attr["data_format"].s.decode()
    ksize, strides = list(node.attr["ksize"].list.i), list(node.attr["strides"].list.i)
    padding = node.attr["padding"].s.decode()
    if padding not in ("VALID", "SAME"):
        raise OnnxExportError(f"save_onnx: {node.op} {node.name!r} with padding {padding} is not supported.")
    hw = slice(1, 3) if fmt == "NHWC" else slice(2, 4)
    x = w.value(data[0])
    if fmt == "NHWC":
        x = w.emit("Transpose", [x], node.name + "/nchw", perm=[0, 3, 1, 2])
    attrs = {"kernel_shape": ksize[hw], "strides": strides[hw],
             "auto_pad": "VALID" if padding == "VALID" else "SAME_UPPER"}
    y = w.emit("MaxPool" if node.op == "MaxPool" else "AveragePool", [x], node.name + ("/pool" if fmt == "NHWC" else ""),
               **attrs)
    return w.emit("Transpose", [y], node.name, perm=[0, 2, 3, 1]) if fmt == "NHWC" else y


HANDLERS: dict[str, Callable] = {
    **{op: _unary for op in _UNARY}, **{op: _binary for op in _BINARY}, **{op: _reduce for op in _REDUCE},
    "MatMul": _matmul, "Rsqrt": _rsqrt, "Erfc": _erfc, "Square": _square, "SquaredDifference": _squared_difference,
    "Relu6": _relu6, "Elu": _elu, "LeakyRelu": _leaky, "Softmax": _softmax, "LogSoftmax": _softmax,
    "Transpose": _transpose, "Reshape": _reshape, "Squeeze": _squeeze, "ExpandDims": _expand_dims,
    "ConcatV2": _concat, "Cast": _cast, "MaxPool": _pool, "AvgPool": _pool, "Shape": _shape, "GatherV2": _gather,
    "Pack": _pack, "StridedSlice": _strided_slice,
}
