"""Freezing Keras models and SavedModel signatures into weightless graphs with readable names.

A traced function reads each variable through a captured resource placeholder
(``model/dense_1/MatMul/ReadVariableOp/resource``). We turn each float variable into a placeholder
named after the variable's path (``dense/kernel``), keep one copy of its value, and name each
output after its Keras or signature name, so weight and tensor names mean something to the user.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2
from tensorflow.python.framework import convert_to_constants as c2c  # its steps: tfnet edits the graph between them
from tensorflow.python.framework import tensor_util

from tfnet import graph_utils as gu
from tfnet.graph_utils import clean_node_name, consts_to_placeholders, rename_nodes, subgraph, unique_name, without_control_inputs
from tfnet.graph_utils import node_name as node_name_of
from tfnet.keras_signature import keras_call, leaf_paths
from tfnet.keras_training import PHASE, SEED, batch_norms_to_train, nested_layers, random_training_layers, switched
from tfnet.regularizers import from_variables
from tfnet.tables import embed_captured_tables


def _variable_name(var) -> str:
    path = getattr(var, "path", None)  # Keras 3 variables carry their layer path
    return path if isinstance(path, str) and path else var.name


def _tf_variable(var):
    """The tf.Variable behind a Keras 3 variable, or the variable itself."""
    inner = getattr(var, "_value", None)
    return inner if isinstance(inner, tf.Variable) else var


@dataclass
class Frozen:
    """A function as a weightless graph plus weight values.

    ``template`` holds each float variable as a ``Placeholder`` named after the variable; non-float
    variables (seeds, counters) are baked in as constants. ``weights`` lists the placeholders in
    graph order and ``values`` holds their values.
    """

    template: graph_pb2.GraphDef
    inputs: list[str]
    outputs: list[str]
    weights: list[str]
    values: dict[str, np.ndarray]
    #: The weights the source model trains (Keras's ``trainable_variables``), in graph order; None where the source
    #: records no such flags (a frozen graph, a plain SavedModel): TFNet's default selection then applies.
    trainable: list[str] | None = None
    #: ``{weight: Keras's serialized regularizer}`` for the source's variables that have one (:mod:`tfnet.regularizers`).
    regularizers: dict[str, dict] = field(default_factory=dict)
    #: The tensors of the losses the Keras model adds in its ``call`` (``activity_regularizer``, ``add_loss``), each the
    #: sum Keras's ``fit`` adds to the loss (``Trainer.compute_loss``), computed beside the outputs.
    losses: list[str] = field(default_factory=list)
    #: ``{tensor: (training value, inference value)}``: the phase tensor of a Keras model's dropout and noise layers
    #: (:mod:`tfnet.keras_training`), and the seed offsets their noise takes in training.
    phase_values: dict[str, tuple] = field(default_factory=dict)
    seed_inputs: list[str] = field(default_factory=list)
    #: ``{tensor: weight}``: the new values of a Keras model's batch-norm moving statistics, computed beside the
    #: outputs, that the training step assigns (:mod:`tfnet.keras_training`).
    updates: dict[str, str] = field(default_factory=dict)
    #: ``{id of a tf.Variable: weight}``, for the variables frozen.
    weight_of: dict[int, str] = field(default_factory=dict, repr=False)


def freeze_concrete_function(fn, variables: Iterable, output_names: Sequence[str] | None = None,
                             trainable_variables: Iterable | None = None) -> Frozen:
    """Turns a concrete function whose variables are ``variables`` into a :class:`Frozen`; where
    ``trainable_variables`` is given (the source's own flags), ``Frozen.trainable`` names those of them it holds.

    Variable reads are rewritten in place (one copy of each value, never a graph full of
    constants). A function whose variables flow into library functions or unusual resource ops
    goes through ``convert_variables_to_constants_v2`` instead.
    """
    by_handle = {id(_tf_variable(v).handle): v for v in variables}
    direct = _direct(fn, by_handle)
    graph_def, values, names = direct if direct is not None else _via_constants(fn, by_handle)
    # lookup tables (TextVectorization, StringLookup, ...): their contents go into the graph
    resources = {internal.op.name: external for external, internal in fn.graph.captures
                 if external.dtype == tf.resource and id(external) not in by_handle}
    placeholders = {n.name for n in graph_def.node if n.op == "Placeholder"}
    graph_def = embed_captured_tables(graph_def, {k: v for k, v in resources.items() if k in placeholders})
    taken = {n.name for n in graph_def.node}
    mapping: dict[str, str] = {}
    for old, var in names.items():
        new = unique_name(clean_node_name(_variable_name(var)), taken - {old})
        taken.add(new)
        mapping[old] = new
    outputs = [t.name for t in fn.outputs]
    if output_names is not None:
        for tensor, wanted in zip(list(outputs), output_names):
            node = tensor.split(":")[0]
            if wanted and tensor.endswith(":0") and node not in mapping:
                new = unique_name(clean_node_name(wanted), taken - {node})
                taken.add(new)
                mapping[node] = new
    graph_def = rename_nodes(graph_def, mapping)
    outputs = [mapping.get(t.split(":")[0], t.split(":")[0]) + ":" + t.split(":")[1] for t in outputs]
    inputs = [t.name for t in fn.inputs[: len(fn.inputs) - len(fn.captured_inputs)]]
    values = {mapping[k]: v for k, v in values.items()}
    weights = [n.name for n in graph_def.node if n.name in values]
    trainable = None
    if trainable_variables is not None:
        ids = {id(_tf_variable(v)) for v in trainable_variables}
        chosen = {mapping[old] for old, var in names.items() if id(_tf_variable(var)) in ids}
        trainable = [w for w in weights if w in chosen]
    regularizers = from_variables({mapping[old]: var for old, var in names.items()})
    frozen = Frozen(graph_def, inputs, outputs, weights, values, trainable, regularizers)
    frozen.weight_of = {id(_tf_variable(var)): mapping[old] for old, var in names.items()}
    return frozen


def _is_float(dtype) -> bool:
    return tf.as_dtype(dtype).is_floating


def _direct(fn, by_handle):
    """Rewrites variable reads of ``fn``'s graph to placeholders. None when unsupported."""
    graph_def = fn.graph.as_graph_def()
    for f in graph_def.library.function:
        if any(a.type == types_pb2.DT_RESOURCE for a in f.signature.input_arg):
            return None
    handles: dict[str, Any] = {}  # placeholder node -> variable
    consts: dict[str, Any] = {}  # placeholder node -> captured non-variable value
    for external, internal in fn.graph.captures:
        var = by_handle.get(id(external))
        if var is not None:
            handles[internal.op.name] = var
        elif external.dtype != tf.resource:
            consts[internal.op.name] = external
        elif not _reads_a_table(internal):
            return None  # another resource (a variable not among `variables`): TensorFlow's own freezing
        # a lookup table stays a placeholder here: embed_captured_tables fills it in
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    values: dict[str, np.ndarray] = {}
    names: dict[str, Any] = {}
    baked: set[str] = set()  # handles of non-float variables, made constants
    for node in graph_def.node:
        data_inputs = [i for i in node.input if not i.startswith("^")]
        reads = [i for i in data_inputs if i.split(":")[0] in handles]
        if node.name in handles:
            var = handles[node.name]
            value = np.array(_tf_variable(var).numpy(), copy=True)
            if _is_float(value.dtype):
                new = out.node.add()
                new.name = node.name
                new.op = "Placeholder"
                new.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
                new.attr["shape"].shape.CopyFrom(tf.TensorShape(value.shape).as_proto())
                values[node.name] = value
                names[node.name] = var
            else:
                _const(out, node.name, value)
                baked.add(node.name)
        elif node.name in consts:
            _const(out, node.name, np.asarray(consts[node.name]))
        elif not reads:
            out.node.add().CopyFrom(node)
        elif node.op == "ReadVariableOp" and len(data_inputs) == 1:
            new = out.node.add()
            new.CopyFrom(node)
            new.op = "Identity"
            new.ClearField("attr")
            new.attr["T"].type = node.attr["dtype"].type
        elif node.op in _ASSIGNS and data_inputs[0].split(":")[0] in baked:
            # a seed generator's state moving on (Keras's random layers, dropout in RNN cells): baked into the graph,
            # it stays as it was, which inference (training=False) never reads; the op's dependants keep waiting on it
            new = out.node.add()
            new.CopyFrom(node)
            _as_noop(new)
        elif node.op == "ResourceGather" and data_inputs[0] in reads and len(reads) == 1:
            axis = _const(out, node.name + "/axis", np.array(0, np.int32))
            new = out.node.add()
            new.name = node.name
            new.op = "GatherV2"
            new.input.extend([data_inputs[0], data_inputs[1], axis])
            new.input.extend(i for i in node.input if i.startswith("^"))
            new.attr["Tparams"].type = node.attr["dtype"].type
            new.attr["Tindices"].type = node.attr["Tindices"].type
            new.attr["Taxis"].type = types_pb2.DT_INT32
            new.attr["batch_dims"].i = node.attr["batch_dims"].i
        else:
            return None  # another op takes the variable handle itself
    return out, values, names


_ASSIGNS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def _reads_a_table(handle) -> bool:
    """Whether lookup-table ops (and only they) use the captured resource ``handle``."""
    kinds = {c.type for c in handle.consumers()}
    return bool(kinds) and all(k.startswith("LookupTable") for k in kinds)


def _const(graph_def, name: str, value: np.ndarray) -> str:
    node = graph_def.node.add()
    node.name = name
    node.op = "Const"
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))
    return name


def _via_constants(fn, by_handle):
    """The general path: TensorFlow's own freezing, then float constants back to placeholders."""
    # Keep While / If functional: lowered to v1 control flow, loops only differentiate with their
    # contexts rebuilt in graph mode (tfnet.v1_loops), which costs a second forward pass.
    # convert_variables_to_constants_v2 in its three steps, so that an assignment to a variable it made a constant (a
    # seed generator's state, in an RNN cell with dropout) becomes a NoOp before the graph is pruned
    data = c2c._FunctionConverterDataInEager(func=fn, lower_control_flow=False, aggressive_inlining=False)
    graph_def, converted = c2c._replace_variables_by_constants(converter_data=data)
    _assignments_to_constants_as_noops(graph_def)
    # TensorFlow's third step imports the GraphDef into a concrete function again to prune it (5.3 of from_keras's
    # 9.4 CPU-s for ResNet-50, train_batch_norm=True, Zen 3): the same pruning on the GraphDef, from the outputs back
    made = {fn.graph.internal_captures[i].op.name for i in converted}  # captured values made constants: not fed
    graph_def = subgraph(graph_def, [t.name for t in fn.outputs], feeds=[t.name for t in fn.inputs if t.op.name not in made])
    nodes = {n.name: n for n in graph_def.node}
    names = {}
    for external, internal in fn.graph.captures:
        var = by_handle.get(id(external))
        node = nodes.get(internal.op.name)
        if var is not None and node is not None and node.op == "Const" and _is_float(node.attr["dtype"].type):
            names[internal.op.name] = var
    template, values = consts_to_placeholders(graph_def, list(names))
    return template, values, names


def _as_noop(node) -> None:
    """In place: ``node`` becomes a NoOp of the same name with the same control inputs (what waited on it still does)."""
    name, controls = node.name, [i for i in node.input if i.startswith("^")]
    node.Clear()
    node.name, node.op = name, "NoOp"
    node.input.extend(controls)


def _assignments_to_constants_as_noops(graph_def) -> None:
    """In place: each assignment whose variable is now a constant (or, in a library function, an argument that is no
    longer a resource) becomes a NoOp with the same control inputs. Inference never reads what it would write."""
    consts = {n.name for n in graph_def.node if n.op == "Const"}
    for node in graph_def.node:
        if node.op in _ASSIGNS and node.input[0].split(":")[0] in consts:
            _as_noop(node)
    for fn in graph_def.library.function:
        plain = {a.name for a in fn.signature.input_arg if a.type != types_pb2.DT_RESOURCE}
        plain |= {n.name for n in fn.node_def if n.op == "Const"}
        for node in fn.node_def:
            if node.op in _ASSIGNS and node.input[0].split(":")[0] in plain:
                _as_noop(node)


def load_keras_file(path) -> Any:
    """A Keras model from a ``.keras`` or ``.h5`` file (not compiled: tfnet takes the weights).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        GraphLoadError: Keras cannot read it; a SavedModel folder is named as such.
    """
    import os

    import keras

    from tfnet.errors import GraphLoadError

    path = os.fsdecode(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No Keras model file at {path!r}.")
    if os.path.isdir(path):
        hint = ("it is a SavedModel folder: use TFNet.from_saved_model(path)" if os.path.exists(
            os.path.join(path, "saved_model.pb")) else "it is a folder")
        raise GraphLoadError(f"TFNet.from_keras takes a Keras model or a .keras / .h5 file; {path!r} is not one: {hint}.")
    try:
        return keras.models.load_model(path, compile=False)
    except Exception as exc:  # Keras raises ValueError, OSError, zipfile errors ... for a file it cannot read
        raise GraphLoadError(f"Keras could not load {path!r} as a model ({type(exc).__name__}: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}). TFNet.from_keras reads "
                             "the .keras and .h5 files that model.save() writes; for a SavedModel folder use "
                             "TFNet.from_saved_model.") from exc


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


def freeze_keras(model, input_signature=None, train_batch_norm: bool = False) -> Frozen:
    """Freezes a built Keras 3 model in inference mode (``training=False``), on its inputs or, for a subclassed
    model, on ``input_signature`` or the shapes of its first call (:mod:`tfnet.keras_signature`). Its dropout and
    noise layers, and with ``train_batch_norm`` its trainable batch norm, are switched to training mode where the
    phase tensor says (:mod:`tfnet.keras_training`).

    Besides renaming weights and outputs, each top-level layer's output node is renamed to the
    layer's name where that is free, so ``net.cut("global_average_pooling2d")`` works.
    """
    import keras

    signature = keras_call(model, input_signature)
    outputs_flat = tf.nest.flatten(getattr(model, "outputs", None) or []) if input_signature is None else []
    layers = _layer_outputs(model) if outputs_flat else []
    probe = model
    if layers:
        try:
            probe = keras.Model(model.inputs, outputs_flat + [o for _, o in layers])
        except (ValueError, TypeError):
            probe, layers = model, []
    structure = []  # what the model returns: a subclassed model's dict of outputs names them
    added = []  # how many losses the call adds (activity_regularizer, add_loss)
    noisy = random_training_layers(model)  # dropout and noise: in training mode where the phase says (keras_training)
    norms = batch_norms_to_train(model) if train_batch_norm else []
    updates = []  # (moving statistic, its new value)

    def call(*xs):
        updates.clear()
        with switched(noisy, norms, updates):
            out = probe(*signature.arguments(xs), training=False)
        structure[:] = [out]
        terms = _added_losses(probe)
        added[:] = [len(terms)]
        return tf.nest.flatten(out) + [tf.identity(t) for t in terms] + [tf.identity(t) for _, t in updates]

    try:
        try:
            fn = tf.function(call, autograph=False).get_concrete_function(*signature.specs)
        except tf.errors.OperatorNotAllowedInGraphError:
            # a layer with Python control flow over tensors (RandomCrop's): traced as Keras's own fit traces it, with
            # AutoGraph; a plain graph otherwise, which keeps Python-level branches out of the frozen graph
            fn = tf.function(call, autograph=True).get_concrete_function(*signature.specs)
    except (ValueError, TypeError, tf.errors.OpError) as exc:
        if not signature.from_signature:
            raise
        raise signature.call_failure(model, exc) from None  # Keras's line, not TensorFlow's tracing frames
    n_losses, n_updates = added[0], len(updates)
    n_out = len(fn.outputs) - len(layers) - n_losses - n_updates
    names = _output_names(model, n_out, structure[0] if structure and not layers else None)
    loss_names = [f"added_loss_{i}" for i in range(n_losses)]
    update_names = [f"keras_update_{i}" for i in range(n_updates)]
    # Keras's trainable flags come along: a layer or nested model with trainable = False, a LoRA layer's base kernel
    frozen = freeze_concrete_function(fn, model.variables, names + [""] * len(layers) + loss_names + update_names,
                                      trainable_variables=model.trainable_variables)
    if layers:
        frozen.template = _name_layer_outputs(frozen.template, frozen.outputs[n_out:n_out + len(layers)],
                                              [n for n, _ in layers])
    extra = frozen.outputs[n_out + len(layers):]
    frozen.losses = extra[:n_losses]
    frozen.updates = {t: frozen.weight_of[id(_tf_variable(v))] for t, (v, _) in zip(extra[n_losses:], updates)}
    if updates:  # the switches read the statistics before the scale: the weights in Keras's order (model.variables)
        _order_weights(frozen, [frozen.weight_of.get(id(_tf_variable(v))) for v in model.variables])
    frozen.outputs = frozen.outputs[:n_out]
    # a traced function's results wait on all its reads: a term needs only what it is computed from
    frozen.template = without_control_inputs(frozen.template, [node_name_of(t) for t in extra])
    used = {n.name for n in subgraph(frozen.template, frozen.outputs + extra).node}
    if PHASE in used:
        frozen.phase_values = {f"{PHASE}:0": (True, False)}
        frozen.seed_inputs = [f"{SEED}:0"] if SEED in used else []
    return frozen


def _order_weights(frozen: Frozen, order: list) -> None:
    """``frozen``'s weight placeholders (and ``weights``) in ``order`` where it names them, in place."""
    weights = set(frozen.weights)
    order = [w for w in order if w in weights]
    chosen = set(order)
    frozen.weights = order + [w for w in frozen.weights if w not in chosen]
    gu.reorder_nodes(frozen.template, order)


def _added_losses(model) -> list:
    """The losses the traced call added (``activity_regularizer``'s, ``add_loss``'s), each as Keras's ``fit`` adds it
    (``Trainer._aggregate_additional_loss``: cast to float where it is not, summed). ``model.losses`` holds them,
    then the trainable weights' regularizers, which tfnet adds itself (:mod:`tfnet.regularizers`); read without the
    latter where Keras's layers say (``_get_own_losses``, what ``losses`` reads), so the frozen graph does not compute
    them."""
    import keras

    if callable(getattr(model, "_flatten_layers", None)) and callable(getattr(model, "_get_own_losses", None)):
        # the model's own first, then its nested layers', as model.losses reads them
        terms = [t for layer in nested_layers(model, include_self=True) for t in layer._get_own_losses()]
    else:
        regularized = sum(1 for v in model.trainable_weights if getattr(v, "regularizer", None) is not None)
        losses = list(model.losses)
        terms = losses[:max(len(losses) - regularized, 0)]
    return [tf.reduce_sum(t if t.dtype.is_floating else tf.cast(t, keras.config.floatx())) for t in terms]


def _output_names(model, n_out: int, returned=None) -> list[str]:
    """The outputs' names: the keys of a Functional model's dict of outputs (``keras.Model(inputs, {"score": s,
    "vec": v})``: what its ``compile`` and ``fit`` key losses, metrics and labels by, and the history's
    ``score_loss``), else the model's ``output_names`` (functional models), else the name of the
    layer that makes each output (a ``Sequential`` model's last layer), else the keys of a dict the model
    returned (a subclassed model's), else ``output_<i>`` (as Keras's ``model.export`` names them)."""
    try:
        structure = model.output if getattr(model, "outputs", None) else None
    except (AttributeError, ValueError):  # a layer never called, or called on several inputs
        structure = None
    if isinstance(structure, dict) and not any(isinstance(v, (dict, list, tuple)) for v in structure.values()):
        names = _keys_of(structure, n_out)
        if names:
            return names
    names = list(getattr(model, "output_names", None) or [])
    if len(names) == n_out:
        return names
    outputs = tf.nest.flatten(getattr(model, "outputs", None) or [])
    names = []
    for tensor in outputs:
        history = getattr(tensor, "_keras_history", None)
        layer = getattr(history, "operation", None) if history is not None else None
        names.append(getattr(layer, "name", None))
    if len(names) == n_out and all(names) and len(set(names)) == n_out:
        return names
    if isinstance(returned, dict):
        names = _keys_of(returned, n_out)
        if names:
            return names
    return [f"output_{i}" for i in range(n_out)]


def _keys_of(outputs: dict, n_out: int) -> list[str] | None:
    """A dict of outputs' keys as node names, in ``tf.nest.flatten``'s order (sorted, as the frozen outputs are); None
    unless they name the ``n_out`` outputs one each."""
    names = [clean_node_name(path) for path, _ in leaf_paths(outputs)]
    return names if len(names) == n_out and len(set(names)) == n_out else None


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
        if nodes[src_node].op in ("Placeholder", "Const") or nodes[src_node].op == "Identity" and \
                nodes[node_name_of(nodes[src_node].input[0])].op == "Placeholder":
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


def freeze_signature(loaded, signature: str) -> Frozen:
    """Freezes one signature of a ``tf.saved_model.load``-ed object.

    Inputs are named after the signature's argument names and outputs after its output keys.
    """
    fn = loaded.signatures[signature]
    out_struct = fn.structured_outputs
    if isinstance(out_struct, dict):
        out_names = list(tf.nest.flatten({k: k for k in out_struct}))
    else:
        out_names = [f"output_{i}" for i in range(len(tf.nest.flatten(out_struct)))]
    # a Keras export (model.export) records Keras's trainable flags as the object's trainable_variables
    recorded = getattr(loaded, "trainable_variables", None)
    recorded = list(recorded) if isinstance(recorded, (list, tuple)) else None
    return freeze_concrete_function(fn, trackable_variables(loaded), out_names, trainable_variables=recorded)


def trackable_variables(root) -> list:
    """Every tf.Variable reachable from a trackable object (a loaded SavedModel, say)."""
    found = {}
    for obj in tf.train.TrackableView(root).descendants():
        if isinstance(obj, tf.Variable):
            found[id(obj)] = obj
    return list(found.values())
