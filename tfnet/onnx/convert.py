"""An ONNX graph as a weightless TensorFlow graph that :class:`tfnet.TFNet` runs and differentiates.

Every float initializer of rank >= 1 becomes a weight: a ``Placeholder`` named after the
initializer (characters TensorFlow does not allow in node names become ``_``), with its value kept
aside. Graph inputs become placeholders with an unknown batch dimension; outputs (any ONNX value
names) become ``Identity`` nodes named after them. The operators are mapped one by one
(:mod:`tfnet.onnx.ops`, :mod:`tfnet.onnx.ops_nn`), in NHWC where that is faster on the CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfnet import graph_utils as gu
from tfnet.errors import TensorNameError, unknown_name_message
from tfnet.freeze import clean_node_name
from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError, UnsupportedOperatorError
from tfnet.onnx.load import MAX_OPSET, MIN_OPSET, check_opset
from tfnet.onnx.ops import HANDLERS, supported_operators
from tfnet.onnx.shared_stats import initializer_aliases, shared_statistics


@dataclass
class Converted:
    """The converted graph: ``template`` with weights as placeholders, their ``values``, and the
    names that tie it back to the ONNX model."""

    template: graph_pb2.GraphDef
    inputs: list[str]  # TF tensor names, in order
    outputs: list[str]
    values: dict[str, np.ndarray]  # TF weight name -> value
    statistics: list[str]
    onnx_weight_names: dict[str, str]  # TF weight name -> ONNX initializer name
    onnx_values: dict[str, tuple[str, bool]]  # TF tensor name -> (ONNX value name, held in NHWC?)
    statistic_copies: dict[str, str]  # TF weight name -> the shared ONNX initializer it is a statistic copy of


# float inputs that set the computation rather than feed it: constants, never weights
_STATIC_INPUTS = {"Resize": (1, 2)}


def check_operators(model) -> None:
    """Raises :class:`UnsupportedOperatorError` listing every unsupported operator and its count."""
    supported = set(supported_operators())
    counts: Counter = Counter()
    for node in _all_nodes(model.graph):
        domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        if domain or node.op_type not in supported:
            counts[f"{domain}::{node.op_type}" if domain else node.op_type] += 1
    if counts:
        listed = ", ".join(f"{op} (x{n})" for op, n in sorted(counts.items()))
        loops = sorted({"Loop", "Scan"} & set(counts))
        hint = (f" {' and '.join(loops)} run a body a number of times known only at run time; tfnet converts "
                "graphs without data-dependent loops (export recurrent nets with their ONNX LSTM/GRU/RNN "
                "operators and a fixed sequence length)." if loops else "")
        raise UnsupportedOperatorError(
            f"The ONNX model uses {sum(counts.values())} node(s) of operators tfnet cannot convert: {listed}.{hint} "
            f"Supported operators (default domain, opsets {MIN_OPSET}-{MAX_OPSET}): {', '.join(sorted(supported))}."
        )


def _all_nodes(graph):
    """The nodes of ``graph`` and of the subgraphs (``If`` branches) inside it."""
    from onnx import AttributeProto

    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g)


def convert(
    model,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    propagate_layout: bool = True,
    relax_batch: bool = True,
) -> Converted:
    """Converts a checked ``onnx.ModelProto`` (see :func:`tfnet.onnx.load.read_model`).

    Args:
        model: The model.
        inputs: ONNX graph input names, in the order the net takes them. Default: every graph input
            that is not an initializer, in graph order.
        outputs: ONNX value names to return; any value of the graph can be one. Default: the graph
            outputs.
        propagate_layout: Keep convolution results in NHWC through element-wise ops (default).
            False transposes back to NCHW after every convolution and pool (for comparison).
        relax_batch: Make dimension 0 of every input unknown, even where the model fixes it (a
            model exported without dynamic axes). Dimensions the model leaves symbolic are always
            unknown. Default: True.
    """
    from onnx import helper, numpy_helper

    opset = check_opset(model)
    check_operators(model)
    g = model.graph
    init_names = {t.name for t in g.initializer}
    graph_inputs = [i for i in g.input if i.name not in init_names]
    by_input = {i.name: i for i in graph_inputs}
    input_names = [i.name for i in graph_inputs] if inputs is None else list(inputs)
    for name in input_names:
        if name not in by_input:
            raise TensorNameError(unknown_name_message("ONNX graph input", name, list(by_input)))
    output_names = [o.name for o in g.output] if outputs is None else list(outputs)
    known = {o for n in g.node for o in n.output if o} | set(by_input) | init_names
    for name in output_names:
        if name not in known:
            raise TensorNameError(unknown_name_message("ONNX value", name, sorted(known)))

    taken: set[str] = set()

    def tf_name(onnx_name: str) -> str:
        name = gu.unique_name(clean_node_name(onnx_name), taken)
        taken.add(name)
        return name

    static_inputs = {n.input[i] for n in g.node for i in _STATIC_INPUTS.get(n.op_type, ()) if i < len(n.input)}
    shared = shared_statistics(g)
    ctx = Ctx(opset=opset, propagate=propagate_layout, aliases=initializer_aliases(g))
    graph = tf.Graph()
    values: dict[str, np.ndarray] = {}
    onnx_weight_names: dict[str, str] = {}
    tf_inputs: list[str] = []
    with graph.as_default():
        for t in g.initializer:
            value = numpy_helper.to_array(t)
            if value.dtype.kind == "f" and value.ndim >= 1 and t.name not in static_inputs:
                name = tf_name(t.name)
                ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape, name=name)
                values[name] = value
                onnx_weight_names[name] = t.name
                ctx.weight_tf_names[t.name] = name
                ctx.set(t.name, ph)
                if t.name in shared:  # a batch-norm statistic elsewhere: that use reads its own frozen copy
                    copy = tf_name(t.name + "_statistic")
                    ctx.stat_copies[t.name] = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape, name=copy)
                    values[copy] = value.copy()
            else:
                ctx.set(t.name, tf.constant(value, name=tf_name(t.name)))
        for name in by_input:
            info = by_input[name]
            ttype = info.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
            if dims and relax_batch:
                dims[0] = None  # dynamic batch
            ph_name = tf_name(name)
            dtype = tf.as_dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
            ctx.set(name, tf.compat.v1.placeholder(dtype, dims if ttype.HasField("shape") else None, name=ph_name))
            if name in input_names:
                tf_inputs.append((input_names.index(name), ph_name + ":0"))
        try:
            convert_nodes(ctx, g.node)
        finally:
            ctx.close()
        tf_outputs = []
        for name in output_names:
            out = tf.identity(ctx.plain(name), name=tf_name(name))
            tf_outputs.append(out.name)
            ctx.onnx_of.setdefault(out.name, (name, False))
    template = graph.as_graph_def()
    inputs_sorted = [n for _, n in sorted(tf_inputs)]
    template = gu.subgraph(template, tf_outputs, feeds=inputs_sorted)
    kept = gu.nodes_by_name(template)
    values = {k: v for k, v in values.items() if k in kept}
    stats = [s for s in dict.fromkeys(ctx.statistics) if s in values]
    copies = {ph.op.name: name for name, ph in ctx.stat_copies.items() if ph.op.name in values}
    return Converted(template, inputs_sorted, tf_outputs, values, stats,
                     {k: v for k, v in onnx_weight_names.items() if k in values}, dict(ctx.onnx_of), copies)


def convert_nodes(ctx: Ctx, nodes) -> None:
    """Converts ``nodes`` in order into ``ctx`` (also the nodes of an inlined ``If`` branch)."""
    from onnx import helper

    for i, node in enumerate(nodes):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        scope = "ops/" + clean_node_name(node.name or f"{node.op_type}_{i}")
        with tf.name_scope(scope + "/"):
            try:
                HANDLERS[node.op_type](ctx, node, attrs)
            except OnnxConversionError:
                raise
            except (ValueError, TypeError, tf.errors.OpError) as exc:
                shapes = [str(ctx.values[n].tensor.shape) if ctx.has(n) else "?" for n in node.input if n]
                raise OnnxConversionError(
                    f"Converting {node.op_type} node {node.name!r} (inputs {list(node.input)} with shapes "
                    f"{shapes}) failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
                ) from None
