"""ONNX ``Scan`` as TensorFlow ops: its body unrolled over a sequence length known while converting.

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


@register("Scan", since=9)  # version 8 had a batch dimension and sequence_lens
def _scan(ctx: Ctx, node, attrs):
    body = attrs["body"]
    m = attrs["num_scan_inputs"]
    n = len(node.input) - m
    states = [ctx.plain(i) for i in node.input[:n]]
    scans = [ctx.plain(i) for i in node.input[n:]]
    in_axes = list(attrs.get("scan_input_axes", [0] * m))
    in_dirs = list(attrs.get("scan_input_directions", [0] * m))
    k = len(body.output) - n
    out_axes = list(attrs.get("scan_output_axes", [0] * k))
    out_dirs = list(attrs.get("scan_output_directions", [0] * k))
    in_axes = [a + s.shape.rank if a < 0 else a for a, s in zip(in_axes, scans)]
    lengths = {s.shape[a] for s, a in zip(scans, in_axes)}
    if len(lengths) != 1 or None in lengths:
        raise OnnxConversionError(
            f"Scan {node.name!r} runs over a sequence of length {sorted(lengths, key=str)} (scan inputs of shapes "
            f"{[s.shape for s in scans]}); tfnet unrolls a Scan and needs one length known while converting.")
    steps = lengths.pop()
    slices = [tf.unstack(s, steps, axis=a) for s, a in zip(scans, in_axes)]
    collected = [[] for _ in range(k)]
    for t in range(steps):
        prefix = f"{node.output[0] or node.name}/step{t}/"
        for i, v in zip(body.input[:n], states):
            ctx.set(prefix + i.name, v)
        for i, parts, backward in zip(body.input[n:], slices, in_dirs):
            ctx.set(prefix + i.name, parts[steps - 1 - t if backward else t])
        ctx.convert_nodes(body_nodes(body, prefix))
        states = [ctx.plain(prefix + o.name if _defined(body, o.name) else o.name) for o in body.output[:n]]
        for j, o in enumerate(body.output[n:]):
            collected[j].append(ctx.plain(prefix + o.name if _defined(body, o.name) else o.name))
    for name, value in zip(node.output[:n], states):
        ctx.set(name, tf.identity(value))
    for name, parts, axis, backward in zip(node.output[n:], collected, out_axes, out_dirs):
        rank = parts[0].shape.rank + 1
        ctx.set(name, tf.stack(parts[::-1] if backward else parts, axis=axis + rank if axis < 0 else axis))


def _defined(graph, value: str) -> bool:
    return value in {i.name for i in graph.input} or any(value in n.output for n in graph.node)
