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
  original process. The same function without it runs on the ordinary kernels.
* Custom gradients. ``tf.custom_gradient`` marks an ``IdentityN`` with ``_gradient_op_type``, the
  name of a Python function registered in the process that built the graph (see
  :func:`drop_gradient_overrides`).
"""

from __future__ import annotations

import hashlib

from tensorflow.core.framework import graph_pb2

__all__ = ["prepare_library", "drop_gradient_overrides", "register_library"]

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


def prepare_library(graph_def: graph_pb2.GraphDef) -> dict[str, str]:
    """Drops gradient overrides and XLA markers and renames library functions by content, in place.

    Returns the renaming ``{old: new}`` (empty when the graph has no library).
    """
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
