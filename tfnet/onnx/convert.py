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
from tfnet.graph_utils import clean_node_name
from tfnet.onnx.context import Ctx
from tfnet.onnx.dtypes import carrier_array, is_carried, tf_type
from tfnet.onnx.errors import OnnxConversionError, UnsupportedOperatorError
from tfnet.onnx.functions import expand, function_of
from tfnet.onnx.handlers import supported_operators
from tfnet.onnx.load import MIN_OPSET, check_opset, max_opset, opset_of
from tfnet.onnx.registry import DEFAULT_DOMAINS, HANDLERS, handles, op_version
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
_STATIC_INPUTS = {"Resize": (1, 2), "Upsample": (1,), "Clip": (1, 2), "Pad": (2,), "NonMaxSuppression": (2, 3, 4),
                  "QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2)}


def missing_operators(model) -> Counter:
    """``{"Op vN" or "domain::Op": count}`` of the nodes tfnet cannot convert: operators with no
    handler for their version and no ONNX function definition whose nodes convert (see
    :mod:`tfnet.onnx.registry`), checked in subgraphs and expanded functions too."""
    counts: Counter = Counter()
    types: dict = {}

    def input_types(node):
        if not types:
            types.update(_value_types(model))
        return [types.get(n) or _float_type() for n in node.input]

    def walk(nodes, opset: int, depth: int) -> None:
        for node in nodes:
            if node.domain not in DEFAULT_DOMAINS:
                counts[f"{node.domain}::{node.op_type}"] += 1
                continue
            version = op_version(node.op_type, opset)
            if handles(node.op_type, version):
                for g in _subgraphs(node):
                    walk(g.node, opset, depth)
                continue
            found = function_of(node, opset, lambda node=node: input_types(node)) if depth < 8 else None
            if found is None:
                counts[node.op_type if version is None else f"{node.op_type} v{version}"] += 1
                continue
            function, body_opset = found
            walk(expand(node, function, f"{node.output[0]}/", opset), body_opset, depth + 1)

    walk(model.graph.node, opset_of(model), 0)
    return counts


def check_operators(model) -> None:
    """Raises :class:`UnsupportedOperatorError` listing every node tfnet cannot convert (operator,
    version and count) before anything is converted."""
    counts = missing_operators(model)
    if not counts:
        return
    listed = ", ".join(f"{op} (x{n})" for op, n in sorted(counts.items()))
    loops = sorted({"Loop", "Scan"} & {k.split(" ")[0] for k in counts})
    hint = (f" {' and '.join(loops)}: tfnet converts Loop from version 11 (a tf.while_loop) and Scan from version "
            "9 (unrolled over a static sequence length); upgrade older models with onnx.version_converter." if loops
            else "")
    raise UnsupportedOperatorError(
        f"The ONNX model uses {sum(counts.values())} node(s) that tfnet cannot convert: {listed} (vN: the "
        f"operator's version at the model's opset {opset_of(model)}, as in ONNX's Operators.md).{hint} "
        f"Supported operators (default domain; versions per operator in docs/onnx.md, opsets "
        f"{MIN_OPSET}-{max_opset()}): {', '.join(supported_operators())}."
    )


def _subgraphs(node):
    from onnx import AttributeProto

    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def _float_type():
    from onnx import TensorProto, helper

    return helper.make_tensor_type_proto(TensorProto.FLOAT, None)


def _value_types(model) -> dict:
    """Value name -> ``TypeProto``, from the graph and onnx's shape inference."""
    from onnx import helper, shape_inference

    try:
        inferred = shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - inference is a help here, not a requirement
        inferred = model.graph
    types = {v.name: v.type for v in list(inferred.input) + list(inferred.value_info) + list(inferred.output)}
    for t in model.graph.initializer:
        types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


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
            model exported without dynamic axes), when those inputs make one batch (:func:`shares_batch`;
            where they fix different sizes there, or others leave it symbolic, they are whole tensors and
            keep their shapes). Dimensions the model leaves symbolic are always unknown. Default: True.
    """
    opset = check_opset(model)
    check_operators(model)
    g = model.graph
    by_input, input_names, output_names = _names(g, inputs, outputs)
    taken: set[str] = set()

    def tf_name(onnx_name: str) -> str:
        name = gu.unique_name(clean_node_name(onnx_name), taken)
        taken.add(name)
        return name

    static_inputs = {n.input[i] for n in g.node for i in _STATIC_INPUTS.get(n.op_type, ()) if i < len(n.input)}
    shared = shared_statistics(g)
    ctx = Ctx(opset=opset, propagate=propagate_layout, aliases=initializer_aliases(g), converter=convert_nodes)
    graph = tf.Graph()
    values: dict[str, np.ndarray] = {}
    onnx_weight_names: dict[str, str] = {}
    with graph.as_default():
        _initializers(ctx, g, tf_name, static_inputs, shared, values, onnx_weight_names)
        tf_inputs = _inputs(ctx, by_input, input_names, tf_name, relax_batch)
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


def _names(g, inputs, outputs) -> tuple[dict, list[str], list[str]]:
    """``(graph inputs by name, input names in the net's order, output names)``, each name checked.

    Raises:
        TensorNameError: an input that is not a graph input, or an output that no node makes.
    """
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
    declared = {o.name: o for o in g.output}
    for kind, infos in (("input", list(by_input.values())),  # every one gets a placeholder, taken or not
                        ("output", [declared[n] for n in output_names if n in declared])):
        for info in infos:
            if info.type.WhichOneof("value") not in ("tensor_type", None):
                raise OnnxConversionError(
                    f"The ONNX graph's {kind} {info.name!r} is {_type_text(info.type)}: a TFNet takes and gives "
                    "tensors. Sequences and optionals convert inside the graph (ConcatFromSequence, SequenceAt, "
                    "OptionalGetElement make tensors of them); choose tensor inputs and outputs with inputs= and "
                    "outputs=, or end the graph in such a node.")
    return by_input, input_names, output_names


def _type_text(t) -> str:
    """An ONNX ``TypeProto`` in words: "a sequence of tensors", "an optional of a sequence of tensors", ..."""
    kind = t.WhichOneof("value")
    if kind == "sequence_type":
        return "a sequence of " + _type_text(t.sequence_type.elem_type).removeprefix("a ").removeprefix("an ") + "s"
    if kind == "optional_type":
        return "an optional of " + _type_text(t.optional_type.elem_type)
    if kind == "map_type":
        return "a map"
    return "a tensor" if kind == "tensor_type" else f"a value of type {kind}"


def _initializers(ctx: Ctx, g, tf_name, static_inputs: set, shared: set, values: dict, onnx_weight_names: dict) -> None:
    """Float initializers of rank >= 1 become placeholders (the net's weights, their values into
    ``values``), with a frozen copy where a batch norm shares one; the others become constants."""
    from onnx import numpy_helper

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
            ctx.set(t.name, tf.constant(carrier_array(value), name=tf_name(t.name)))
        if is_carried(t.data_type):
            ctx.onnx_types[t.name] = t.data_type


def _inputs(ctx: Ctx, by_input: dict, input_names: list[str], tf_name, relax_batch: bool) -> list[tuple[int, str]]:
    """A placeholder per graph input; ``(position in the net's inputs, tensor name)`` of those the net takes."""
    out = []
    relax_batch = relax_batch and shares_batch(by_input.values())
    for name, info in by_input.items():
        ttype = info.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
        if dims and relax_batch:
            dims[0] = None  # dynamic batch
        ph_name = tf_name(name)
        if is_carried(ttype.elem_type):
            ctx.onnx_types[name] = ttype.elem_type
        ctx.set(name, tf.compat.v1.placeholder(tf_type(ttype.elem_type), dims if ttype.HasField("shape") else None,
                                               name=ph_name))
        if name in input_names:
            out.append((input_names.index(name), ph_name + ":0"))
    return out


def shares_batch(inputs) -> bool:
    """Whether graph ``inputs`` (``ValueInfoProto`` s) whose dimension 0 is fixed make one batch, for
    ``relax_batch`` to open: they all fix the same size there, and no input leaves its dimension 0 symbolic.
    Otherwise they are whole tensors (a matrix and a vector, a tensor and the shape to expand it to, split
    sizes beside a batch) and keep their declared shapes."""
    fixed, symbolic = set(), False
    for info in inputs:
        ttype = info.type.tensor_type
        if not ttype.HasField("shape") or not ttype.shape.dim:
            continue
        if ttype.shape.dim[0].HasField("dim_value"):
            fixed.add(ttype.shape.dim[0].dim_value)
        else:
            symbolic = True
    return len(fixed) <= 1 and not (symbolic and fixed)


def convert_nodes(ctx: Ctx, nodes, opset: int | None = None) -> None:
    """Converts ``nodes`` (of default-domain ``opset``; default: the current one) in order into ``ctx``:
    the nodes of the graph, of an inlined ``If`` branch, of an expanded function."""
    outer = ctx.opset
    ctx.opset = outer if opset is None else opset
    try:
        for i, node in enumerate(nodes):
            _convert_node(ctx, node, i)
    finally:
        ctx.opset = outer


def _convert_node(ctx: Ctx, node, i: int) -> None:
    from onnx import helper

    version = op_version(node.op_type, ctx.opset) if node.domain in DEFAULT_DOMAINS else None
    if not handles(node.op_type, version):
        found = function_of(node, ctx.opset, lambda: [_type_of(ctx, n) for n in node.input])
        if found is None:  # missing_operators lets no such node through
            raise OnnxConversionError(f"{node.op_type} node {node.name!r}: no conversion for version {version}.")
        function, body_opset = found
        prefix = f"{node.output[0] or node.name or node.op_type}/{node.op_type}/"
        convert_nodes(ctx, expand(node, function, prefix, ctx.opset), body_opset)
        return
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    scope = "ops/" + clean_node_name(node.name or f"{node.op_type}_{i}")
    with tf.name_scope(scope + "/"):
        ctx.version = version
        try:
            HANDLERS[node.op_type].fn(ctx, node, attrs)
        except OnnxConversionError:
            raise
        except (ValueError, TypeError, tf.errors.OpError) as exc:
            shapes = [str(ctx.values[n].tensor.shape) if ctx.has(n) else "?" for n in node.input if n]
            raise OnnxConversionError(
                f"Converting {node.op_type} node {node.name!r} (inputs {list(node.input)} with shapes "
                f"{shapes}) failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
            ) from None


def _type_of(ctx: Ctx, name: str):
    """A value's ``TypeProto`` (element type and static shape), for a context-dependent function."""
    from onnx import TypeProto, helper

    if not name or not ctx.has(name):
        return TypeProto()
    t = ctx.plain(name)
    elem = ctx.onnx_types.get(name) or helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype.as_numpy_dtype))
    shape = None if t.shape.rank is None else t.shape.as_list()
    return helper.make_tensor_type_proto(elem, shape)
