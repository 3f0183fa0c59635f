"""Pure GraphDef manipulation: tensor names, weight discovery, rewriting, pruning and merging.

Nothing here runs TensorFlow; it only reads and writes ``GraphDef`` protos, so it is cheap to call
and easy to test.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping

import numpy as np
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import tensor_util

from tfnet.errors import TensorNameError, unknown_name_message

FLOAT_TYPES = (types_pb2.DT_FLOAT, types_pb2.DT_HALF, types_pb2.DT_DOUBLE, types_pb2.DT_BFLOAT16)
_TENSOR_NAME = re.compile(r"^[^:^]+(:\d+)?$")


def tensor_name(name: str) -> str:
    """Normalises ``"name"`` or ``"name:0"`` to ``"name:0"``.

    >>> tensor_name("dense/BiasAdd")
    'dense/BiasAdd:0'
    >>> tensor_name("split:1")
    'split:1'
    """
    if not isinstance(name, str) or not _TENSOR_NAME.match(name):
        raise TensorNameError(
            f"A tensor name must be a string 'node' or 'node:index'. Received: {name!r}"
        )
    return name if ":" in name else name + ":0"


def node_name(name: str) -> str:
    """Returns the node part of a tensor name or node input (``"^a"``, ``"a:1"`` -> ``"a"``)."""
    return name.lstrip("^").split(":")[0]


def _input_tensor(inp: str) -> str:
    return inp if ":" in inp else inp + ":0"


def nodes_by_name(graph_def: graph_pb2.GraphDef) -> dict[str, node_def_pb2.NodeDef]:
    return {n.name: n for n in graph_def.node}


def data_readers(graph_def: graph_pb2.GraphDef) -> dict[str, list[str]]:
    """Each node's readers through data edges (control edges left out), by node name."""
    readers: dict[str, list[str]] = defaultdict(list)
    for n in graph_def.node:
        for inp in n.input:
            if not inp.startswith("^"):
                readers[node_name(inp)].append(n.name)
    return readers


def check_tensor_names(graph_def: graph_pb2.GraphDef, names: Iterable[str], kind: str) -> list[str]:
    """Normalises tensor names and checks that their nodes exist, naming the closest matches."""
    nodes = nodes_by_name(graph_def)
    out = []
    for raw in names:
        name = tensor_name(raw)
        if node_name(name) not in nodes:
            candidates = [n.name for n in graph_def.node if n.op not in ("Const", "NoOp")]
            raise TensorNameError(unknown_name_message(f"{kind} tensor", raw, candidates))
        out.append(name)
    return out


def const_value(node: node_def_pb2.NodeDef) -> np.ndarray:
    return tensor_util.MakeNdarray(node.attr["value"].tensor)


def is_weight_const(node: node_def_pb2.NodeDef) -> bool:
    """A float ``Const`` of rank 1 or more is a weight; scalars (epsilons, scales) are not."""
    if node.op != "Const" or node.attr["dtype"].type not in FLOAT_TYPES:
        return False
    return len(node.attr["value"].tensor.tensor_shape.dim) >= 1


def find_weights(graph_def: graph_pb2.GraphDef) -> list[str]:
    """Float constants of rank >= 1, except those that only fill lookup tables."""
    from tfnet.tables import table_constants

    tables = table_constants(graph_def)
    return [n.name for n in graph_def.node if is_weight_const(n) and n.name not in tables]


def consts_to_placeholders(
    graph_def: graph_pb2.GraphDef, names: Iterable[str]
) -> tuple[graph_pb2.GraphDef, dict[str, np.ndarray]]:
    """Returns a copy of ``graph_def`` in which each named ``Const`` is a ``Placeholder`` of the same
    dtype and shape, and the values those constants held."""
    names = set(names)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    values: dict[str, np.ndarray] = {}
    for node in graph_def.node:
        if node.name in names:
            value = const_value(node)
            values[node.name] = value
            new = out.node.add()
            new.name = node.name
            new.op = "Placeholder"
            new.device = node.device
            new.attr["dtype"].CopyFrom(node.attr["dtype"])
            new.attr["shape"].CopyFrom(_shape_attr(value.shape))
        else:
            out.node.add().CopyFrom(node)
    return out, values


def _shape_attr(shape: Iterable[int | None]) -> attr_value_pb2.AttrValue:
    attr = attr_value_pb2.AttrValue()
    for d in shape:
        attr.shape.dim.add().size = -1 if d is None else int(d)
    return attr


def placeholders_to_consts(
    graph_def: graph_pb2.GraphDef, values: Mapping[str, np.ndarray]
) -> graph_pb2.GraphDef:
    """The inverse of :func:`consts_to_placeholders`: bakes ``values`` into the graph."""
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in values:
            new = out.node.add()
            new.name = node.name
            new.op = "Const"
            new.device = node.device
            new.attr["dtype"].CopyFrom(node.attr["dtype"])
            new.attr["value"].tensor.CopyFrom(
                tensor_util.make_tensor_proto(np.asarray(values[node.name]))
            )
        else:
            out.node.add().CopyFrom(node)
    return out


def bake_tensors(graph_def: graph_pb2.GraphDef, values: Mapping[str, np.ndarray]) -> graph_pb2.GraphDef:
    """Replaces every use of each tensor in ``values`` (``"node:index"``) by a constant holding its
    value; the producing nodes stay (unused). Control inputs are left as they are."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    taken = {n.name for n in out.node}
    consts = {}
    for name, value in values.items():
        tensor = tensor_name(name)
        const = out.node.add()
        const.name = unique_name(node_name(tensor) + "/tfnet_baked", taken)
        taken.add(const.name)
        const.op = "Const"
        proto = tensor_util.make_tensor_proto(np.asarray(value))
        const.attr["dtype"].type = proto.dtype
        const.attr["value"].tensor.CopyFrom(proto)
        consts[tensor] = const.name
    for node in out.node:
        for i, inp in enumerate(node.input):
            if not inp.startswith("^") and _input_tensor(inp) in consts:
                node.input[i] = consts[_input_tensor(inp)]
    return out


def set_placeholder_batch_dim(graph_def: graph_pb2.GraphDef, names: Iterable[str]) -> None:
    """Makes dimension 0 of the named placeholders unknown, so any batch size can be fed."""
    nodes = nodes_by_name(graph_def)
    for name in names:
        node = nodes.get(node_name(name))
        if node is None or node.op != "Placeholder" or "shape" not in node.attr:
            continue
        shape = node.attr["shape"].shape
        if not shape.unknown_rank and len(shape.dim) >= 1:
            shape.dim[0].size = -1


def without_control_inputs(graph_def: graph_pb2.GraphDef, only: Iterable[str] | None = None) -> graph_pb2.GraphDef:
    """A copy of ``graph_def`` with no control inputs (``^node``) on its nodes (or on the nodes named in ``only``):
    what each tensor is computed from, not what must run before it."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    only = None if only is None else set(only)
    for node in out.node:
        if only is not None and node.name not in only:
            continue
        data = [i for i in node.input if not i.startswith("^")]
        del node.input[:]
        node.input.extend(data)
    return out


def subgraph(
    graph_def: graph_pb2.GraphDef,
    outputs: Iterable[str],
    feeds: Iterable[str] = (),
    feed_specs: Mapping[str, tuple[int, list[int | None] | None]] | None = None,
) -> graph_pb2.GraphDef:
    """Keeps only the nodes that ``outputs`` depend on, not looking past the ``feeds`` tensors (and
    the initializers of the lookup tables kept).

    Every fed node is kept. A fed node that is not a placeholder (an intermediate tensor used as an
    input) is replaced by a ``Placeholder`` of the dtype and shape in ``feed_specs``
    (``tensor -> (dtype enum, dims or None)``), so nothing upstream of it is needed.
    """
    nodes = nodes_by_name(graph_def)
    fed = {tensor_name(f) for f in feeds}
    fed_nodes = {node_name(f) for f in fed}
    feed_specs = feed_specs or {}
    replaced = {
        node_name(f)
        for f in fed
        if node_name(f) in nodes and nodes[node_name(f)].op not in ("Placeholder", "PlaceholderWithDefault")
        and f in feed_specs
    }
    for f in fed:
        if node_name(f) in replaced and not f.endswith(":0"):
            raise TensorNameError(
                f"Input {f!r} is output {f.split(':')[1]} of a {nodes[node_name(f)].op} node; only "
                "output 0 of an intermediate node can be an input."
            )
    keep: set[str] = set()
    queue = deque([node_name(o) for o in outputs] + list(fed_nodes))
    from tfnet.tables import initializer_nodes

    table_inits = initializer_nodes(graph_def)  # a kept lookup table keeps what fills it
    while queue:
        name = queue.popleft()
        if name in keep or name not in nodes:
            continue
        keep.add(name)
        if name in replaced:
            continue
        queue.extend(table_inits.get(name, ()))
        for inp in nodes[name].input:
            if not inp.startswith("^") and _input_tensor(inp) in fed:
                queue.append(node_name(inp))
                continue
            if node_name(inp) in replaced and not inp.startswith("^"):
                raise TensorNameError(
                    f"Node {name!r} uses {inp!r}, another output of input node "
                    f"{node_name(inp)!r}; feed that tensor too or choose a different input."
                )
            queue.append(node_name(inp))
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name not in keep:
            continue
        if node.name in replaced:
            dtype, dims = feed_specs[node.name + ":0"]
            new = out.node.add()
            new.name = node.name
            new.op = "Placeholder"
            new.attr["dtype"].type = dtype
            if dims is not None:
                new.attr["shape"].CopyFrom(_shape_attr(dims))
            else:
                new.attr["shape"].shape.unknown_rank = True
        else:
            clean = out.node.add()
            clean.CopyFrom(node)
    return out


def rename_nodes(graph_def: graph_pb2.GraphDef, mapping: Mapping[str, str]) -> graph_pb2.GraphDef:
    """Renames nodes and every reference to them (data and control inputs)."""
    if not mapping:
        return graph_def
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.name in mapping:
            node.name = mapping[node.name]
        for i, inp in enumerate(node.input):
            ctrl = inp.startswith("^")
            base = node_name(inp)
            if base in mapping:
                suffix = inp[len(base) + ctrl:]
                node.input[i] = ("^" if ctrl else "") + mapping[base] + suffix
        if "_class" in node.attr:  # colocation constraints name nodes too: drop stale ones
            del node.attr["_class"]
    return out


_BAD_NODE_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")


def clean_node_name(name: str) -> str:
    """Turns a variable or signature name into a legal GraphDef node name."""
    name = name.split(":")[0]
    name = _BAD_NODE_CHARS.sub("_", name).strip("/")
    if not name or not re.match(r"[A-Za-z0-9.]", name[0]):
        name = "t" + name
    return name


def unique_name(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    i = 1
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"


def merge(
    base: graph_pb2.GraphDef,
    other: graph_pb2.GraphDef,
    prefix: str,
    connect: Mapping[str, str],
) -> graph_pb2.GraphDef:
    """Adds ``other``'s nodes to ``base`` under ``prefix/``.

    ``connect`` maps placeholder nodes of ``other`` to tensors of ``base``; each such placeholder
    becomes an ``Identity`` of that tensor, which joins the two graphs.
    """
    mapping = {n.name: f"{prefix}/{n.name}" for n in other.node}
    taken = {n.name for n in base.node}
    clash = [v for v in mapping.values() if v in taken]
    if clash:
        raise TensorNameError(
            f"Cannot merge graphs under prefix {prefix!r}: nodes {clash[:5]} already exist. "
            "Choose another name."
        )
    renamed = rename_nodes(other, mapping)
    out = graph_pb2.GraphDef()
    out.CopyFrom(base)
    existing_fns = {f.signature.name for f in out.library.function}
    for fn in renamed.library.function:
        if fn.signature.name not in existing_fns:
            out.library.function.add().CopyFrom(fn)
    for node in renamed.node:
        original = node.name[len(prefix) + 1:]
        if original in connect:
            joint = out.node.add()
            joint.name = node.name
            joint.op = "Identity"
            joint.input.append(connect[original])
            joint.attr["T"].CopyFrom(node.attr["dtype"])
        else:
            out.node.add().CopyFrom(node)
    return out


def placeholders(graph_def: graph_pb2.GraphDef) -> list[str]:
    return [n.name for n in graph_def.node if n.op == "Placeholder"]



# v1 control flow loop ops. A GraphDef does not store their WhileContext, which TensorFlow needs to
# build their gradient (and the frames make automatic control dependencies invalid).
V1_LOOP_OPS = ("Enter", "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration", "LoopCond")


def v1_loop_nodes(graph_def: graph_pb2.GraphDef) -> list[str]:
    """Names of the v1 control flow loop nodes (``Enter`` / ``Exit`` / ``NextIteration``...)."""
    return [n.name for n in graph_def.node if n.op in V1_LOOP_OPS]


def reorder_nodes(graph_def: graph_pb2.GraphDef, names: list[str]) -> None:
    """The nodes named in ``names`` put in that order among the places they hold in ``graph_def``, in place."""
    named = set(names)
    slots = [i for i, n in enumerate(graph_def.node) if n.name in named]
    by_name = {n.name: n for n in graph_def.node}
    nodes = list(graph_def.node)
    for i, name in zip(slots, [n for n in names if n in by_name]):
        nodes[i] = by_name[name]
    del graph_def.node[:]
    graph_def.node.extend(nodes)
