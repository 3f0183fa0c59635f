"""Operators that ONNX defines as functions of other operators, expanded into those operators.

Many ONNX operators come with a definition as a small graph of simpler ones (``Swish``, ``Mish``,
``Celu``, ``GroupNormalization``, ``RMSNormalization``, ``Attention``, the losses, ...). Where tfnet has
no handler for an operator's version but ONNX defines such a function for it, the node is replaced by
the function's nodes: its inputs and outputs wired to the node's, its internal values renamed apart,
attribute references resolved from the node (or the attribute's default). A *context-dependent*
function is built by onnx for the node's attributes and input types.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def function_of(node, opset: int, input_types: Callable[[], Sequence] | None = None):
    """``(FunctionProto, its default-domain opset)`` that defines ``node``'s operator at ``opset``,
    or None when ONNX defines none. ``input_types`` gives the inputs' ``TypeProto`` s, which a
    context-dependent function needs."""
    from onnx import FunctionProto, defs

    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except defs.SchemaError:
        return None
    if schema.has_function:
        versions = list(schema.function_opset_versions) or [schema.since_version]
        data = schema.get_function_with_opset_version(_pick(versions, opset))
    elif schema.has_context_dependent_function and input_types is not None:
        versions = list(schema.context_dependent_function_opset_versions) or [schema.since_version]
        full = _with_defaults(node, schema)
        try:
            data = schema.get_context_dependent_function_with_opset_version(
                _pick(versions, opset), full.SerializeToString(), [t.SerializeToString() for t in input_types()])
        except Exception:  # noqa: BLE001 - onnx's builder rejects some attribute/type combinations
            return None
    else:
        return None
    proto = FunctionProto()
    proto.ParseFromString(data)
    if not proto.node:
        return None
    body_opset = next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset)
    return proto, body_opset


def has_function(op: str, opset: int) -> bool:
    from onnx import defs

    try:
        schema = defs.get_schema(op, opset, "")
    except defs.SchemaError:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _pick(versions: Sequence[int], opset: int) -> int:
    older = [v for v in versions if v <= opset]
    return max(older) if older else min(versions)


def _with_defaults(node, schema):
    """``node`` with the schema's default for every attribute it leaves out."""
    from onnx import NodeProto

    full = NodeProto()
    full.CopyFrom(node)
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        default = attr.default_value
        if name not in given and default is not None and default.name:
            full.attribute.append(default)
    return full


def expand(node, function, prefix: str, opset: int) -> list:
    """The nodes of ``function`` as they stand for ``node`` (an operator of ``opset``): formal inputs and
    outputs renamed to the node's, every other value prefixed with ``prefix``, attribute references
    resolved from the node or the attribute's default."""
    from onnx import AttributeProto, NodeProto, defs

    rename: dict[str, str] = {}
    for i, formal in enumerate(function.input):
        rename[formal] = node.input[i] if i < len(node.input) else ""
    for i, formal in enumerate(function.output):
        actual = node.output[i] if i < len(node.output) else ""
        rename[formal] = actual or prefix + formal

    def name(value: str) -> str:
        if not value:
            return ""
        return rename.get(value, prefix + value)

    given = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in function.attribute_proto}
    try:
        schema = defs.get_schema(node.op_type, opset, "")
        for k, a in schema.attributes.items():
            if a.default_value is not None and a.default_value.name:
                defaults.setdefault(k, a.default_value)
    except defs.SchemaError:
        pass
    out = []
    for i, body in enumerate(function.node):
        new = NodeProto()
        new.CopyFrom(body)
        new.name = f"{prefix}{body.name or body.op_type + '_' + str(i)}"
        new.input[:] = [name(v) for v in body.input]
        new.output[:] = [name(v) for v in body.output]
        del new.attribute[:]
        for a in body.attribute:
            if a.ref_attr_name:
                source = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if source is None:
                    continue  # an optional attribute the node leaves out
                resolved = AttributeProto()
                resolved.CopyFrom(source)
                resolved.name = a.name
                new.attribute.append(resolved)
                continue
            copy = AttributeProto()
            copy.CopyFrom(a)
            if copy.type == AttributeProto.GRAPH:
                rename_free(copy.g, name)
            elif copy.type == AttributeProto.GRAPHS:
                for g in copy.graphs:
                    rename_free(g, name)
            new.attribute.append(copy)
        out.append(new)
    return out


def rename_free(graph, name: Callable[[str], str], bound: frozenset = frozenset()) -> None:
    """Renames the values ``graph`` (and the subgraphs inside it) read from the function's scope, the
    names not defined in ``graph`` or in the subgraphs ``bound`` around it."""
    from onnx import AttributeProto

    local = bound | {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
        {o for n in graph.node for o in n.output}
    for n in graph.node:
        n.input[:] = [v if not v or v in local else name(v) for v in n.input]
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                rename_free(a.g, name, frozenset(local))
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    rename_free(g, name, frozenset(local))
    for o in graph.output:
        if o.name not in local:
            o.name = name(o.name)
