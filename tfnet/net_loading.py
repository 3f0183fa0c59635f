"""Building a :class:`tfnet.TFNet`: from a frozen graph (the constructor, :func:`from_frozen_graph`),
a Keras model, a SavedModel, an export folder (what ``save`` writes) or an ONNX model.

``TFNet``'s constructors are these functions, as classmethods: each takes the class to build (``cls``). Each
turns its source into a weightless graph (weights as placeholders) and the weights' values, :func:`build`
makes the net's :class:`tfnet.net_state.NetState` from those, and ``cls.from_state`` the net.
``TFNet.__init__`` is :func:`graph_def_state`. The readers live in :mod:`tfnet.freeze`, :mod:`tfnet.saving`
and :mod:`tfnet.onnx.build`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tensorflow.core.framework import graph_pb2

from tfnet import graph_utils as gu
from tfnet import keras_source
from tfnet.errors import InputSpecError, TensorNameError, unknown_name_message
from tfnet.freeze import freeze_keras, load_keras_file
from tfnet.graph_function import check_weight_consts, feed_specs
from tfnet.graph_io import PathLike, read_graph_def
from tfnet.inputs import as_name_list
from tfnet.net_state import NetState
from tfnet.onnx.build import net_from_onnx
from tfnet.parts import NetParts
from tfnet.saving import load_saved_model_signature, read_export_folder
from tfnet.statistics import find_statistics
from tfnet.tables import canonical_tables

__all__ = [
    "build", "from_export_folder", "from_frozen_graph", "from_keras", "from_onnx", "from_saved_model",
    "graph_def_state",
]


def graph_def_state(graph_def: PathLike | bytes | graph_pb2.GraphDef, inputs: str | Sequence[str],
                    outputs: str | Sequence[str], weights: str | Sequence[str] = "auto", **options) -> NetState:
    """``TFNet.__init__``: the state of a net from a frozen graph (see :class:`tfnet.TFNet` for the arguments;
    ``options`` are its keyword arguments but ``weights``)."""
    graph_def = canonical_tables(read_graph_def(graph_def))
    input_names = gu.check_tensor_names(graph_def, as_name_list(inputs, "inputs"), "input")
    output_names = gu.check_tensor_names(graph_def, as_name_list(outputs, "outputs"), "output")
    input_nodes = {gu.node_name(n) for n in input_names}
    if isinstance(weights, str) and weights == "auto":
        weight_names = [w for w in gu.find_weights(graph_def) if w not in input_nodes]
    else:
        weight_names = check_weight_consts(graph_def, weights)
    template, values = gu.consts_to_placeholders(graph_def, weight_names)
    del graph_def
    return build(template, values, input_names, output_names, **_init_kwargs(options))


def build(template, values, input_names, output_names, *, trainable=None, relax_batch=True, fold=True,
          phase_values=None, name="tfnet", losses=(), seed_inputs=(), seed_step=0, updates=None) -> NetState:
    """The state of a net from a weightless graph (weights as placeholders) and their values."""
    phase_values = _check_phase_values(template, phase_values, input_names)
    losses = gu.check_tensor_names(template, as_name_list(losses, "losses"), "loss") if losses else []
    updates = _check_updates(template, updates, values)
    seed_inputs = gu.check_tensor_names(template, as_name_list(seed_inputs, "seed_inputs"), "seed") if seed_inputs else []
    feeds = list(input_names) + list(phase_values)
    template = gu.subgraph(template, list(output_names) + losses + list(updates), feeds=feeds,
                           feed_specs=feed_specs(template, feeds))
    kept = gu.nodes_by_name(template)
    values = {w: v for w, v in values.items() if w in kept}
    statistics = find_statistics(template, list(values))
    for weight in updates.values():  # what the step assigns is a statistic, not trained by gradients
        statistics.setdefault(weight, "statistic")
    if relax_batch:
        gu.set_placeholder_batch_dim(template, input_names)
    state = NetState(NetParts(template, input_names, output_names, values, statistics, name=name, fold=fold,
                              phase_values=phase_values, losses=losses, seed_inputs=seed_inputs, seed_step=seed_step,
                              updates=updates))
    if trainable is not None:
        state.select_trainable(trainable)
    return state


def _frozen_state(frozen, kwargs) -> NetState:
    """From a :class:`tfnet.freeze.Frozen` (a weightless graph and its weight values)."""
    if frozen.trainable is not None and frozen.weights and "trainable" not in kwargs:
        kwargs = {**kwargs, "trainable": frozen.trainable}  # the source model's own flags (trainable_variables)
    if frozen.losses and "losses" not in kwargs:
        kwargs = {**kwargs, "losses": frozen.losses}  # what the Keras model's call adds to its loss
    if frozen.updates and "updates" not in kwargs:
        kwargs = {**kwargs, "updates": frozen.updates}  # a Keras model's batch norm's moving statistics
    if frozen.phase_values:  # a Keras model's dropout and noise layers, in training mode while training
        kwargs = {**kwargs, "phase_values": {**frozen.phase_values, **(kwargs.get("phase_values") or {})},
                  "seed_inputs": frozen.seed_inputs}
    inputs = gu.check_tensor_names(frozen.template, frozen.inputs, "input")
    outputs = gu.check_tensor_names(frozen.template, frozen.outputs, "output")
    state = build(frozen.template, frozen.values, inputs, outputs, **_init_kwargs(kwargs))
    state.keep_regularizers(frozen.regularizers)
    return state


def from_frozen_graph(
    cls,
    path_or_graph_def: PathLike | bytes | graph_pb2.GraphDef,
    inputs: str | Sequence[str],
    outputs: str | Sequence[str],
    **kwargs,
):
    """Loads a frozen graph (``.pb`` binary or ``.pbtxt`` text file, bytes or a ``GraphDef``).

    Args:
        path_or_graph_def: The graph.
        inputs: Input tensor name(s), ``"name"`` or ``"name:0"``.
        outputs: Output tensor name(s).
        **kwargs: ``weights``, ``trainable``, ``relax_batch``, ``name``; see :class:`TFNet`.

    Raises:
        FileNotFoundError: The file does not exist.
        GraphLoadError: The file is corrupt, truncated, or not a graph.
        TensorNameError: A name is not in the graph; the message lists the closest names.
    """
    return cls(path_or_graph_def, inputs, outputs, **kwargs)


def from_keras(cls, model, *, input_signature=None, train_batch_norm: bool = False, **kwargs):
    """Freezes a built Keras 3 model in inference mode and wraps it.

    Weights are named by their Keras paths (``"dense/kernel"``), inputs by the Keras input
    names and outputs by the output layer names (a ``Sequential`` model's output by its last
    layer's name). Batch norm uses its moving statistics, which are frozen by default. Dropout and noise layers
    act in the training step, as Keras's ``fit`` runs them (:mod:`tfnet.keras_training`: the phase tensor
    ``keras_training:0`` in :attr:`phase_values`), and nowhere else. Lookup tables (``TextVectorization``,
    ``StringLookup``, ``IntegerLookup``) are kept in the graph with their contents (see :mod:`tfnet.tables`).

    A subclassed model (its own ``call``) has no symbolic inputs: it is frozen on ``input_signature``, or else on
    the shapes Keras recorded when it was first called (its first argument, in ``model.input_dtype``, as
    ``model.export`` infers them). Its inputs are named after ``call``'s arguments (or the keys of a dict, or the
    specs' own names), its outputs ``output_0``, ... (or the keys of a dict it returns).

    Args:
        model: A built ``keras.Model``, or the path of a saved one (a ``.keras`` file or a legacy
            ``.h5`` file, loaded with ``keras.models.load_model(path, compile=False)``).
        input_signature: One entry per positional argument of the model's ``call``: a ``tf.TensorSpec`` or
            ``keras.InputSpec`` with a shape and dtype, or a dict, list or tuple of them; as
            ``model.export(input_signature=...)`` takes it. Needed for a subclassed model with several inputs or
            integer ones. Default: the model's own inputs.
        train_batch_norm: Train the model's trainable ``BatchNormalization`` layers as Keras's ``fit`` does: in the
            training step, normalized by each batch's statistics, their moving statistics updated
            (:attr:`TFNet.updates`); elsewhere, by the moving statistics. ``TFOptimizer.from_keras`` asks for it.
            Default: False (batch norm in inference mode everywhere).
        **kwargs: ``trainable``, ``relax_batch``, ``fold_batch_norm``, ``losses`` (default: the losses the model adds
            in its ``call``; ``[]`` for none), ``name``; see :class:`TFNet`.

    Raises:
        FileNotFoundError: a path that does not exist.
        GraphLoadError: a path Keras cannot load (a SavedModel folder: use :meth:`from_saved_model`).
        InputSpecError: a subclassed model never called and without ``input_signature``, or one whose ``call``
            takes more inputs than the signature gives.
    """
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model = load_keras_file(model)
    state = _frozen_state(freeze_keras(model, input_signature, train_batch_norm), kwargs)
    state.keras_source = keras_source.describe(model)
    return cls.from_state(state)


def from_saved_model(cls, path: PathLike, signature: str = "serving_default", **kwargs):
    """Loads one signature of a SavedModel, freezing its variables into weights.

    Inputs are the signature's argument names, outputs its output keys.

    Args:
        path: The SavedModel folder.
        signature: The signature to load. Default: ``"serving_default"``.
        **kwargs: ``trainable``, ``relax_batch``, ``fold_batch_norm``, ``phase_values``, ``name``;
            see :class:`TFNet`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        GraphLoadError: ``path`` is not a SavedModel.
        TensorNameError: ``signature`` does not exist; the message lists the signatures.
    """
    return cls.from_state(_frozen_state(load_saved_model_signature(path, signature), kwargs))


def from_export_folder(cls, folder: PathLike, *, storage_options=None, **kwargs):
    """Loads the Analytics Zoo export layout: ``frozen_inference_graph.pb`` plus
    ``graph_meta.json`` with ``input_names`` and ``output_names``. Folders written by
    :meth:`save` also restore the weight list and the trainable selection. ``folder`` may be a
    URI fsspec understands (``s3://bucket/run/export``), with its ``storage_options``.

    Args:
        folder: The export folder, a local path or a URI.
        storage_options: fsspec's options for a URI. Default: None.
        **kwargs: What :class:`TFNet` takes; they override what the folder's metadata says.
    """
    graph_def, meta = read_export_folder(folder, storage_options)
    extra = meta.get("tfnet", {})
    if "weight_names" in extra:
        kwargs.setdefault("weights", extra["weight_names"])
    if extra.get("phase_values"):
        kwargs.setdefault("phase_values", {k: tuple(v) for k, v in extra["phase_values"].items()})
    if extra.get("loss_names"):
        kwargs.setdefault("losses", extra["loss_names"])
    if extra.get("updates"):
        kwargs.setdefault("updates", extra["updates"])
    if extra.get("seed_inputs"):
        kwargs.setdefault("seed_inputs", extra["seed_inputs"])
    net = cls(graph_def, meta["input_names"], meta["output_names"], **kwargs)
    if "trainable" in extra and "trainable" not in kwargs:
        # exactly the named weights that exist train (statistics too, if named)
        net.state.set_trainable_names([t for t in extra["trainable"] if t in net.state.weights])
    net.keras_source = extra.get("keras_source")
    net.state.keep_regularizers(extra.get("regularizers", {}))
    if net.state.seed_step is not None:
        net.state.seed_step.assign(int(extra.get("seed_step", 0)))
    return net


def from_onnx(
    cls,
    path_or_model_proto,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    **kwargs,
):
    """Converts an ONNX model (for example one from ``torch.onnx.export``) into a TFNet.

    The ONNX initializers become the weights, named by their ONNX names (characters TensorFlow
    does not allow become ``_``); ``BatchNormalization`` means and variances are statistics,
    frozen by default. Convolutions run in NHWC. The batch dimension is dynamic (inputs that fix
    different leading sizes are not a batch: they keep their shapes). Models of old opsets are
    upgraded with ``onnx.version_converter``. Needs ``pip install tfnet[onnx]``; see :mod:`tfnet.onnx`.

    Args:
        path_or_model_proto: A ``.onnx`` file (external data next to it), its bytes, or an
            ``onnx.ModelProto``.
        inputs: ONNX graph input names in the order the net takes them. Default: all of them.
        outputs: ONNX value names to return; any value in the graph can be one. Default: the
            graph outputs.
        **kwargs: ``trainable``, ``relax_batch``, ``fold_batch_norm``, ``name``; see
            :class:`TFNet`. ``propagate_layout=False`` turns off keeping NHWC through element-wise ops.

    Raises:
        FileNotFoundError: the file does not exist.
        tfnet.onnx.OnnxLoadError: the file is corrupt, truncated or not ONNX.
        tfnet.onnx.OpsetError: the opset is newer than the installed onnx defines, or the model has no
            default-domain opset.
        tfnet.onnx.UnsupportedOperatorError: lists every node tfnet cannot convert (operator,
            version and count; docs/onnx.md has the versions that convert).
        tfnet.onnx.ExternalDataError: an external data file is missing.
    """
    return net_from_onnx(cls, path_or_model_proto, inputs, outputs, **kwargs)


def _init_kwargs(kwargs) -> dict:
    """Maps the public keyword arguments onto ``_init``'s, refusing unknown ones."""
    allowed = {"trainable": "trainable", "relax_batch": "relax_batch", "fold_batch_norm": "fold", "name": "name",
               "phase_values": "phase_values", "losses": "losses", "seed_inputs": "seed_inputs", "updates": "updates"}
    unknown = set(kwargs) - set(allowed)
    if unknown:
        raise TypeError(f"Unknown arguments {sorted(unknown)}; expected some of {sorted(allowed)}.")
    return {allowed[k]: v for k, v in kwargs.items()}


def _check_updates(template, updates, values) -> dict[str, str]:
    """``{tensor: weight}`` checked: each tensor in the graph, each weight one of the net's."""
    if not updates:
        return {}
    if not isinstance(updates, Mapping):
        raise InputSpecError("`updates` takes a dict {tensor name: weight name}: the tensor the training step assigns "
                             f"to the weight after each step. Received: {type(updates).__name__}")
    tensors = gu.check_tensor_names(template, list(updates), "update")
    checked = {}
    for tensor, weight in zip(tensors, updates.values()):
        if weight not in values:
            raise TensorNameError(unknown_name_message("weight", str(weight), list(values)))
        checked[tensor] = weight
    return checked


def _check_phase_values(template, phase_values, input_names) -> dict[str, tuple]:
    """Normalises ``{tensor: (training value, inference value)}``; the tensors must exist and not
    be inputs."""
    if phase_values is None:
        return {}
    if not isinstance(phase_values, Mapping):
        raise TypeError(
            "`phase_values` takes a dict {tensor name: (training value, inference value)}. "
            f"Received: {type(phase_values).__name__}"
        )
    out = {}
    for raw, pair in phase_values.items():
        (name,) = gu.check_tensor_names(template, [raw], "phase")
        if name in input_names:
            raise InputSpecError(f"{raw!r} is an input; a phase tensor is fed by tfnet, not by the caller.")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InputSpecError(
                f"phase_values[{raw!r}] must be a pair (training value, inference value). Received: {pair!r}"
            )
        out[name] = tuple(pair)
    return out
