"""The graph that runs (never the one saved), kept clear of a TensorFlow remapper bug.

With oneDNN on, TensorFlow's remapper fuses ``Conv2D`` (or another contraction), ``BiasAdd``, a two-input ``Add``
and the activation that reads the sum into one op, and deletes the sum; it does not check that nothing else reads the
sum (``FindContractionWithBiasAndAddActivation``). Where a residual connection goes on past the next block's
activation (Xception's middle flow, NASNet's cells, a pre-activation residual net's blocks), the next sum still reads
it: the pass fails with "remapper failed: INVALID_ARGUMENT: Mutation::Apply error: fanout ... exist for missing node
..." on the console at the first forward or gradient, and the graph runs without any of the remapper's fusions. A
Keras model with biased convolutions there meets it under ``tf.GradientTape`` in a ``tf.function``; in tfnet, an ONNX
model's biased convolutions (PyTorch's export folds batch norms into them), a frozen graph's ``BiasAdd`` and the
biases that tfnet.fold makes of batch norms do.

Such a ``BiasAdd`` becomes the ``AddV2`` it computes (an NHWC bias adds along the last axis, as a vector broadcasts),
which the remapper does not take for that fusion: the same function and gradients, and every other fusion kept
(:func:`rewrite_graph`).

The same pass fuses a ``Pad`` into the ``Conv3D`` that reads it and deletes the ``Pad``, though a gradient reads it too
(the filter gradient's ``ShapeN``: "fanout 'gradients/.../Conv3D_grad/ShapeN' exist for missing node '.../Pad'") and
checks no readers there either (``FindPadWithConv3D``): every gradient of a padded 3-D convolution (Keras's
``ZeroPadding3D``, an ONNX ``Conv`` with pads, ``tf.pad`` in a frozen graph) fails it. In a graph that gradients
are taken of, such a ``Pad`` becomes the ``PadV2`` of zero it computes, which the pass does not take
(:func:`rewrite_pads`); a forward pass keeps the ``Pad``, whose fusion is sound there and 15-25% faster (a 3-D CNN's
forward, docs/benchmarks.md).
Pure functions of a ``GraphDef``.
"""

from __future__ import annotations

import numpy as np
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import dtypes, tensor_util

from tfnet.graph_utils import data_readers, node_name, nodes_by_name, unique_name

_SUM_OPS = ("Add", "AddV2", "AddN")
#: What the remapper fuses after a contraction, its bias and a sum (its ``IsSupportedActivation``).
_FUSED_ACTIVATIONS = ("Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid")
_CONTRACTIONS = ("Conv2D", "Conv3D", "MatMul", "BatchMatMul", "BatchMatMulV2", "DepthwiseConv2dNative")


def _feeds_a_shared_sum(name: str, nodes: dict, readers: dict[str, list[str]]) -> bool:
    """Whether ``name``'s one reader is a sum of two tensors that more than one op reads, an activation among them:
    where a contraction and a bias before it make the pattern the remapper breaks on."""
    after = readers.get(name, ())
    if len(after) != 1:
        return False
    total = nodes[after[0]]
    if total.op not in _SUM_OPS or sum(not i.startswith("^") for i in total.input) != 2:
        return False
    sum_readers = readers.get(total.name, ())
    return len(sum_readers) > 1 and any(nodes[r].op in _FUSED_ACTIVATIONS for r in sum_readers)


def rewrite_graph(graph_def: graph_pb2.GraphDef) -> tuple[graph_pb2.GraphDef, int]:
    """``graph_def`` with each NHWC ``BiasAdd`` after a contraction that feeds a shared sum made an ``AddV2``, and how
    many were; the graph itself where none is."""
    nodes = nodes_by_name(graph_def)
    readers = data_readers(graph_def)
    names = [
        n.name for n in graph_def.node
        if n.op == "BiasAdd" and _data_format(n) in (b"", b"NHWC") and len(n.input) >= 2
        and getattr(nodes.get(node_name(n.input[0])), "op", None) in _CONTRACTIONS
        and _feeds_a_shared_sum(n.name, nodes, readers)
    ]
    if not names:
        return graph_def, 0
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    chosen = set(names)
    for node in out.node:
        if node.name in chosen:
            node.op = "AddV2"
            del node.attr["data_format"]
    return out, len(names)


def rewrite_pads(graph_def: graph_pb2.GraphDef) -> tuple[graph_pb2.GraphDef, int]:
    """``graph_def`` with each ``Pad`` that a ``Conv3D`` reads made a ``PadV2`` with a zero of its dtype, and how many
    were; the graph itself where none is."""
    nodes = nodes_by_name(graph_def)
    readers = data_readers(graph_def)
    chosen = {n.name for n in graph_def.node if n.op == "Pad" and _read_by_a_conv3d(n.name, nodes, readers)}
    if not chosen:
        return graph_def, 0
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    taken = set(nodes)
    for node in [n for n in out.node if n.name in chosen]:
        zero = out.node.add()
        zero.name = unique_name(node.name + "/zero", taken)
        taken.add(zero.name)
        zero.op = "Const"
        zero.device = node.device
        zero.attr["dtype"].type = node.attr["T"].type
        zero.attr["value"].tensor.CopyFrom(
            tensor_util.make_tensor_proto(np.zeros((), dtypes.as_dtype(node.attr["T"].type).as_numpy_dtype)))
        node.op = "PadV2"
        node.input.insert(2, zero.name)  # after the input and the paddings, before any control input
    return out, len(chosen)


def _read_by_a_conv3d(name: str, nodes: dict, readers: dict[str, list[str]]) -> bool:
    """Whether a ``Conv3D`` reads ``name``'s value, directly or through what grappler removes before the remapper runs
    (an ``Identity``, a ``Split`` into one: tfnet.onnx splits a convolution's input by its groups)."""
    for reader in readers.get(name, ()):
        node = nodes[reader]
        if node.op == "Conv3D":
            return True
        passes = node.op == "Identity" or (node.op == "Split" and node.attr["num_split"].i == 1)
        if passes and _read_by_a_conv3d(node.name, nodes, readers):
            return True
    return False


def _data_format(node) -> bytes:
    """The node's ``data_format`` (b"" where unset), read without adding the attribute to the caller's graph."""
    return node.attr["data_format"].s if "data_format" in node.attr else b""
