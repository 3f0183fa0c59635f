"""Freezing Keras models and SavedModel signatures into GraphDefs with readable names.

``convert_variables_to_constants_v2`` names each constant after the captured resource placeholder
(``model/dense_1/MatMul/ReadVariableOp/resource``). We rename every such constant to its variable's
path (``dense/kernel``) and each output to its Keras or signature name, so weight and tensor names
mean something to the user.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tfnet.graph_utils import rename_nodes, unique_name

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")


def clean_node_name(name: str) -> str:
    """Turns a variable or signature name into a legal GraphDef node name."""
    name = name.split(":")[0]
    name = _BAD_CHARS.sub("_", name).strip("/")
    if not name or not re.match(r"[A-Za-z0-9.]", name[0]):
        name = "t" + name
    return name


def _variable_name(var) -> str:
    path = getattr(var, "path", None)  # Keras 3 variables carry their layer path
    return path if isinstance(path, str) and path else var.name


def _tf_variable(var):
    """The tf.Variable behind a Keras 3 variable, or the variable itself."""
    inner = getattr(var, "_value", None)
    return inner if isinstance(inner, tf.Variable) else var


def freeze_concrete_function(
    fn,
    variables: Iterable,
    output_names: Sequence[str] | None = None,
) -> tuple[graph_pb2.GraphDef, list[str], list[str], list[str]]:
    """Freezes a concrete function whose variables are ``variables``.

    Returns:
        The GraphDef, its input tensor names, its output tensor names, and the names of the
        constants that hold float variables (the weights).
    """
    by_handle = {}
    for var in variables:
        tfv = _tf_variable(var)
        by_handle[id(tfv.handle)] = _variable_name(var)
    frozen = convert_variables_to_constants_v2(fn)
    graph_def = frozen.graph.as_graph_def()
    taken = {n.name for n in graph_def.node}
    mapping: dict[str, str] = {}
    weights = []
    nodes = {n.name: n for n in graph_def.node}
    for external, internal in fn.graph.captures:
        name = by_handle.get(id(external))
        if name is None:
            continue
        new = unique_name(clean_node_name(name), taken - {internal.op.name})
        taken.add(new)
        mapping[internal.op.name] = new
        node = nodes.get(internal.op.name)
        if node is not None and node.op == "Const" and tf.as_dtype(node.attr["dtype"].type).is_floating:
            weights.append(new)
    outputs = [t.name for t in frozen.outputs]
    if output_names is not None:
        for tensor, wanted in zip(list(outputs), output_names):
            node = tensor.split(":")[0]
            if tensor.endswith(":0") and node not in mapping:
                new = unique_name(clean_node_name(wanted), taken - {node})
                taken.add(new)
                mapping[node] = new
    graph_def = rename_nodes(graph_def, mapping)
    outputs = [mapping.get(t.split(":")[0], t.split(":")[0]) + ":" + t.split(":")[1] for t in outputs]
    inputs = [t.name for t in frozen.inputs if t.dtype != tf.resource]
    return graph_def, inputs, outputs, weights


def keras_input_specs(model) -> list[tf.TensorSpec]:
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError(
            "The Keras model has no defined inputs. Build it on a keras.Input (functional or "
            "Sequential with an input shape), or call it once on data before TFNet.from_keras. "
            f"Received: {type(model).__name__} with inputs={inputs!r}"
        )
    specs = []
    taken: set[str] = set()
    for i, t in enumerate(inputs):
        name = unique_name(clean_node_name(getattr(t, "name", None) or f"input_{i}"), taken)
        taken.add(name)
        specs.append(tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype), name=name))
    return specs


def _layer_outputs(model) -> list[tuple[str, object]]:
    """(layer name, symbolic output) for each top-level layer with one output tensor."""
    import keras

    found = []
    for layer in getattr(model, "layers", []):
        if isinstance(layer, keras.layers.InputLayer):
            continue
        try:
            out = layer.output
        except (AttributeError, ValueError, RuntimeError):
            continue  # a layer called several times has no single output
        if isinstance(out, keras.KerasTensor):
            found.append((layer.name, out))
    return found


def freeze_keras(model) -> tuple[graph_pb2.GraphDef, list[str], list[str], list[str]]:
    """Freezes a built Keras 3 model in inference mode (``training=False``).

    Besides renaming weights and outputs, each top-level layer's output node is renamed to the
    layer's name where that is free, so ``net.cut("global_average_pooling2d")`` works.
    """
    import keras

    specs = keras_input_specs(model)
    outputs_flat = tf.nest.flatten(getattr(model, "outputs", None) or [])
    layers = _layer_outputs(model) if outputs_flat else []
    probe = model
    if layers:
        try:
            probe = keras.Model(model.inputs, outputs_flat + [o for _, o in layers])
        except (ValueError, TypeError):
            probe, layers = model, []
    struct = getattr(model, "_inputs_struct", None)

    def call(*xs):
        if struct is not None and len(tf.nest.flatten(struct)) == len(xs):
            args = tf.nest.pack_sequence_as(struct, list(xs))
        else:
            args = xs[0] if len(xs) == 1 else list(xs)
        return tf.nest.flatten(probe(args, training=False))

    fn = tf.function(call, autograph=False).get_concrete_function(*specs)
    n_out = len(fn.outputs) - len(layers)
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != n_out:
        names = [f"output_{i}" for i in range(n_out)]
    graph_def, inputs, outputs, weights = freeze_concrete_function(fn, model.variables, names)
    if layers:
        graph_def = _name_layer_outputs(graph_def, outputs[n_out:], [n for n, _ in layers])
    return graph_def, inputs, outputs[:n_out], weights


def _name_layer_outputs(graph_def, probes: list[str], layer_names: list[str]) -> graph_pb2.GraphDef:
    """Drops the probe Identity nodes and renames what each one read to its layer's name."""
    nodes = {n.name: n for n in graph_def.node}
    probe_nodes = {t.split(":")[0] for t in probes}
    taken = set(nodes) - probe_nodes
    mapping = {}
    for probe, layer in zip(probes, layer_names):
        node = nodes.get(probe.split(":")[0])
        if node is None or node.op != "Identity" or not node.input:
            continue
        src = node.input[0]
        src_node = src.split(":")[0]
        if (":" in src and not src.endswith(":0")) or src_node in mapping or src_node in probe_nodes:
            continue
        if nodes[src_node].op in ("Placeholder", "Const"):
            continue
        new = clean_node_name(layer)
        if new in taken:
            continue
        taken.add(new)
        mapping[src_node] = new
    kept = graph_pb2.GraphDef()
    kept.versions.CopyFrom(graph_def.versions)
    kept.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name not in probe_nodes:
            kept.node.add().CopyFrom(node)
    return rename_nodes(kept, mapping)


def freeze_signature(loaded, signature: str) -> tuple[graph_pb2.GraphDef, list[str], list[str], list[str]]:
    """Freezes one signature of a ``tf.saved_model.load``-ed object.

    Inputs are named after the signature's argument names and outputs after its output keys.
    """
    fn = loaded.signatures[signature]
    out_struct = fn.structured_outputs
    if isinstance(out_struct, dict):
        out_names = list(tf.nest.flatten({k: k for k in out_struct}))
    else:
        out_names = [f"output_{i}" for i in range(len(tf.nest.flatten(out_struct)))]
    return freeze_concrete_function(fn, trackable_variables(loaded), out_names)


def trackable_variables(root) -> list:
    """Every tf.Variable reachable from a trackable object (a loaded SavedModel, say)."""
    found = {}
    for obj in tf.train.TrackableView(root).descendants():
        if isinstance(obj, tf.Variable):
            found[id(obj)] = obj
    return list(found.values())
