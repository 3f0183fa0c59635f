"""A weightless GraphDef as a pure function ``(inputs, weights) -> outputs``.

:class:`GraphFunction` owns the graph with weights as placeholders (the *template*), learns the
dtypes and shapes of its inputs, outputs and weights, and imports the graph into whichever
``tf.function`` is being traced. It knows nothing of variables, hooks or training.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfnet import graph_utils as gu
from tfnet import kernels, remapper_guard
from tfnet.call_options import with_cpu_call_options
from tfnet.errors import (
    GraphLoadError,
    InputSpecError,
    TensorNameError,
    first_line,
    unknown_name_message,
)
from tfnet.fold import fold_affine
from tfnet.inputs import as_name_list
from tfnet.keras_training import has_switches, inference_graph, training_graph
from tfnet.library import register_library
from tfnet.tables import TableSet


class GraphFunction:
    """The graph as a function of inputs and weights.

    Args:
        template: The GraphDef, each weight a ``Placeholder`` named after the weight.
        input_names: Input tensor names (``"name:0"``), fed through ``input_map``.
        output_names: Output tensor names.
        weight_names: The weight placeholders' node names.
        fold: Fold inference-mode batch norm into the preceding convolution or matmul in the graph
            that runs (see :mod:`tfnet.fold`). The template itself is unchanged. Default: True.
        phase_values: ``{tensor name: (training value, inference value)}``: tensors (an
            ``is_training`` or ``keep_prob`` placeholder) fed a fixed value per mode. Default: none.
        loss_names: Tensors computed beside the outputs when asked for (``losses=True``): the losses a
            training loss adds (a Keras model's ``add_loss``). Default: none.
        seed_inputs: Tensors fed the ``seed`` given in training (:mod:`tfnet.keras_training`). Default: none.
        updates: ``{tensor: weight}``: tensors computed beside the outputs when asked for (``updates=True``) that
            the training step assigns to those weights (a Keras batch norm's moving statistics). Default: none.
    """

    def __init__(
        self,
        template: graph_pb2.GraphDef,
        input_names: Sequence[str],
        output_names: Sequence[str],
        weight_names: Sequence[str],
        fold: bool = True,
        phase_values: Mapping[str, tuple] | None = None,
        loss_names: Sequence[str] = (),
        seed_inputs: Sequence[str] = (),
        updates: Mapping[str, str] | None = None,
    ):
        self.template = template
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.loss_names = tuple(loss_names)
        self.seed_inputs = tuple(seed_inputs)
        self.updates = dict(updates or {})
        self.update_names = tuple(self.updates)
        computed = list(self.output_names) + list(self.loss_names) + list(self.update_names)
        self.weight_names = tuple(weight_names)
        self.fold = fold
        self.phase_values = dict(phase_values or {})
        fed_names = list(input_names) + list(self.phase_values)
        _check_unfed_placeholders(template, fed_names, computed, weight_names)
        graph = import_for_shapes(template)
        self.phase_specs = {n: _spec(graph, n) for n in self.phase_values}
        for n, spec in self.phase_specs.items():
            for value in self.phase_values[n]:
                _check_phase_value(n, value, spec)
        self.input_specs = tuple(_spec(graph, n) for n in input_names)
        self.output_specs = tuple(_spec(graph, n) for n in output_names)
        _check_losses(self.loss_names, [_spec(graph, n) for n in self.loss_names])
        self.weight_specs = tuple(_spec(graph, w + ":0") for w in weight_names)
        _check_updates(self.updates, graph, dict(zip(weight_names, self.weight_specs)))
        runs, runs_graph = template, graph
        fed_phases = {gu.node_name(n) for n in self.phase_values}
        if has_switches(template, fed_phases):  # a switch whose phase nobody feeds is always at inference: taken out
            runs = inference_graph(template, fed=fed_phases)
            runs_graph = import_for_shapes(runs)
        self.compute_template, self.folded, self.rewritten_convolutions, self.guarded_biases = _runnable(
            runs, runs_graph, fold, fed_names, weight_names, computed)
        # lookup tables: built once, their handles fed in place of the table nodes (tfnet.tables)
        self.tables = TableSet(self.compute_template)
        self.compute_template = self.tables.graph
        #: The graph inference runs where a Keras batch norm is switched to training mode in training
        #: (:mod:`tfnet.keras_training`): the switches replaced by their inference branch, so the batch norm folds as
        #: before; None where the compute template serves both.
        self.inference_template = None
        if self.updates and not self.tables and has_switches(template):
            plain = inference_graph(template)
            self.inference_template, self.folded, _, _ = _runnable(
                plain, import_for_shapes(plain), fold, fed_names, weight_names, computed)
        # where gradients are taken, a Pad that a Conv3D reads as a PadV2 of zero (tfnet.remapper_guard: the pass
        # deletes it though the gradient reads it); a forward pass keeps the Pad, which the pass fuses there
        self.gradient_template, self.guarded_pads = remapper_guard.rewrite_pads(self.compute_template)
        #: ``(compute, gradient)``: the templates the training step runs where a switched batch norm's inference
        #: output is read only by its switch's inference branch (:func:`tfnet.keras_training.training_graph`: left
        #: unread, not computed); None where the compute and gradient templates serve training too.
        self.training_templates = None
        trained = {gu.node_name(n) for n, values in self.phase_values.items()
                   if self.phase_specs[n].dtype == tf.bool and bool(values[0])}
        if self.updates and (compute := training_graph(self.compute_template, trained)) is not None:
            gradient = compute if self.gradient_template is self.compute_template else (
                training_graph(self.gradient_template, trained) or self.gradient_template)
            self.training_templates = (compute, gradient)
        register_library(self.compute_template)
        self.v1_loops = gu.v1_loop_nodes(self.compute_template)
        if self.v1_loops and self.tables:
            raise GraphLoadError("This graph has both TF1 control-flow loops and lookup tables, which tfnet does not "
                                 "run together; export the loops as functional While ops (TF2 control flow).")
        self._input_map_keys = self.input_names + tuple(w + ":0" for w in weight_names)

    def __call__(
        self, inputs: Sequence[tf.Tensor], weights: Sequence[tf.Tensor], training: bool = False,
        differentiated: bool = False, losses: bool = False, seed: tf.Tensor | None = None, updates: bool = False,
    ) -> list[tf.Tensor]:
        """Imports the graph into the function being traced, wired to ``inputs`` and ``weights``,
        with each phase tensor fed its training or inference value (and in training, each of :attr:`seed_inputs`
        ``seed``, where given): the outputs, then with ``losses`` the :attr:`loss_names` tensors, then with
        ``updates`` the :attr:`update_names` tensors.

        Must run while a graph is being built (inside ``tf.function``). The imported ops are
        created below the Python op layer, so differentiate them with ``tf.gradients`` inside the
        function, or call the enclosing ``tf.function`` under a tape. ``differentiated``: gradients will be taken
        of it (the :attr:`gradient_template`, see :mod:`tfnet.remapper_guard`).
        """
        input_map = dict(zip(self._input_map_keys, list(inputs) + list(weights)))
        input_map.update(self.tables.feeds())
        for name, values in self.phase_values.items():
            input_map[name] = tf.constant(values[0 if training else 1], dtype=self.phase_specs[name].dtype)
        if training and seed is not None:
            input_map.update({name: seed for name in self.seed_inputs})
        template = self.gradient_template if differentiated else self.compute_template
        if training and self.training_templates is not None:
            template = self.training_templates[1 if differentiated else 0]
        elif not (training or differentiated) and self.inference_template is not None:
            template = self.inference_template
        return tf.graph_util.import_graph_def(
            template, input_map=input_map, name="graph",
            return_elements=list(self.output_names) + (list(self.loss_names) if losses else [])
            + (list(self.update_names) if updates else []),
        )


def _runnable(template, graph, fold: bool, fed_names, weight_names, computed) -> tuple:
    """``template`` as it runs: ``(graph, batch norms folded, convolutions rewritten, biases guarded)``."""
    folded = 0
    if fold and weight_names:
        rewritten, folded = fold_affine(template, graph, fed_names, list(weight_names))
        if folded:
            template = gu.subgraph(rewritten, computed, feeds=fed_names)
    # strided 1x1 convolutions as views at stride 1: their gradient is wrong on some CPUs (tfnet.kernels)
    template, convolutions = kernels.rewrite_graph(template, graph)
    # a BiasAdd that TensorFlow's remapper would fuse with a sum other ops still read, as an AddV2 (tfnet.remapper_guard)
    template, biases = remapper_guard.rewrite_graph(template)
    return template, folded, convolutions, biases


def import_for_shapes(template: graph_pb2.GraphDef) -> tf.Graph:
    """Imports a (weightless) graph into a new tf.Graph, for static dtypes and shapes."""
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(template, name="")
        except (ValueError, TypeError, tf.errors.OpError) as exc:
            raise GraphLoadError(
                f"The graph could not be imported into TensorFlow: {first_line(str(exc))}"
            ) from None
    return graph


def _spec(graph: tf.Graph, name: str) -> tf.TensorSpec:
    try:
        t = graph.get_tensor_by_name(name)
    except (KeyError, ValueError) as exc:
        raise TensorNameError(first_line(str(exc))) from None
    return tf.TensorSpec(t.shape, t.dtype, name=re.sub(r"[^A-Za-z0-9_.\-/]", "_", name.replace(":", "_")))


def check_weight_consts(graph_def, weights) -> list[str]:
    nodes = gu.nodes_by_name(graph_def)
    names = []
    for w in as_name_list(weights if isinstance(weights, str) else list(weights), "weights"):
        w = gu.node_name(w)
        node = nodes.get(w)
        if node is None:
            consts = [n for n in nodes if gu.is_weight_const(nodes[n])]
            raise TensorNameError(unknown_name_message("float constant (weight)", w, consts))
        if node.op != "Const" or node.attr["dtype"].type not in gu.FLOAT_TYPES:
            raise TensorNameError(
                f"Weight {w!r} must be a float Const node; it is a {node.op} node "
                f"of dtype {tf.as_dtype(node.attr['dtype'].type).name if node.attr['dtype'].type else '?'}."
            )
        names.append(w)
    return names


def feed_specs(template, input_names) -> dict:
    """dtype and dims of inputs that are intermediate tensors, learnt by importing the graph."""
    nodes = gu.nodes_by_name(template)
    need = [n for n in input_names if nodes[gu.node_name(n)].op not in ("Placeholder", "PlaceholderWithDefault")]
    if not need:
        return {}
    graph = import_for_shapes(template)
    specs = {}
    for name in need:
        t = graph.get_tensor_by_name(name)
        specs[name] = (t.dtype.as_datatype_enum, None if t.shape.rank is None else t.shape.as_list())
    return specs


def _check_losses(names: Sequence[str], specs: Sequence[tf.TensorSpec]) -> None:
    for name, spec in zip(names, specs):
        if not spec.dtype.is_floating:
            raise InputSpecError(f"Loss {name!r} is a {spec.dtype.name} tensor; a loss the training loss adds must be a "
                                 "float tensor (it is summed).")


def _check_updates(updates: Mapping[str, str], graph: tf.Graph, weights: Mapping[str, tf.TensorSpec]) -> None:
    for tensor, weight in updates.items():
        spec, target = _spec(graph, tensor), weights.get(weight)
        if target is None or not spec.shape.is_compatible_with(target.shape) or not spec.dtype.is_floating:
            raise InputSpecError(
                f"updates[{tensor!r}]: a {spec.dtype.name} tensor of shape {spec.shape} cannot be assigned to the weight "
                f"{weight!r}" + ("" if target is None else f" of shape {target.shape}") + ".")


def _check_phase_value(name: str, value, spec: tf.TensorSpec) -> None:
    try:
        tensor = tf.constant(value, dtype=spec.dtype)
    except (TypeError, ValueError):
        tensor = None
    if tensor is None or not spec.shape.is_compatible_with(tensor.shape):
        raise InputSpecError(
            f"phase_values[{name!r}] must be (training value, inference value), each a "
            f"{spec.dtype.name} of shape {spec.shape}. Received: {value!r}"
        )


def used_tensors(graph_def: graph_pb2.GraphDef) -> set[str]:
    used = set()
    for node in graph_def.node:
        for inp in node.input:
            if not inp.startswith("^"):
                used.add(inp if ":" in inp else inp + ":0")
    return used


def _check_unfed_placeholders(template, input_names, output_names, weight_names):
    fed = set(input_names) | {w + ":0" for w in weight_names}
    needed = gu.subgraph(template, output_names, feeds=fed)
    fed_nodes = {gu.node_name(f) for f in fed}
    unfed = [n.name for n in needed.node if n.op == "Placeholder" and n.name not in fed_nodes]
    if unfed:
        raise InputSpecError(
            f"The outputs {list(output_names)} depend on placeholders {unfed} that are not among "
            f"the inputs {list(input_names)}. Add them to `inputs`."
        )


def own_function(fn: Callable, **options):
    """``tf.function(fn, **options)``, its tracing counted on its own. TensorFlow keys its "N out of the
    last M calls to <function> triggered tf.function retracing" warning by the Python code object,
    which the functions of every net (or step) share: five nets traced once each looked like one
    function retraced five times. A ``functools.partial`` has no code object, so the key is the
    function itself. Each call runs under :func:`tfnet.call_options.cpu_call_options` (Grappler without
    its GPU-only passes where TensorFlow sees no GPU)."""
    return with_cpu_call_options(tf.function(functools.partial(fn), **options))

