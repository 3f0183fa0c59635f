"""ONNX ``Scan`` as TensorFlow ops: its body unrolled over a sequence length known while converting (version 8, whose
inputs have a batch axis, per batch entry too).

Each step's body is converted again with its values renamed apart (``<output>/step<t>/...``): the
state variables threaded from step to step, one slice of each scan input (along its axis, forward or
reversed), the scan outputs stacked at the end. Like the recurrent operators, the sequence length must
be static; a body that reads values from the enclosing graph reads them as they are.
"""

from __future__ import annotations

import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import register


def body_nodes(graph, prefix: str) -> list:
    """The nodes of ``graph`` with every value it defines (its inputs and node outputs) prefixed."""
    from onnx import NodeProto

    from tfnet.onnx.functions import rename_free

    local = {i.name for i in graph.input} | {o for n in graph.node for o in n.output if o}

    def name(v: str) -> str:
        return prefix + v if v in local else v

    out = []
    for n in graph.node:
        new = NodeProto()
        new.CopyFrom(n)
        new.input[:] = [name(v) if v else v for v in n.input]
        new.output[:] = [name(v) if v else v for v in n.output]
        new.name = prefix + (n.name or n.op_type)
        for a in new.attribute:  # subgraphs read the renamed values of this body
            if a.g.node:
                rename_free(a.g, name)
            for g in a.graphs:
                rename_free(g, name)
        out.append(new)
    return out


@register("Scan", since=8)
def _scan(ctx: Ctx, node, attrs):
    if ctx.version < 9:
        return _scan_batched(ctx, node, attrs)
    body = attrs["body"]
    m = attrs["num_scan_inputs"]
    n = len(node.input) - m
    k = len(body.output) - n
    scans = [ctx.plain(i) for i in node.input[n:]]
    in_axes = [a + s.shape.rank if a < 0 else a for a, s in zip(attrs.get("scan_input_axes", [0] * m), scans)]
    states, outputs = _unrolled(ctx, node, body, [ctx.plain(i) for i in node.input[:n]], scans, in_axes,
                                list(attrs.get("scan_input_directions", [0] * m)), node.output[0] or node.name)
    for name, value in zip(node.output[:n], states):
        ctx.set(name, tf.identity(value))
    out_axes, out_dirs = attrs.get("scan_output_axes", [0] * k), attrs.get("scan_output_directions", [0] * k)
    for name, parts, axis, backward in zip(node.output[n:], outputs, out_axes, out_dirs):
        rank = parts[0].shape.rank + 1
        ctx.set(name, tf.stack(parts[::-1] if backward else parts, axis=axis + rank if axis < 0 else axis))


def _scan_batched(ctx: Ctx, node, attrs):
    """Version 8: every state and scan input has a batch axis first (the scan runs along axis 1 of the scan inputs),
    ``directions`` for the scan inputs, and an optional first input ``sequence_lens``, taken here only where it is
    absent or every entry is the full length. Unrolled per batch entry, so the batch must be known while converting."""
    body = attrs["body"]
    m = attrs["num_scan_inputs"]
    lens_name, rest = node.input[0], list(node.input[1:])
    n = len(rest) - m
    k = len(body.output) - n
    states, scans = [ctx.plain(i) for i in rest[:n]], [ctx.plain(i) for i in rest[n:]]
    batches = {t.shape[0] for t in states + scans}
    lens = ctx.static_ints(lens_name) if lens_name else None
    full = {s.shape[1] for s in scans}
    if len(batches) != 1 or None in batches or (lens_name and (lens is None or set(lens) != full)):
        raise OnnxConversionError(
            f"Scan {node.name!r} (version 8): tfnet unrolls it per batch entry and needs the batch size known while "
            f"converting (inputs of shapes {[t.shape for t in states + scans]}) and sequence_lens absent or all the "
            f"full length (here {lens if lens_name else 'absent'}).")
    finals, outs = [[] for _ in range(n)], [[] for _ in range(k)]
    for b in range(batches.pop()):
        kept, parts = _unrolled(ctx, node, body, [t[b] for t in states], [s[b] for s in scans], [0] * m,
                                list(attrs.get("directions", [0] * m)), f"{node.output[0] or node.name}/batch{b}")
        for j, v in enumerate(kept):
            finals[j].append(v)
        for j, v in enumerate(parts):
            outs[j].append(tf.stack(v))
    for name, values in zip(node.output[:n] + node.output[n:], finals + outs):
        ctx.set(name, tf.stack(values))


def _unrolled(ctx: Ctx, node, body, states, scans, in_axes, in_dirs, prefix: str):
    """The body run over the scan inputs' slices: the final states and, per scan output, its steps' values in order
    of the steps."""
    n = len(states)
    k = len(body.output) - n
    lengths = {s.shape[a] for s, a in zip(scans, in_axes)}
    if len(lengths) != 1 or None in lengths:
        raise OnnxConversionError(
            f"Scan {node.name!r} runs over a sequence of length {sorted(lengths, key=str)} (scan inputs of shapes "
            f"{[s.shape for s in scans]}); tfnet unrolls a Scan and needs one length known while converting.")
    steps = lengths.pop()
    slices = [tf.unstack(s, steps, axis=a) for s, a in zip(scans, in_axes)]
    collected = [[] for _ in range(k)]
    for t in range(steps):
        step = f"{prefix}/step{t}/"
        for i, v in zip(body.input[:n], states):
            ctx.set(step + i.name, v)
        for i, parts, backward in zip(body.input[n:], slices, in_dirs):
            ctx.set(step + i.name, parts[steps - 1 - t if backward else t])
        ctx.convert_nodes(body_nodes(body, step))
        states = [ctx.plain(step + o.name if _defined(body, o.name) else o.name) for o in body.output[:n]]
        for j, o in enumerate(body.output[n:]):
            collected[j].append(ctx.plain(step + o.name if _defined(body, o.name) else o.name))
    return states, collected


def _defined(graph, value: str) -> bool:
    return value in {i.name for i in graph.input} or any(value in n.output for n in graph.node)
