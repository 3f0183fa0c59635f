"""Folding inference-mode batch norm (and other per-channel affine ops) into the preceding
convolution or matmul, for compute only.

A frozen graph applies batch norm as ``y = conv(x, W) * s + t`` where ``s`` and ``t`` depend on
weights only (``s = gamma * rsqrt(var + eps)``, ``t = beta - mean * s``). This rewrite computes
``y = BiasAdd(conv(x, W * s), b * s + t)`` instead: the same function of the same weights, so
gradients still reach ``W``, ``gamma``, ``beta`` and the rest, but two full passes over the
activations (forward, and more in backward) become weight-sized ops. It is applied to the graph that
runs, never to the graph that is saved.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import tensor_util

from tfnet.graph_utils import node_name

_LINEAR_OPS = ("Conv2D", "MatMul", "DepthwiseConv2dNative")
_FUSED_BN = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
# v1 control flow: values that change per iteration are never parameter-only.
_LOOP_OPS = ("Enter", "RefEnter", "Merge", "RefMerge", "Switch", "RefSwitch", "NextIteration", "RefNextIteration",
             "Exit", "RefExit", "LoopCond")
_PARAM_OPS_BLOCKLIST = ("Placeholder", "PlaceholderWithDefault", "VarHandleOp", "RandomUniform", "RandomStandardNormal")


def fold_affine(
    graph_def: graph_pb2.GraphDef, graph: tf.Graph, input_names: list[str], weight_names: list[str]
) -> tuple[graph_pb2.GraphDef, int]:
    """Returns the rewritten graph and how many affine ops were folded.

    ``graph`` is ``graph_def`` imported (with ``name=""``), used for static shapes only.
    """
    nodes = {n.name: n for n in graph_def.node}
    consumers: dict[str, list[str]] = defaultdict(list)
    for n in graph_def.node:
        for inp in n.input:
            consumers[node_name(inp)].append(n.name)
    params = _parameter_only(graph_def, set(weight_names), {node_name(i) for i in input_names})
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    by_name = {n.name: n for n in out.node}
    folded = 0
    for node in graph_def.node:
        if node.op == "Mul" and len(node.input) == 2:
            plan = _match(node, nodes, consumers, params, graph)
        elif node.op in _FUSED_BN and not node.attr["is_training"].b:
            plan = _match_fused_bn(node, nodes, consumers, params, graph)
        else:
            continue
        # Before a residual sum read past the next activation, the folded BiasAdd is what TensorFlow's remapper breaks
        # on: tfnet.remapper_guard, after the fold, makes it an AddV2 (as fast as leaving the batch norm: measured).
        if plan is None:
            continue
        _rewrite(out, by_name, plan, graph)
        folded += 1
    return out, folded


def _parameter_only(graph_def, weights: set[str], inputs: set[str]) -> set[str]:
    """Nodes whose value depends on constants and weights only, never on the inputs."""
    nodes = {n.name: n for n in graph_def.node}
    state: dict[str, bool] = {}
    pending: set[str] = set()  # on the stack: a node met again there is part of a cycle
    for start in nodes:
        stack = [(start, False)]
        while stack:
            name, expanded = stack.pop()
            if name in state or (name in pending and not expanded):
                continue
            node = nodes.get(name)
            if node is None or name in inputs:
                state[name] = False
                continue
            if name in weights or node.op == "Const":
                state[name] = True
                continue
            if node.op in _PARAM_OPS_BLOCKLIST or node.op.startswith("Random") or node.op in _LOOP_OPS:
                state[name] = False
                continue
            deps = [node_name(i) for i in node.input if not i.startswith("^")]
            if not deps:
                state[name] = False
                continue
            if expanded:
                pending.discard(name)
                state[name] = all(state.get(d, False) for d in deps)
            else:
                pending.add(name)
                stack.append((name, True))
                stack.extend((d, False) for d in deps if d not in state and d not in pending)
    return {k for k, v in state.items() if v}


def _static_shape(graph: tf.Graph, tensor: str):
    try:
        shape = graph.get_tensor_by_name(tensor if ":" in tensor else tensor + ":0").shape
    except (KeyError, ValueError):
        return None
    return None if shape.rank is None else shape.as_list()


def _channel_vector_ok(shape, channels: int) -> bool:
    """``[C]``, or ``[1, ..., 1, C]``: a per-channel vector that broadcasts on the last axis."""
    if shape is None or not shape or any(d is None for d in shape):
        return False
    return shape[-1] == channels and all(d == 1 for d in shape[:-1])


def _linear_before(data: str, nodes, consumers, params):
    """``(linear node, bias input or None)`` if ``data`` is ``[BiasAdd](Conv|MatMul)`` with no
    other consumer, in NHWC layout, with a weight-only kernel and bias; else None."""
    producer = nodes.get(data)
    if producer is None or len(consumers[data]) != 1:
        return None
    bias = None
    linear = producer
    if producer.op == "BiasAdd":
        if producer.attr["data_format"].s not in (b"", b"NHWC"):
            return None
        lin_name = node_name(producer.input[0])
        linear = nodes.get(lin_name)
        if linear is None or len(consumers[lin_name]) != 1 or node_name(producer.input[1]) not in params:
            return None
        bias = producer.input[1]
    if linear.op not in _LINEAR_OPS:
        return None
    if linear.op in ("Conv2D", "DepthwiseConv2dNative") and linear.attr["data_format"].s not in (b"", b"NHWC"):
        return None
    if linear.op == "MatMul" and linear.attr["transpose_b"].b:
        return None
    if node_name(linear.input[1]) not in params or node_name(linear.input[0]) in params:
        return None
    return linear, bias


def _match(mul, nodes, consumers, params, graph):
    """Finds ``[BiasAdd](Conv|MatMul) * s [+ t]`` around this Mul; returns a plan or None."""
    a, b = (node_name(i) for i in mul.input)
    if any(i.startswith("^") or (":" in i and not i.endswith(":0")) for i in mul.input):
        return None
    if b in params and a not in params:
        data, scale = a, mul.input[1]
    elif a in params and b not in params:
        data, scale = b, mul.input[0]
    else:
        return None
    found = _linear_before(data, nodes, consumers, params)
    if found is None:
        return None
    linear, bias = found
    channels, kshape = _shapes(graph, mul.name, linear.input[1])
    if channels is None or not _channel_vector_ok(_static_shape(graph, scale), channels):
        return None
    shift = None
    last = mul
    if len(consumers[mul.name]) == 1:
        add = nodes[consumers[mul.name][0]]
        if add.op in ("AddV2", "Add") and len(add.input) == 2:
            other = [i for i in add.input if node_name(i) != mul.name]
            if len(other) == 1 and node_name(other[0]) in params and not other[0].startswith("^"):
                if _channel_vector_ok(_static_shape(graph, other[0]), channels):
                    shift, last = other[0], add
    return {
        "linear": linear, "kernel": linear.input[1], "kshape": kshape, "bias": bias, "scale": scale,
        "shift": shift, "last": last, "dtype": mul.attr["T"],
    }


def _match_fused_bn(bn, nodes, consumers, params, graph):
    """An inference-mode FusedBatchNorm whose only used output is ``y``, after a linear op."""
    if bn.attr["data_format"].s not in (b"", b"NHWC") or len(bn.input) < 5:
        return None
    for consumer in consumers[bn.name]:
        for inp in nodes[consumer].input:
            if node_name(inp) == bn.name and (inp.startswith("^") or (":" in inp and not inp.endswith(":0"))):
                return None
    if not all(node_name(i) in params for i in bn.input[1:5]):
        return None
    found = _linear_before(node_name(bn.input[0]), nodes, consumers, params)
    if found is None or (":" in bn.input[0] and not bn.input[0].endswith(":0")):
        return None
    linear, bias = found
    channels, kshape = _shapes(graph, bn.name, linear.input[1])
    if channels is None:
        return None
    dtype = bn.attr["T"]
    return {
        "linear": linear, "kernel": linear.input[1], "kshape": kshape, "bias": bias, "scale": None,
        "shift": None, "last": bn, "dtype": dtype, "fused_bn": list(bn.input[1:5]),
        "epsilon": bn.attr["epsilon"].f,
    }


def _shapes(graph, out_tensor, kernel):
    out_shape = _static_shape(graph, out_tensor)
    kshape = _static_shape(graph, kernel)
    if not out_shape or out_shape[-1] is None or kshape is None or any(d is None for d in kshape):
        return None, None
    return out_shape[-1], kshape


def _const(out, name, value):
    node = out.node.add()
    node.name = name
    node.op = "Const"
    node.attr["dtype"].type = tf.as_dtype(np.asarray(value).dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(np.asarray(value)))
    return name


def _op(out, name, op, inputs, dtype) -> str:
    node = out.node.add()
    node.name = name
    node.op = op
    node.input.extend(inputs)
    node.attr["T"].CopyFrom(dtype)
    if op == "Reshape":
        node.attr["Tshape"].type = tf.int32.as_datatype_enum
    return name


def _rewrite(out, by_name, plan, graph) -> None:
    linear, last, dtype = plan["linear"], plan["last"], plan["dtype"]
    base = last.name + "/folded"
    if "fused_bn" in plan:  # s = gamma * rsqrt(var + eps), t = beta - mean * s
        gamma, beta, mean, var = plan["fused_bn"]
        np_dtype = tf.as_dtype(dtype.type).as_numpy_dtype
        eps = _const(out, base + "/epsilon", np.asarray(plan["epsilon"], np_dtype))
        rsqrt = _op(out, base + "/rsqrt", "Rsqrt", [_op(out, base + "/var_eps", "AddV2", [var, eps], dtype)], dtype)
        plan["scale"] = _op(out, base + "/bn_scale", "Mul", [gamma, rsqrt], dtype)
        mean_scale = _op(out, base + "/mean_scale", "Mul", [mean, plan["scale"]], dtype)
        plan["shift"] = _op(out, base + "/bn_shift", "Sub", [beta, mean_scale], dtype)
    vec_shape = _const(out, base + "/vec_shape", np.array([-1], np.int32))
    scale = _op(out, base + "/scale", "Reshape", [plan["scale"], vec_shape], dtype)
    kscale = scale
    if linear.op == "DepthwiseConv2dNative":  # channels are (in_channel, multiplier) pairs
        dw_shape = _const(out, base + "/dw_shape", np.array(plan["kshape"][2:], np.int32))
        kscale = _op(out, base + "/kernel_scale", "Reshape", [scale, dw_shape], dtype)
    kernel = _op(out, base + "/kernel", "Mul", [_past_identities(plan["kernel"], by_name), kscale], dtype)
    new_linear = out.node.add()
    new_linear.CopyFrom(linear)
    new_linear.name = base + "/" + linear.op
    new_linear.input[1] = kernel
    bias = None
    if plan["bias"] is not None:
        bias = _op(out, base + "/bias", "Mul", [plan["bias"], scale], dtype)
    if plan["shift"] is not None:
        shift = _op(out, base + "/shift", "Reshape", [plan["shift"], vec_shape], dtype)
        bias = shift if bias is None else _op(out, base + "/bias_shift", "AddV2", [bias, shift], dtype)
    # The last node of the pattern keeps its name, so every consumer reads the folded result.
    target = by_name[last.name]
    target.ClearField("input")
    target.ClearField("attr")
    target.attr["T"].CopyFrom(dtype)
    if bias is None:
        target.op = "Identity"
        target.input.append(new_linear.name)
    else:
        target.op = "BiasAdd"
        target.input.extend([new_linear.name, bias])
        target.attr["data_format"].s = b"NHWC"


def _past_identities(tensor: str, by_name) -> str:
    """``tensor`` read past the ``Identity`` ops it comes through (a frozen Keras graph reads each kernel through one,
    Keras's ``ReadVariableOp``): the weight itself. Under the bf16 training step's mixed-precision rewrite, an
    ``Identity`` between the weight and the fold's two readers of it (the folded kernel and the scale's gradient, one
    in bfloat16, the other in float32) is cast to bfloat16 and back to float32: a kernel-sized round trip each (53 a
    ResNet-50 step). Same value, same gradient."""
    node = by_name.get(node_name(tensor))
    while node is not None and node.op == "Identity" and len(node.input) == 1 and not node.input[0].startswith("^"):
        tensor = node.input[0]
        node = by_name.get(node_name(tensor))
    return tensor
