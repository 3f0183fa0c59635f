"""Lookup tables (``TextVectorization``, ``StringLookup``, ``IntegerLookup``, ``tf.lookup``) in
frozen graphs.

A frozen graph keeps a table the way TensorFlow 1 graphs do: a ``HashTableV2`` node, and an
``InitializeTableV2`` node that fills it from two constants (the keys and the values), grouped under
an ``init_all_tables`` no-op. That is the *canonical form*: the graph is complete on its own, and a
``tf.compat.v1.Session`` user runs ``init_all_tables`` once, as with any TF1 graph with tables.

* Keras models and SavedModels hold their tables as live resources, which a traced function reads
  through a captured handle: :func:`embed_captured_tables` exports each table's contents
  (``LookupTableExportV2``) and writes it in canonical form.
* Frozen graphs from elsewhere may fill a table from a vocabulary file or in another way:
  :func:`canonical_tables` runs those initializers once, in a TF1 session, and rewrites each table
  in canonical form (the file is read now, not when the net runs).
* A TFNet runs the graph with tables it owns: :class:`TableSet` builds each table once, eagerly,
  from its constants, and feeds its handle to the imported graph in place of the ``HashTableV2``
  node, whose initializer is left out of the graph that runs. A lookup then costs what it costs in
  Keras; nothing is initialised per call.

Tables are not weights: their keys and values are never trained, and the constants that fill them
are not among ``net.weight_names``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import tensor_util

from tfnet.errors import GraphLoadError, op_error_reason

__all__ = ["TABLE_OPS", "INIT_ALL_TABLES", "TableSet", "canonical_tables", "embed_captured_tables",
           "initializer_nodes", "table_constants", "with_init_all_tables", "has_tables"]

#: Ops that create a lookup table resource.
TABLE_OPS = {"HashTableV2", "HashTable", "MutableHashTableV2", "MutableHashTable", "MutableDenseHashTableV2",
             "MutableDenseHashTable"}
#: Ops that fill a table (their first input is the table).
INIT_OPS = {"InitializeTableV2", "InitializeTable", "InitializeTableFromTextFileV2", "InitializeTableFromTextFile",
            "LookupTableImportV2", "LookupTableImport", "InitializeTableFromDataset"}
#: Ops that change a table after it is filled: a graph with these cannot keep a static copy.
_WRITE_OPS = {"LookupTableInsertV2", "LookupTableInsert", "LookupTableRemoveV2"}
#: The no-op that runs every table initializer, as TF1 graphs name it.
INIT_ALL_TABLES = "init_all_tables"
_CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall"}
_KEYS, _VALUES, _INIT = "/tfnet_keys", "/tfnet_values", "/tfnet_init"


def _name(inp: str) -> str:
    return inp.lstrip("^").split(":")[0]


def has_tables(graph_def: graph_pb2.GraphDef) -> bool:
    return any(n.op in TABLE_OPS for n in graph_def.node)


def initializer_nodes(graph_def: graph_pb2.GraphDef) -> dict[str, list[str]]:
    """``{table node: [initializer nodes]}`` for every table in the graph."""
    tables = {n.name for n in graph_def.node if n.op in TABLE_OPS}
    found: dict[str, list[str]] = {t: [] for t in tables}
    for node in graph_def.node:
        if node.op in INIT_OPS and node.input and _name(node.input[0]) in tables:
            found[_name(node.input[0])].append(node.name)
    return found


def table_constants(graph_def: graph_pb2.GraphDef) -> set[str]:
    """The constants that only fill tables (keys, values, file names): never weights."""
    nodes = {n.name: n for n in graph_def.node}
    inits = {i for names in initializer_nodes(graph_def).values() for i in names}
    feeding = {_name(i) for name in inits for i in nodes[name].input[1:] if not i.startswith("^")}
    used_elsewhere = {_name(i) for n in graph_def.node if n.name not in inits for i in n.input}
    return {c for c in feeding if c in nodes and nodes[c].op == "Const" and c not in used_elsewhere}


# ---------------------------------------------------------------------------- canonical form


def _const(name: str, value: np.ndarray, dtype) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value, dtype=tf.as_dtype(dtype)))
    return node


def _canonical_nodes(name: str, keys: np.ndarray, values: np.ndarray, key_dtype, value_dtype) -> list:
    """A ``HashTableV2`` called ``name`` filled from ``keys`` and ``values`` by ``InitializeTableV2``."""
    key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
    if values.ndim != 1 or keys.shape != values.shape:
        raise GraphLoadError(
            f"Table {name!r} maps each key to a {values.shape[1:]}-shaped value; tfnet keeps tables of one value per "
            "key (what TextVectorization, StringLookup, IntegerLookup and tf.lookup.StaticHashTable make).")
    table = node_def_pb2.NodeDef(name=name, op="HashTableV2")
    table.attr["key_dtype"].type = key_dtype.as_datatype_enum
    table.attr["value_dtype"].type = value_dtype.as_datatype_enum
    table.attr["container"].s = b""
    table.attr["shared_name"].s = b""
    table.attr["use_node_name_sharing"].b = False
    init = node_def_pb2.NodeDef(name=name + _INIT, op="InitializeTableV2", input=[name, name + _KEYS, name + _VALUES])
    init.attr["Tkey"].type = key_dtype.as_datatype_enum
    init.attr["Tval"].type = value_dtype.as_datatype_enum
    return [table, _const(name + _KEYS, keys, key_dtype), _const(name + _VALUES, values, value_dtype), init]


def with_init_all_tables(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """``graph_def`` with an ``init_all_tables`` no-op over every table initializer (when it has
    tables and no node of that name)."""
    inits = [i for names in initializer_nodes(graph_def).values() for i in names]
    if not inits or any(n.name == INIT_ALL_TABLES for n in graph_def.node):
        return graph_def
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    out.node.add(name=INIT_ALL_TABLES, op="NoOp", input=["^" + i for i in sorted(inits)])
    return out


def _replace(graph_def: graph_pb2.GraphDef, replaced: Mapping[str, list], drop: Iterable[str] = ()) -> graph_pb2.GraphDef:
    """A copy with each node in ``replaced`` swapped for its new nodes and the ``drop`` nodes left
    out (control inputs on them too)."""
    drop = set(drop)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in drop:
            continue
        if node.name in replaced:
            out.node.extend(replaced[node.name])
            continue
        new = out.node.add()
        new.CopyFrom(node)
        if any(_name(i) in drop for i in node.input):
            del new.input[:]
            new.input.extend(i for i in node.input if _name(i) not in drop)
    return out


def _is_canonical(nodes: dict, table: str, inits: list[str]) -> bool:
    if nodes[table].op != "HashTableV2" or len(inits) != 1:
        return False
    init = nodes[inits[0]]
    return init.op == "InitializeTableV2" and all(
        nodes.get(_name(i)) is not None and nodes[_name(i)].op == "Const" for i in init.input[1:3])


def canonical_tables(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """``graph_def`` with every table in canonical form: tables filled another way (a vocabulary
    file, ``LookupTableImportV2``, a mutable table) are filled once now, in a TF1 session, and
    rewritten as constants. Graphs without tables, or with canonical ones only, come back as they are.

    Raises:
        GraphLoadError: a table with no initializer, one that fails (a vocabulary file that is
            gone), or a graph that writes to its tables.
    """
    found = initializer_nodes(graph_def)
    if not found:
        return graph_def
    nodes = {n.name: n for n in graph_def.node}
    writes = [n.name for n in graph_def.node if n.op in _WRITE_OPS]
    if writes:
        raise GraphLoadError(f"The graph writes to its lookup tables ({writes[:3]}); tfnet keeps tables fixed, as "
                             "inference graphs use them.")
    missing = sorted(t for t, inits in found.items() if not inits)
    if missing:
        raise GraphLoadError(
            f"Lookup table(s) {missing} have no initializer in the graph, so their contents are unknown. Freeze the "
            "model with its tables filled (TFNet.from_keras or TFNet.from_saved_model do), or include the "
            "initializer ops.")
    todo = {t: inits for t, inits in found.items() if not _is_canonical(nodes, t, inits)}
    if not todo:
        return with_init_all_tables(graph_def)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        exports = {}
        for table in todo:
            key_dtype = tf.as_dtype(nodes[table].attr["key_dtype"].type)
            value_dtype = tf.as_dtype(nodes[table].attr["value_dtype"].type)
            handle = graph.get_tensor_by_name(table + ":0")
            if handle.dtype != tf.resource:
                raise GraphLoadError(f"Table {table!r} is a {nodes[table].op} (a reference table of TF 1's first "
                                     "API); tfnet reads resource tables (HashTableV2 and its kin).")
            exports[table] = tf.raw_ops.LookupTableExportV2(table_handle=handle, Tkeys=key_dtype, Tvalues=value_dtype)
    with tf.compat.v1.Session(graph=graph) as sess:
        try:
            sess.run([graph.get_operation_by_name(i) for inits in todo.values() for i in inits])
            contents = sess.run(exports)
        except tf.errors.OpError as exc:
            raise GraphLoadError(
                f"The graph's lookup tables could not be filled: {op_error_reason(exc.message)} (a vocabulary file that is not "
                "where the graph says?)") from None
    replaced, drop = {}, set()
    for table, (keys, values) in contents.items():
        replaced[table] = _canonical_nodes(table, keys, values, nodes[table].attr["key_dtype"].type,
                                           nodes[table].attr["value_dtype"].type)
        drop.update(todo[table])
    drop.add(INIT_ALL_TABLES)
    return with_init_all_tables(_replace(graph_def, replaced, drop))


# ---------------------------------------------------------------------------- captured tables


def _consumers(graph_def: graph_pb2.GraphDef, name: str) -> list[tuple[node_def_pb2.NodeDef, int]]:
    found = []
    for node in graph_def.node:
        data = [i for i in node.input if not i.startswith("^")]
        for k, inp in enumerate(data):
            if _name(inp) == name:
                found.append((node, k))
    return found


def _function_consumers(fdef, arg: str) -> list[tuple[node_def_pb2.NodeDef, int]]:
    found = []
    for node in fdef.node_def:
        data = [i for i in node.input if not i.startswith("^")]
        for k, inp in enumerate(data):
            if inp.split(":")[0] == arg:
                found.append((node, k))
    return found


def table_dtypes(graph_def: graph_pb2.GraphDef, name: str) -> tuple | None:
    """``(key dtype, value dtype)`` of the table that node ``name`` hands out, read from the ops that
    use it (through identities and function calls), or None when no op says."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    queue = deque(_consumers(graph_def, name))
    seen = 0
    while queue and seen < 1000:
        node, index = queue.popleft()
        seen += 1
        if node.op in ("LookupTableFindV2", "LookupTableInsertV2", "LookupTableImportV2"):
            return tf.as_dtype(node.attr["Tin"].type), tf.as_dtype(node.attr["Tout"].type)
        if node.op == "LookupTableExportV2":
            return tf.as_dtype(node.attr["Tkeys"].type), tf.as_dtype(node.attr["Tvalues"].type)
        if node.op == "Identity":
            queue.extend(_consumers(graph_def, node.name))
            continue
        fname = node.attr["f"].func.name if node.op in _CALL_OPS else node.op
        fdef = functions.get(fname)
        if fdef is not None and index < len(fdef.signature.input_arg):
            queue.extend(_function_consumers(fdef, fdef.signature.input_arg[index].name))
    return None


def embed_captured_tables(graph_def: graph_pb2.GraphDef, handles: Mapping[str, tf.Tensor]) -> graph_pb2.GraphDef:
    """Replaces each placeholder in ``handles`` (a captured table's node -> its live resource handle)
    with the table's contents in canonical form. Placeholders that no lookup reads are left as
    they are (the caller reports them).

    Raises:
        GraphLoadError: a table whose contents cannot be exported.
    """
    replaced = {}
    for name, handle in handles.items():
        dtypes = table_dtypes(graph_def, name)
        if dtypes is None:
            continue
        try:
            keys, values = tf.raw_ops.LookupTableExportV2(table_handle=handle, Tkeys=dtypes[0], Tvalues=dtypes[1])
        except (tf.errors.OpError, TypeError) as exc:
            raise GraphLoadError(f"The lookup table behind {name!r} could not be read: {exc}") from None
        replaced[name] = _canonical_nodes(name, keys.numpy(), values.numpy(), dtypes[0], dtypes[1])
    if not replaced:
        return graph_def
    return with_init_all_tables(_replace(graph_def, replaced))


# ---------------------------------------------------------------------------- running


class TableSet:
    """The tables of a graph in canonical form, built once as ``tf.lookup.StaticHashTable`` s
    (eagerly, so any ``tf.function`` captures them), and the graph to run with them fed.

    Attributes:
        tables: ``{table node: StaticHashTable}``.
        graph: The graph with each ``HashTableV2`` node a resource placeholder, and the
            initializers (and the constants only they use) left out.
    """

    def __init__(self, graph_def: graph_pb2.GraphDef):
        found = initializer_nodes(graph_def)
        nodes = {n.name: n for n in graph_def.node}
        self.tables: dict[str, tf.lookup.StaticHashTable] = {}
        if not found:
            self.graph = graph_def
            return
        with tf.init_scope():
            for table, inits in found.items():
                if not _is_canonical(nodes, table, inits):
                    raise GraphLoadError(f"Table {table!r} is not filled from constants; load the graph through "
                                         "TFNet.from_frozen_graph, which fills it.")
                init = nodes[inits[0]]
                keys = tensor_util.MakeNdarray(nodes[_name(init.input[1])].attr["value"].tensor)
                values = tensor_util.MakeNdarray(nodes[_name(init.input[2])].attr["value"].tensor)
                value_dtype = tf.as_dtype(nodes[table].attr["value_dtype"].type)
                self.tables[table] = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.constant(keys, tf.as_dtype(nodes[table].attr["key_dtype"].type)),
                        tf.constant(values, value_dtype)),
                    default_value=tf.zeros([], value_dtype))
        placeholders = {}
        for table in found:
            node = node_def_pb2.NodeDef(name=table, op="Placeholder")
            node.attr["dtype"].type = types_pb2.DT_RESOURCE
            node.attr["shape"].shape.CopyFrom(tf.TensorShape([]).as_proto())
            placeholders[table] = [node]
        drop = {i for inits in found.values() for i in inits} | table_constants(graph_def) | {INIT_ALL_TABLES}
        self.graph = _replace(graph_def, placeholders, drop)

    def __bool__(self) -> bool:
        return bool(self.tables)

    def feeds(self) -> dict[str, tf.Tensor]:
        """``{"table:0": resource handle}`` for ``import_graph_def``'s ``input_map``, inside the
        function being traced (which captures each table)."""
        return {name + ":0": tf.identity(table.resource_handle) for name, table in self.tables.items()}
