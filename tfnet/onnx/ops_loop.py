"""ONNX ``Loop`` as ``tf.while_loop``, and an ``If`` whose condition is computed at run time as ``tf.cond``.

``Loop(M, cond, v_initial...)`` runs its body while ``i < M`` (when ``M`` is given) and ``cond`` (when given);
the body takes ``(i, cond, v...)`` and gives ``(cond_out, v_out..., scan_out...)``: the loop-carried values are
the while loop's variables, each scan output is written to a ``tf.TensorArray`` at ``i`` and stacked along a new
axis 0 at the end. A carried sequence (a body that ``SequenceInsert`` s into it, as PyTorch's export of
``nn.EmbeddingBag`` does) is carried as a ``tf.TensorArray`` too (:class:`~tfnet.onnx.ops_sequence.Written`),
whose tensors may differ in shape. The trip count becomes ``maximum_iterations``; TensorFlow differentiates the
loop, so its weights train. The body is converted once, inside the loop's function graph, with its values renamed
apart (``<output>/loop/...``); values of the enclosing graph are read as they are (captured).

A Loop with neither a trip count nor a condition never ends and is refused; so is a Loop before version 11 (by
name, at load).
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from tfnet.onnx.context import Ctx, Value
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import register
from tfnet.onnx.ops_control import body_nodes
from tfnet.onnx.ops_sequence import Unstacked, Written


@contextlib.contextmanager
def scoped(ctx: Ctx, graph):
    """Converts ``graph``, a subgraph, into a TensorFlow function graph (a loop's body, a branch of ``tf.cond``):
    whatever the conversion records in ``ctx`` (values, the other layout of an outer value, shared constants, memoised
    constant-ness of ops, the ONNX value of each TensorFlow tensor name) belongs to that graph and is forgotten
    afterwards, so that no tensor of it leaks out."""
    saved = {k: Value(v.tensor, v.nhwc, v.other) for k, v in ctx.values.items()}
    sequences, shapes, aliases = dict(ctx.sequences), dict(ctx.shapes), dict(ctx.aliases)
    shared, types, dtypes, onnx_of = dict(ctx.shared), dict(ctx.onnx_types), dict(ctx.sequence_dtypes), dict(ctx.onnx_of)
    try:
        with ctx.own_constants():
            _own_small_constants(ctx, names_read(graph))
            yield
    finally:
        ctx.values, ctx.sequences, ctx.shapes, ctx.aliases = saved, sequences, shapes, aliases
        ctx.shared, ctx.onnx_types, ctx.sequence_dtypes, ctx.onnx_of = shared, types, dtypes, onnx_of


#: An outer constant with at most this many elements is made again inside a subgraph (see _own_small_constants).
SMALL_CONSTANT = 1024


def names_read(graph) -> set[str]:
    """Every value name the nodes of ``graph`` read, in its own subgraphs too."""
    found: set[str] = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            found.update(node.input)
            for a in node.attribute:
                stack.extend([a.g] if a.g.node else [])
                stack.extend(a.graphs)
    return found


def _own_small_constants(ctx: Ctx, read: set[str]) -> None:
    """The enclosing graph's small constants (axes, shapes, indices: ONNX ``Constant`` nodes outside the subgraph)
    made again in the graph being built, where they would otherwise be captured as placeholders: a value the subgraph
    computes from them stays known while converting (torchvision's detection heads slice with axes built by an
    ``Unsqueeze`` of an outer constant inside an ``If``). Large constants, the weights, stay captured; only the
    constants the subgraph reads (``read``) are made."""
    graph = tf.compat.v1.get_default_graph()
    for name in read & ctx.values.keys():
        v = ctx.values[name]
        t = v.tensor
        if (not v.nhwc and t.graph is not graph and t.op.type == "Const" and t.shape.is_fully_defined()
                and t.shape.num_elements() <= SMALL_CONSTANT):
            ctx.set(name, tf.constant(tf.get_static_value(t), t.dtype))


def _set_initializers(ctx: Ctx, graph) -> None:
    from onnx import numpy_helper

    for t in graph.initializer:
        ctx.set(t.name, tf.constant(numpy_helper.to_array(t)))


def _scalar(t: tf.Tensor, dtype) -> tf.Tensor:
    return tf.reshape(tf.cast(t, dtype), [])


def cond_if(ctx: Ctx, node, attrs) -> None:
    """``If`` on a condition known only at run time: ``tf.cond`` over the two branches, each converted in its own
    function graph. Both branches must give tensors of one dtype per output (ONNX requires it)."""
    cond = _scalar(ctx.plain(node.input[0]), tf.bool)

    def branch(graph):
        def run():
            with scoped(ctx, graph):
                _set_initializers(ctx, graph)
                ctx.convert_nodes(graph.node)
                outs = []
                for o in graph.output:
                    if o.name in ctx.sequences:
                        raise OnnxConversionError(f"If {node.name!r}: a branch gives sequence {o.name!r}; tfnet "
                                                  "converts an If on a run-time condition only when it gives tensors.")
                    outs.append(tf.identity(ctx.plain(o.name)))
                return outs
        return run

    outs = tf.cond(cond, branch(attrs["then_branch"]), branch(attrs["else_branch"]))
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for name, value in zip(node.output, outs):
        ctx.set(name, value)


def _new_array(dtype) -> tf.TensorArray:
    return tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False, element_shape=tf.TensorShape(None))


def _elem_dtype(type_proto):
    """The element dtype of a tensor or sequence ``TypeProto``, or None where it does not say."""
    from tfnet.onnx.dtypes import tf_type

    t = type_proto
    if t.HasField("sequence_type"):
        t = t.sequence_type.elem_type
    if t.HasField("tensor_type") and t.tensor_type.elem_type:
        return tf_type(t.tensor_type.elem_type)
    return None


def _array_of(ctx: Ctx, node, name: str, info) -> tf.TensorArray:
    """A sequence as a ``tf.TensorArray`` to carry through the loop."""
    seq = ctx.sequence(name)
    if isinstance(seq, Written):
        return seq.array
    if isinstance(seq, Unstacked):
        raise OnnxConversionError(f"Loop {node.name!r}: sequence {name!r} split along an axis of run-time size "
                                  "cannot be carried through a Loop.")
    dtype = seq[0].dtype if seq else ctx.sequence_dtypes.get(name) or _elem_dtype(info.type)
    if dtype is None:
        raise OnnxConversionError(f"Loop {node.name!r}: the element type of empty sequence {name!r} is unknown.")
    array = _new_array(dtype)
    for k, t in enumerate(seq):
        array = array.write(k, t)
    return array


def _probe_scan_types(step, loop_vars: list, k: int) -> list:
    """The dtypes of a loop body's ``k`` scan outputs: ``step`` traced into a throwaway function graph (values of
    the enclosing graph are captured there, nothing of it is kept), scan outputs written to float arrays whose
    writes are read back for their dtypes."""
    from tensorflow.python.framework import func_graph

    probe = func_graph.FuncGraph("loop_probe")
    seen = []

    class Probe:  # stands in for a TensorArray: records what the body writes
        def write(self, index, value):
            seen.append(value.dtype)
            return self

    with probe.as_default():
        args = [tf.TensorArray(v.dtype, size=0, dynamic_size=True, infer_shape=False)
                if isinstance(v, tf.TensorArray) else tf.compat.v1.placeholder(v.dtype, v.shape) for v in loop_vars]
        step(*args, *[Probe() for _ in range(k)])
    return seen


def _outer(body, value: str, prefix: str) -> str:
    """The name a body output has once the body's values are renamed apart (an outer value keeps its name)."""
    local = {i.name for i in body.input} | {o for n in body.node for o in n.output if o}
    return prefix + value if value in local else value


@register("Loop", since=11)  # version 1 let the loop-carried values' shapes differ from the body's outputs unchecked
def _loop(ctx: Ctx, node, attrs):
    body = attrs["body"]
    m_name = node.input[0] if len(node.input) > 0 else ""
    c_name = node.input[1] if len(node.input) > 1 else ""
    carried = list(node.input[2:])
    n = len(carried)
    k = len(body.output) - 1 - n
    if not m_name and not c_name:
        raise OnnxConversionError(f"Loop {node.name!r} has neither a trip count nor a condition: it never ends.")
    trips = _scalar(ctx.plain(m_name), tf.int64) if m_name else None
    cond0 = _scalar(ctx.plain(c_name), tf.bool) if c_name else tf.constant(True)
    is_seq = [name in ctx.sequences for name in carried]
    init = [_array_of(ctx, node, name, info) if s else ctx.plain(name)
            for name, info, s in zip(carried, body.input[2:], is_seq)]
    prefix = f"{node.output[0] or node.name or 'Loop'}/loop/"
    outputs = [_outer(body, o.name, prefix) for o in body.output]

    def step(i, c, *state):
        with scoped(ctx, body):
            _set_initializers(ctx, body)
            ctx.set(prefix + body.input[0].name, i)
            ctx.set(prefix + body.input[1].name, c)
            for info, v, s in zip(body.input[2:], state[:n], is_seq):
                if s:
                    ctx.set_sequence(prefix + info.name, Written(v))
                else:
                    ctx.set(prefix + info.name, v)
            ctx.convert_nodes(body_nodes(body, prefix))
            c_out = _scalar(ctx.plain(outputs[0]), tf.bool) if c_name else c
            new = []
            for name, s, before in zip(outputs[1:1 + n], is_seq, state[:n]):
                if s:
                    new.append(_array_of(ctx, node, name, None))
                else:
                    value = tf.cast(ctx.plain(name), before.dtype)
                    new.append(value)
            scans = [ta.write(tf.cast(i, tf.int32), ctx.plain(name))
                     for ta, name in zip(state[n:], outputs[1 + n:])]
        return [i + 1, c_out, *new, *scans]

    def keep_going(i, c, *state):
        return tf.logical_and(c, i < trips) if trips is not None else c

    scan_types = [_elem_dtype(o.type) for o in body.output[1 + n:]]
    if None in scan_types:  # undeclared (ONNX's function of Range): the body converted once aside tells
        scan_types = _probe_scan_types(step, [tf.constant(0, tf.int64), cond0, *init], k)
    loop_vars = [tf.constant(0, tf.int64), cond0, *init, *[_new_array(t) for t in scan_types]]
    limit = None if trips is None else tf.cast(tf.maximum(trips, 0), tf.int32)
    try:
        result = tf.while_loop(keep_going, step, loop_vars, maximum_iterations=limit)
    except ValueError as exc:  # a carried tensor changes shape from one iteration to the next
        if isinstance(exc, OnnxConversionError) or "shape" not in str(exc):
            raise
        invariants = [tf.TensorShape([]), tf.TensorShape([])] + [
            v.element_shape if isinstance(v, tf.TensorArray) else tf.TensorShape(None) for v in loop_vars[2:]]
        result = tf.while_loop(keep_going, step, loop_vars, maximum_iterations=limit, shape_invariants=invariants)
    final, scans = result[2:2 + n], result[2 + n:]
    for name, value, s in zip(node.output[:n], final, is_seq):
        if s:
            ctx.set_sequence(name, Written(value))
        else:
            ctx.set(name, tf.identity(value))
    for name, ta, info in zip(node.output[n:n + k], scans, body.output[1 + n:]):
        stacked = ta.stack()
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and stacked.shape.rank is None:
            stacked = tf.ensure_shape(stacked, [None] + [d.dim_value if d.HasField("dim_value") else None for d in dims])
        ctx.set(name, stacked)
