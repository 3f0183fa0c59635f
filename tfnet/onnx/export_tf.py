"""TensorFlow ops of a Keras head (``TFNet.add_head``) as ONNX nodes, for ``save_onnx``.

A head is frozen from Keras in inference mode, so it holds few kinds of ops: matrix products and
bias adds (``Dense``), activations, reductions (global pooling), pools, reshapes (``Flatten``) and
the arithmetic of a decomposed batch norm. :class:`HeadWriter` walks the TensorFlow graph back from
the net's outputs and writes each op it reaches as ONNX nodes, until it reaches a tensor the ONNX
body made (``boundary``). Dropout is absent from an inference graph. Shapes computed at run time
(``Flatten``'s ``Shape -> StridedSlice -> Pack``) are replaced by the static shape TensorFlow knows
for the result, with ``-1`` for the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf

from tfnet import graph_utils as gu
from tfnet.onnx.errors import OnnxExportError

_UNARY = {
    "Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
    "Neg": "Neg", "Abs": "Abs", "Erf": "Erf", "Softplus": "Softplus", "Reciprocal": "Reciprocal",
    "Inv": "Reciprocal", "Floor": "Floor", "Ceil": "Ceil", "Selu": "Selu", "Softsign": "Softsign",
    "Sign": "Sign", "Sin": "Sin", "Cos": "Cos",
}
_BINARY = {"AddV2": "Add", "Add": "Add", "BiasAdd": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div",
           "Maximum": "Max", "Minimum": "Min", "Pow": "Pow"}
_REDUCE = {"Mean": "ReduceMean", "Max": "ReduceMax", "Min": "ReduceMin", "Sum": "ReduceSum", "Prod": "ReduceProd"}
_ALIASES = ("Identity", "StopGradient", "PreventGradient", "Snapshot")


def supported_tf_ops() -> list[str]:
    return sorted({*_UNARY, *_BINARY, *_REDUCE, *_ALIASES, "MatMul", "Rsqrt", "Erfc", "Square", "Relu6", "Elu",
                   "LeakyRelu", "Softmax", "LogSoftmax", "Transpose", "Reshape", "Squeeze", "ExpandDims",
                   "ConcatV2", "Cast", "MaxPool", "AvgPool", "SquaredDifference", "Const"})


class HeadWriter:
    """Writes the TensorFlow ops behind the net's outputs as ONNX nodes.

    Args:
        template: The net's weightless graph (weights are placeholders).
        weights: Current weight values by name; the head's become initializers.
        boundary: Maps a TensorFlow tensor name to the ONNX value the body makes for it, or None.
        opset: The model's default-domain opset (reductions take ``axes`` as an input from 18).
        taken: ONNX value names already in use.
    """

    def __init__(self, template, weights: Mapping[str, np.ndarray], boundary: Callable[[str], str | None],
                 opset: int, taken: set[str]):
        self.nodes_by_name = gu.nodes_by_name(template)
        self.weights = weights
        self.boundary = boundary
        self.opset = opset
        self.taken = taken
        self.nodes: list = []
        self.initializers: list = []
        self._names: dict[str, str] = {}
        self._graph = tf.Graph()
        with self._graph.as_default():
            tf.graph_util.import_graph_def(template, name="")

    # ---------------------------------------------------------------- naming and emitting

    def fresh(self, base: str) -> str:
        name = gu.unique_name(base, self.taken)
        self.taken.add(name)
        return name

    def emit(self, op: str, inputs: list[str], base: str, **attrs) -> str:
        from onnx import helper

        out = self.fresh(base)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def constant(self, value: np.ndarray, base: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def static_shape(self, tensor: str) -> list[int | None]:
        return self._graph.get_tensor_by_name(tensor).shape.as_list()

    def const_input(self, node, index: int) -> np.ndarray:
        src = self.nodes_by_name[gu.node_name(node.input[index])]
        if src.op != "Const":
            raise OnnxExportError(f"save_onnx: {node.op} node {node.name!r} needs a constant input {index}; "
                                  f"it comes from {src.op} {src.name!r}.")
        return gu.const_value(src)

    # ---------------------------------------------------------------- the walk

    def value(self, tensor: str) -> str:
        """The ONNX value name for TensorFlow tensor ``tensor`` (``node:index``)."""
        tensor = gu.tensor_name(tensor)
        if tensor in self._names:
            return self._names[tensor]
        hit = self.boundary(tensor)
        if hit is None:
            hit = self._write(tensor)
        self._names[tensor] = hit
        return hit

    def _write(self, tensor: str) -> str:
        node = self.nodes_by_name[gu.node_name(tensor)]
        if not tensor.endswith(":0"):
            raise OnnxExportError(f"save_onnx: output {tensor!r} of {node.op} {node.name!r} is not supported.")
        op = node.op
        data = [i for i in node.input if not i.startswith("^")]
        if op == "Placeholder":
            if node.name not in self.weights:
                raise OnnxExportError(f"save_onnx: placeholder {node.name!r} is neither a weight nor an ONNX input.")
            return self.constant(self.weights[node.name], node.name)
        if op == "Const":
            return self.constant(gu.const_value(node), node.name)
        if op in _ALIASES:
            return self.value(data[0])
        handler = _HANDLERS.get(op)
        if handler is None:
            raise OnnxExportError(
                f"save_onnx cannot write TensorFlow op {op} (node {node.name!r}) of the head as ONNX. Heads of "
                f"these ops are supported: {', '.join(supported_tf_ops())} (Keras Dense, activations, Dropout, "
                "Flatten, pooling, BatchNormalization). Use net.save(folder) for a frozen TensorFlow graph instead."
            )
        return handler(self, node, data)


# -------------------------------------------------------------------- handlers


def _unary(w: HeadWriter, node, data):
    return w.emit(_UNARY[node.op], [w.value(data[0])], node.name)


def _binary(w: HeadWriter, node, data):
    if node.op == "BiasAdd" and node.attr["data_format"].s == b"NCHW":
        raise OnnxExportError(f"save_onnx: BiasAdd {node.name!r} in NCHW is not supported.")
    return w.emit(_BINARY[node.op], [w.value(data[0]), w.value(data[1])], node.name)


def _matmul(w: HeadWriter, node, data):
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
    one = w.constant(np.ones((), w._graph.get_tensor_by_name(node.name + ":0").dtype.as_numpy_dtype), node.name + "/one")
    return w.emit("Sub", [one, w.emit("Erf", [x], node.name + "/erf")], node.name)


def _square(w, node, data):
    x = w.value(data[0])
    return w.emit("Mul", [x, x], node.name)


def _squared_difference(w, node, data):
    d = w.emit("Sub", [w.value(data[0]), w.value(data[1])], node.name + "/d")
    return w.emit("Mul", [d, d], node.name)


def _relu6(w, node, data):
    dtype = w._graph.get_tensor_by_name(node.name + ":0").dtype.as_numpy_dtype
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
    if shape is None or any(d is None for d in shape[1:]):
        shape = [int(s) for s in w.const_input(node, 1)]  # a constant target shape, as written
    else:
        shape = [-1 if shape[0] is None else shape[0], *shape[1:]]
    target = w.constant(np.asarray(shape, np.int64), node.name + "/shape")
    return w.emit("Reshape", [w.value(data[0]), target], node.name)


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


_HANDLERS: dict[str, Callable] = {
    **{op: _unary for op in _UNARY}, **{op: _binary for op in _BINARY}, **{op: _reduce for op in _REDUCE},
    "MatMul": _matmul, "Rsqrt": _rsqrt, "Erfc": _erfc, "Square": _square, "SquaredDifference": _squared_difference,
    "Relu6": _relu6, "Elu": _elu, "LeakyRelu": _leaky, "Softmax": _softmax, "LogSoftmax": _softmax,
    "Transpose": _transpose, "Reshape": _reshape, "Squeeze": _squeeze, "ExpandDims": _expand_dims,
    "ConcatV2": _concat, "Cast": _cast, "MaxPool": _pool, "AvgPool": _pool,
}
