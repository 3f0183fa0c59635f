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
from tfnet.onnx.export_tf_ops import HANDLERS, supported_tf_ops


class HeadWriter:
    """Writes the TensorFlow ops behind the net's outputs as ONNX nodes.

    Args:
        template: The net's weightless graph (weights are placeholders).
        weights: Current weight values by name; the head's become initializers.
        boundary: Maps a TensorFlow tensor name to the ONNX value the body makes for it, or None.
        opset: The model's default-domain opset (reductions take ``axes`` as an input from 18).
        taken: ONNX value names already in use.

    Attributes:
        graph: ``template`` imported into a ``tf.Graph``, for static dtypes, shapes and values
            (the op handlers of :mod:`tfnet.onnx.export_tf_ops` read it).
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
        self.graph = tf.Graph()
        with self.graph.as_default():
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
        """An initializer; integers become int64, as ONNX's shape operators take them."""
        from onnx import numpy_helper

        value = np.asarray(value)
        if value.dtype.kind in "iu":
            value = value.astype(np.int64)
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def static_shape(self, tensor: str) -> list[int | None]:
        return self.graph.get_tensor_by_name(tensor).shape.as_list()

    def const_input(self, node, index: int) -> np.ndarray:
        """Input ``index`` of ``node``, which must be computed from constants only."""
        src = self.nodes_by_name[gu.node_name(node.input[index])]
        value = tf.get_static_value(self.graph.get_tensor_by_name(gu.tensor_name(node.input[index])))
        if value is not None:
            return value
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
        if op in ("Identity", "StopGradient", "PreventGradient", "Snapshot"):
            return self.value(data[0])
        handler = HANDLERS.get(op)
        if handler is None:
            raise OnnxExportError(
                f"save_onnx cannot write TensorFlow op {op} (node {node.name!r}) of the head as ONNX. Heads of "
                f"these ops are supported: {', '.join(supported_tf_ops())} (Keras Dense, activations, Dropout, "
                "Flatten, pooling, BatchNormalization). Use net.save(folder) for a frozen TensorFlow graph instead."
            )
        return handler(self, node, data)
