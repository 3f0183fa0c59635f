"""Making a graph's function library safe to import into this process, any number of times.

Graphs that call functions (``While``, ``If``, ``StatelessWhile``, ``PartitionedCall``,
``StatefulPartitionedCall``, or a node whose op is a function's name) need their library wherever
they run. Three things get in the way, and :func:`prepare_library` deals with each, in place:

* Names. TensorFlow registers library functions by name in one process-wide table and refuses a
  second, different function under a name it already holds (``Attempting to add a duplicate function
  with name ...``). A frozen graph reuses the names of the functions it was traced from, and tfnet
  rewrites graphs (weights as placeholders), so every library function is renamed to carry a hash of
  the whole library: the same library gives the same names, a different one different names.
* XLA. Keras 3 wraps some ops (grouped convolutions) in ``tf.function(jit_compile=True)``; the
  ``_XlaMustCompile`` attribute makes TensorFlow look for a gradient that does not exist outside the
  original process, and a call's gradient needs C++ gradients of its body's ops. Such calls are inlined
  (:func:`inline_xla_calls`), and the attribute dropped from what remains.
* Custom gradients. ``tf.custom_gradient`` marks an ``IdentityN`` with ``_gradient_op_type``, the
  name of a Python function registered in the process that built the graph (see
  :func:`drop_gradient_overrides`).
"""

from __future__ import annotations

import hashlib

from tensorflow.core.framework import graph_pb2

__all__ = ["prepare_library", "drop_gradient_overrides", "inline_xla_calls", "register_library"]

_XLA_ATTRS = ("_XlaMustCompile", "_XlaCompile", "_XlaScope", "_XlaInternalScope", "_noinline")


def drop_gradient_overrides(graph_def: graph_pb2.GraphDef) -> int:
    """Removes ``_gradient_op_type`` attributes in place (nodes and library functions); returns how
    many were removed.

    ``tf.custom_gradient`` (Keras 3's ``silu``, for one) wraps its result in an ``IdentityN`` whose
    gradient is a Python function registered in the process that built the graph, closing over that
    graph's tensors: in any other graph it is out of scope or missing. Without the override,
    TensorFlow differentiates the forward ops the ``IdentityN`` wraps, which compute the same
    function.
    """
    removed = 0
    for node in _all_nodes(graph_def):
        if "_gradient_op_type" in node.attr:
            del node.attr["_gradient_op_type"]
            removed += 1
    return removed


_CALLS = ("PartitionedCall", "StatefulPartitionedCall")


def inline_xla_calls(graph_def: graph_pb2.GraphDef) -> int:
    """Replaces each call of an XLA-marked library function in the graph by the function's body, in place; returns
    how many calls it inlined.

    Keras 3 runs a grouped dilated convolution as such a call (``SpaceToBatchND``, ``Conv2D``, ``BatchToSpaceND``).
    TensorFlow differentiates a call with ``SymbolicGradient``, which needs a C++ gradient for every op of the body,
    and ``BatchToSpaceND`` has none ("No gradient defined for op"); inlined, the tape differentiates each op."""
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def

    functions = {f.signature.name: f for f in graph_def.library.function}
    marked = {name for name, f in functions.items() if "_XlaMustCompile" in f.attr}
    inlined = 0
    while True:
        calls = [n for n in graph_def.node if n.op in _CALLS and n.attr["f"].func.name in marked]
        if not calls:
            return inlined
        for call in calls:
            fdef = functions[call.attr["f"].func.name]
            body, flat_names = function_def_to_graph_def(fdef)
            _inline(graph_def, call, fdef, body, flat_names)
            inlined += 1


def _inline(graph_def, call, fdef, body, flat_names) -> None:
    """Puts ``body`` (``fdef`` as a graph) in place of ``call``: its arguments read the call's inputs, and whatever
    read the call's outputs reads the body's results."""
    prefix = f"{call.name}/inlined"
    args = [a.name for a in fdef.signature.input_arg]
    data = [i for i in call.input if not i.startswith("^")]
    controls = [i for i in call.input if i.startswith("^")]
    fed = dict(zip(args, data))

    def resolve(name: str) -> str:
        control = name.startswith("^")
        node, _, index = name.lstrip("^").partition(":")
        if node in fed:
            target = fed[node]
            return "^" + target.split(":")[0] if control else target
        return f"^{prefix}/{node}" if control else f"{prefix}/{node}" + (f":{index}" if index else "")

    for node in body.node:
        if node.name in fed:
            continue
        new = graph_def.node.add()
        new.CopyFrom(node)
        new.name = f"{prefix}/{node.name}"
        new.input[:] = [resolve(i) for i in node.input]
        if not new.input and controls:  # a constant of the body runs after what the call waited for
            new.input.extend(controls)
    results = [resolve(flat_names[fdef.ret[out.name]]) for out in fdef.signature.output_arg]
    for node in graph_def.node:
        renamed = []
        for inp in node.input:
            name, _, index = inp.lstrip("^").partition(":")
            if name != call.name:
                renamed.append(inp)
            elif inp.startswith("^"):
                renamed.extend("^" + r.split(":")[0] for r in results)
            else:
                renamed.append(results[int(index or 0)])
        node.input[:] = renamed
    graph_def.node.remove(call)


def prepare_library(graph_def: graph_pb2.GraphDef) -> dict[str, str]:
    """Inlines XLA-marked calls, drops gradient overrides and XLA markers and renames library functions by content,
    in place.

    Returns the renaming ``{old: new}`` (empty when the graph has no library).
    """
    inline_xla_calls(graph_def)
    drop_gradient_overrides(graph_def)
    library = graph_def.library
    for fn in library.function:
        for attr in _XLA_ATTRS:
            if attr in fn.attr:
                del fn.attr[attr]
    for node in _all_nodes(graph_def):
        for attr in _XLA_ATTRS:
            if attr in node.attr:
                del node.attr[attr]
    if not library.function:
        return {}
    digest = hashlib.sha256(library.SerializeToString(deterministic=True)).hexdigest()[:10]
    suffix = f"_tfnet{digest}"
    mapping = {}
    for fn in library.function:
        old = fn.signature.name
        base = old.split("_tfnet")[0] if "_tfnet" in old else old
        mapping[old] = base + suffix
    for fn in library.function:
        fn.signature.name = mapping[fn.signature.name]
    for grad in library.gradient:
        grad.function_name = mapping.get(grad.function_name, grad.function_name)
        grad.gradient_func = mapping.get(grad.gradient_func, grad.gradient_func)
    for node in _all_nodes(graph_def):
        if node.op in mapping:
            node.op = mapping[node.op]
        for value in node.attr.values():
            _rename_attr(value, mapping)
    return mapping


def _rename_attr(value, mapping: dict[str, str]) -> None:
    kind = value.WhichOneof("value")
    if kind == "func":
        _rename_func(value.func, mapping)
    elif kind == "list":
        for fn in value.list.func:
            _rename_func(fn, mapping)


def _rename_func(func, mapping: dict[str, str]) -> None:
    if func.name in mapping:
        func.name = mapping[func.name]
    for value in func.attr.values():
        _rename_attr(value, mapping)


def _all_nodes(graph_def: graph_pb2.GraphDef) -> list:
    nodes = list(graph_def.node)
    for fn in graph_def.library.function:
        nodes.extend(fn.node_def)
    return nodes


def register_library(graph_def: graph_pb2.GraphDef) -> None:
    """Registers the library's functions with the eager runtime.

    ``import_graph_def`` inside a ``tf.function`` adds a library to the function's graph below the
    Python layer, so the compiled function does not carry it and the runtime cannot find it
    (``Failed to find function ...``). Registered here once, by their content-addressed names (see
    :func:`prepare_library`), they are found wherever the graph is imported.
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    for fn in graph_def.library.function:
        if not ctx.has_function(fn.signature.name):
            ctx.add_function_def(fn)
