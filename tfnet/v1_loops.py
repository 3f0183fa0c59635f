"""Gradients through v1 control flow loops (``Enter`` / ``Merge`` / ``Switch`` / ``NextIteration`` /
``Exit``) in an imported frozen graph.

TensorFlow differentiates a v1 ``tf.while_loop`` with the loop's ``WhileContext``: a Python object
that the graph's builder holds, and that a ``MetaGraphDef`` stores in a collection, but that a frozen
``GraphDef`` loses. (TensorFlow's own ``convert_variables_to_constants_v2`` lowers Keras 3's ``LSTM``
and ``GRU`` loops to exactly this form.) :func:`restore_while_contexts` rebuilds each loop's context
from the graph's structure after import, so that ``tf.gradients`` in graph mode, in the same graph,
differentiates the loop as it would have in the original. Every walk is iterative with a visited set,
so a loop's cycle (``NextIteration`` feeds ``Merge``) costs time linear in the graph's size.
:func:`restored_loops` does it around an import, and :func:`graph_mode_function` compiles a function of such a
graph (:mod:`tfnet.net_compute`'s forward pass and vector-Jacobian product of these graphs).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import control_flow_pb2
from tensorflow.python.ops import control_flow_ops

from tfnet.errors import GradientUnavailableError

__all__ = ["graph_mode_function", "restore_while_contexts", "restored_loops"]

_ENTER = ("Enter", "RefEnter")
_EXIT = ("Exit", "RefExit")


def restore_while_contexts(ops: list[tf.Operation]) -> int:
    """Gives the loop ops among ``ops`` (just imported into the default graph) their
    ``WhileContext``. Returns the number of loops.

    Raises:
        GradientUnavailableError: nested loops, or a loop whose structure is not the one
            ``tf.while_loop`` builds; the message names the node.
    """
    frames: dict[str, list[tf.Operation]] = defaultdict(list)
    for op in ops:
        if op.type in _ENTER:
            frames[op.get_attr("frame_name").decode()].append(op)
    if not frames:
        return 0
    member: dict[str, str] = {}  # op name -> frame
    for frame, enters in frames.items():
        queue = deque(enters)
        seen = {op.name for op in enters}
        while queue:
            op = queue.popleft()
            other = member.get(op.name)
            if other is not None and other != frame:
                raise GradientUnavailableError(
                    f"Node {op.name!r} belongs to two v1 loops ({other!r} and {frame!r}): nested v1 "
                    "loops are not differentiable once frozen. forward() works."
                )
            member[op.name] = frame
            if op.type in _EXIT:
                continue
            nexts = [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs)  # noqa: SLF001
            for c in nexts:
                if c.name not in seen and c.type not in _ENTER:
                    seen.add(c.name)
                    queue.append(c)
    for frame, enters in frames.items():
        for op in enters:
            outer = member.get(op.inputs[0].op.name) if op.inputs else None
            if outer is not None and outer != frame:
                raise GradientUnavailableError(
                    f"Node {op.name!r} belongs to two v1 loops: it enters loop {frame!r} from inside loop "
                    f"{outer!r}. Nested v1 loops are not differentiable once frozen. forward() works."
                )
    by_frame: dict[str, list[tf.Operation]] = defaultdict(list)
    graph = ops[0].graph
    for name, frame in member.items():
        by_frame[frame].append(graph.get_operation_by_name(name))
    for frame, frame_ops in by_frame.items():
        _build_context(frame, frames[frame], frame_ops)
    return len(frames)


def _build_context(frame: str, enters: list[tf.Operation], frame_ops: list[tf.Operation]) -> None:
    loop_enters = [op for op in enters if not op.get_attr("is_constant")]
    const_enters = [op for op in enters if op.get_attr("is_constant")]
    conds = [op for op in frame_ops if op.type == "LoopCond"]
    exits = [op for op in frame_ops if op.type in _EXIT]
    if len(conds) != 1 or not loop_enters:
        raise GradientUnavailableError(
            f"The v1 loop {frame!r} (node {enters[0].name!r}) does not have the structure "
            "tf.while_loop builds (one LoopCond, loop-variable Enter nodes); its gradient cannot be "
            "rebuilt. forward() works."
        )
    pivot = conds[0].outputs[0]
    merges = [c for c in loop_enters[0].outputs[0].consumers() if c.type in ("Merge", "RefMerge")]
    if not merges:
        raise GradientUnavailableError(f"The v1 loop {frame!r}: Enter {loop_enters[0].name!r} feeds no Merge.")
    pivot_for_pred = merges[0].outputs[0]
    switch = [c for c in pivot_for_pred.consumers() if c.type in ("Switch", "RefSwitch")]
    body_ids = [c for s in switch for c in s.outputs[1].consumers() if c.type == "Identity"]
    pivot_for_body = body_ids[0].outputs[0] if body_ids else pivot_for_pred
    context = control_flow_pb2.WhileContextDef(
        context_name=frame,
        parallel_iterations=int(loop_enters[0].get_attr("parallel_iterations")),
        back_prop=True,
        swap_memory=False,
        pivot_name=pivot.name,
        pivot_for_pred_name=pivot_for_pred.name,
        pivot_for_body_name=pivot_for_body.name,
        loop_exit_names=[op.outputs[0].name for op in exits],
        loop_enter_names=[op.outputs[0].name for op in loop_enters],
    )
    values = {t.name for op in frame_ops for t in op.outputs}
    for op in const_enters:
        external = op.inputs[0]
        values.add(external.name)
        context.values_def.external_values[external.name] = op.outputs[0].name
    context.values_def.values.extend(sorted(values))
    control_flow_ops.WhileContext(context_def=context)


def restored_loops(import_graph: Callable[[], Any]) -> Any:
    """Runs ``import_graph`` (which imports the frozen graph into the graph being built) and gives the v1 loops
    among the ops it created their ``WhileContext``, so that ``tf.gradients`` differentiates them; returns what
    ``import_graph`` returned.

    Raises:
        GradientUnavailableError: as :func:`restore_while_contexts`.
    """
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    found = import_graph()
    restore_while_contexts(graph.get_operations()[before:])
    return found


def graph_mode_function(fn: Callable, signature: Sequence[Sequence[tf.TensorSpec]]) -> Callable:
    """``fn(*lists)`` compiled in graph mode (``tf.compat.v1.wrap_function``), for graphs with v1 loops: their
    frames and ``tf.function``'s automatic control dependencies do not mix, and v1 control flow's gradient code
    compares tensors with ``!=``, which TensorFlow 2 turns into an op (tensor equality is off while tracing).

    Args:
        fn: Takes one list of tensors per part of ``signature``.
        signature: One list of ``tf.TensorSpec`` per argument of ``fn``.

    Returns:
        A function taking the same lists.
    """
    sizes = [len(part) for part in signature]

    def flat(*args):
        parts, start = [], 0
        for size in sizes:
            parts.append(list(args[start:start + size]))
            start += size
        return fn(*parts)

    equality = tf.compat.v1.executing_eagerly_outside_functions() and _tensor_equality()
    tf.compat.v1.disable_tensor_equality()
    try:
        wrapped = tf.compat.v1.wrap_function(flat, [spec for part in signature for spec in part])
    finally:
        if equality:
            tf.compat.v1.enable_tensor_equality()
    return lambda *parts: wrapped(*[t for part in parts for t in part])


def _tensor_equality() -> bool:
    from tensorflow.python.framework import tensor as tensor_lib

    return bool(getattr(tensor_lib.Tensor, "_USE_EQUALITY", True))
