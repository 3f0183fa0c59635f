"""Finding normalisation statistics (batch-norm moving mean and variance) by graph structure.

Statistics are weights that the original framework does not train. Names cannot be trusted: a
graph frozen by TensorFlow's converter names Keras 3's moving variance
``.../batch_normalization_1/Cast_1/ReadVariableOp/resource``. So a weight is a statistic by what
the graph does with it:

* inputs 3 and 4 (mean, variance) of an inference-mode ``FusedBatchNorm*``;
* the unfused pattern of ``tf.nn.batch_normalization`` and Keras 3's inference batch norm,
  ``inv = rsqrt(variance + eps) [* gamma]``, ``y = x * inv + (beta - mean * inv)``: the weight
  under ``Rsqrt(w + eps)`` is a variance, the weight multiplied by ``inv`` and then subtracted
  (``Sub`` or ``Neg``) is a mean;
* the standardising pattern of Keras's ``Normalization`` layer,
  ``(x - mean) / max(sqrt(variance), eps)`` (or ``* rsqrt(...)``).

Every walk here is iterative with a visited set and a step bound, so graphs with cycles (v1
control flow) cost time linear in their size.
"""

from __future__ import annotations

from collections.abc import Iterable

from tensorflow.core.framework import graph_pb2

from tfnet.graph_utils import data_readers, node_name, nodes_by_name

__all__ = ["find_statistics"]

FUSED_BATCH_NORM_OPS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
# Ops that pass a weight's value through unchanged in content (reads, casts, reshapes).
_PASS_THROUGH = ("Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "ReadVariableOp", "Snapshot",
                 "StopGradient", "PreventGradient")
# Ops through which the inverse standard deviation keeps its meaning (scaled by gamma, cast, ...).
_INV_CARRIERS = ("Mul", "Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "Maximum", "Reciprocal", "Inv")
_ADDS = ("Add", "AddV2")
_MAX_CHAIN = 64

MEAN = "mean"
VARIANCE = "variance"


def _data_inputs(node) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


def _source_weight(name: str, nodes, weights: set[str]) -> str | None:
    """The weight whose value ``name`` passes through unchanged, or None."""
    for _ in range(_MAX_CHAIN):
        if name in weights:
            return name
        node = nodes.get(name)
        if node is None or node.op not in _PASS_THROUGH:
            return None
        inputs = _data_inputs(node)
        if not inputs:
            return None
        name = node_name(inputs[0])
    return None


def _is_scalar_const(name: str, nodes) -> bool:
    for _ in range(_MAX_CHAIN):
        node = nodes.get(name)
        if node is None:
            return False
        if node.op == "Const":
            return all(d.size == 1 for d in node.attr["value"].tensor.tensor_shape.dim)
        if node.op not in _PASS_THROUGH or not _data_inputs(node):
            return False
        name = node_name(_data_inputs(node)[0])
    return False


def find_statistics(graph_def: graph_pb2.GraphDef, weight_names: Iterable[str]) -> dict[str, str]:
    """Returns ``{weight: "mean" | "variance"}`` for the weights that hold normalisation statistics,
    in the order of ``weight_names``."""
    weight_names = list(weight_names)
    weights = set(weight_names)
    nodes = nodes_by_name(graph_def)
    consumers = data_readers(graph_def)
    found: dict[str, str] = {}

    def mark(name: str | None, role: str) -> None:
        if name is not None:
            found.setdefault(name, role)

    roots = []  # Rsqrt / Sqrt nodes that compute an inverse standard deviation from a weight
    for node in graph_def.node:
        inputs = _data_inputs(node)
        if node.op in FUSED_BATCH_NORM_OPS and not node.attr["is_training"].b and len(inputs) >= 5:
            mark(_source_weight(node_name(inputs[3]), nodes, weights), MEAN)
            mark(_source_weight(node_name(inputs[4]), nodes, weights), VARIANCE)
        elif node.op in ("Rsqrt", "Sqrt") and inputs:
            var = _variance_under(node_name(inputs[0]), nodes, weights)
            if var is not None:
                mark(var, VARIANCE)
                roots.append(node.name)
    # Everything that carries the inverse standard deviation (or, for Sqrt, the deviation).
    inv: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in inv:
            continue
        inv.add(name)
        for c in consumers[name]:
            if nodes[c].op in _INV_CARRIERS and c not in inv:
                stack.append(c)
    for name in inv:
        for c in consumers[name]:
            node = nodes[c]
            inputs = [node_name(i) for i in _data_inputs(node)]
            if len(inputs) != 2:
                continue
            other = inputs[1] if inputs[0] == name else inputs[0]
            if node.op == "Mul":
                # mean * inv, then subtracted from beta (or negated): the mean.
                w = _source_weight(other, nodes, weights)
                if w is not None and other not in inv and any(
                    nodes[s].op == "Neg" or (nodes[s].op == "Sub" and node_name(_data_inputs(nodes[s])[1]) == c)
                    for s in consumers[c]
                ):
                    mark(w, MEAN)
            if node.op in ("Mul", "RealDiv", "Div") and other not in inv:
                # (x - mean) * inv or (x - mean) / std: the mean.
                sub = nodes.get(other)
                if sub is not None and sub.op == "Sub" and len(_data_inputs(sub)) == 2:
                    mark(_source_weight(node_name(_data_inputs(sub)[1]), nodes, weights), MEAN)
    return {w: found[w] for w in weight_names if w in found}


def _variance_under(name: str, nodes, weights: set[str]) -> str | None:
    """The weight ``w`` if ``name`` computes ``w + eps`` (eps a scalar constant) or is ``w``."""
    direct = _source_weight(name, nodes, weights)
    if direct is not None:
        return direct
    node = nodes.get(name)
    if node is None or node.op not in _ADDS or len(_data_inputs(node)) != 2:
        return None
    a, b = (node_name(i) for i in _data_inputs(node))
    for w_side, eps_side in ((a, b), (b, a)):
        w = _source_weight(w_side, nodes, weights)
        if w is not None and _is_scalar_const(eps_side, nodes):
            return w
    return None
