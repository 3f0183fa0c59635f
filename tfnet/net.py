"""TFNet: a frozen TensorFlow graph as a layer with explicit, trainable weights.

The float constants that hold a frozen graph's weights are turned into placeholders, and the graph
becomes a pure function ``f(inputs, weights) -> outputs`` that is imported (``import_graph_def`` with
an ``input_map``) into whichever ``tf.function`` calls it. The weights live in ``tf.Variable`` s that
the layer owns. ``tf.GradientTape`` differentiates straight through the imported ops.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfnet import graph_utils as gu
from tfnet.errors import (
    GraphExecutionError,
    InputSpecError,
    NoWeightsError,
    WeightError,
    WeightTypeError,
    unknown_name_message,
)
from tfnet.graph_function import (
    GraphFunction,
    check_weight_consts,
    feed_specs,
    first_line,
    used_tensors,
)
from tfnet.graph_io import PathLike, read_graph_def
from tfnet.hooks import HookHandle, HookList
from tfnet.inputs import arrange, as_name_list, batch_size_of, convert
from tfnet.library import prepare_library
from tfnet.lora import Adapter, adapted_weights
from tfnet.statistics import find_statistics
from tfnet.tables import canonical_tables, with_init_all_tables

TrainableSpec = Union[bool, str, "re.Pattern[str]", Iterable[str], Callable[[str], bool], None]

__all__ = ["TFNet"]


class TFNet(tf.Module):
    """A frozen TensorFlow graph wrapped as a layer whose weights are explicit and trainable.

    Build one with a constructor: :meth:`from_frozen_graph`, :meth:`from_saved_model`,
    :meth:`from_keras` or :meth:`from_export_folder` (what :meth:`save` writes).

    Args:
        graph_def: A frozen ``GraphDef`` (weights stored as ``Const`` nodes), or a path to one.
        inputs: Input tensor names, ``"name"`` or ``"name:0"``. Any tensor may be an input.
        outputs: Output tensor names.
        weights: ``"auto"`` (default) makes every float constant of rank >= 1 a weight. A list of
            constant names picks them explicitly.
        trainable: What trains at first; see :attr:`trainable`. Default: every weight except
            batch-norm statistics.
        relax_batch: Make dimension 0 of input placeholders unknown so that any batch size can be
            fed. Default: True.
        fold_batch_norm: In the graph that runs (not the one saved), fold inference-mode batch
            norm into the convolution or matmul before it: the same function of the same weights,
            with fewer passes over the activations. Default: True.
        phase_values: Training-mode inputs (Analytics Zoo's ``tensor_with_value``):
            ``{tensor name: (training value, inference value)}``, such as
            ``{"is_training:0": (True, False)}`` or ``{"keep_prob:0": (0.5, 1.0)}``. Each tensor is
            fed its training value by ``forward(x, training=True)``, ``backward(..., training=True)``
            and the fused training step, and its inference value otherwise. Default: none.
        name: The module name. Default: ``"tfnet"``.

    Example:
        >>> import tensorflow as tf, numpy as np
        >>> g = tf.Graph()
        >>> with g.as_default():
        ...     x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        ...     w = tf.constant([[1.0], [2.0]], name="w")
        ...     y = tf.matmul(x, w, name="y")
        >>> net = TFNet.from_frozen_graph(g.as_graph_def(), "x", "y")
        >>> net.weight_names
        ['w']
        >>> net.forward(np.array([[1.0, 1.0]], np.float32))
        array([[3.]], dtype=float32)
    """

    def __init__(
        self,
        graph_def: PathLike | bytes | graph_pb2.GraphDef,
        inputs: str | Sequence[str],
        outputs: str | Sequence[str],
        *,
        weights: str | Sequence[str] = "auto",
        trainable: TrainableSpec = None,
        relax_batch: bool = True,
        fold_batch_norm: bool = True,
        phase_values: Mapping[str, tuple] | None = None,
        name: str = "tfnet",
    ):
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
        self._init(template, values, input_names, output_names, trainable=trainable, relax_batch=relax_batch,
                   fold=fold_batch_norm, phase_values=phase_values, name=name)

    def _init(self, template, values, input_names, output_names, *, trainable=None, relax_batch=True,
              fold=True, phase_values=None, name="tfnet"):
        """Builds the layer from a weightless graph (weights as placeholders) and their values."""
        phase_values = _check_phase_values(template, phase_values, input_names)
        feeds = list(input_names) + list(phase_values)
        template = gu.subgraph(template, output_names, feeds=feeds, feed_specs=feed_specs(template, feeds))
        kept = gu.nodes_by_name(template)
        values = {w: v for w, v in values.items() if w in kept}
        statistics = find_statistics(template, list(values))
        if relax_batch:
            gu.set_placeholder_batch_dim(template, input_names)
        self._setup(template, input_names, output_names, values, statistics, name=name, fold=fold,
                    phase_values=phase_values)
        if trainable is not None:
            self.trainable = trainable

    @classmethod
    def _from_frozen(cls, frozen, **kwargs) -> TFNet:
        """From a :class:`tfnet.freeze.Frozen` (a weightless graph and its weight values)."""
        net = cls.__new__(cls)
        inputs = gu.check_tensor_names(frozen.template, frozen.inputs, "input")
        outputs = gu.check_tensor_names(frozen.template, frozen.outputs, "output")
        net._init(frozen.template, frozen.values, inputs, outputs, **_init_kwargs(kwargs))
        return net

    # ------------------------------------------------------------------ construction

    @classmethod
    def _from_template(
        cls,
        template: graph_pb2.GraphDef,
        input_names: list[str],
        output_names: list[str],
        values: Mapping[str, np.ndarray],
        statistics: Sequence[str] | Mapping[str, str],
        trainable: Sequence[str] | None,
        name: str = "tfnet",
        fold: bool = True,
        phase_values: Mapping[str, tuple] | None = None,
        adapters: Sequence[Adapter] = (),
    ) -> TFNet:
        """A net from a weightless graph and the values of its weights (``adapters``' values too)."""
        net = cls.__new__(cls)
        net._setup(template, input_names, output_names, values, statistics, name=name, fold=fold,
                   phase_values=phase_values, adapters=adapters)
        if trainable is not None:
            net._set_trainable_names([t for t in trainable if t in net._vars])
        return net

    def _setup(self, template, input_names, output_names, values, statistics, name="tfnet", fold=True,
               phase_values=None, adapters=()):
        tf.Module.__init__(self, name=name)
        prepare_library(template)
        extra = {n for ad in adapters for n in (ad.a, ad.b)}
        weight_names = [n.name for n in template.node if n.name in values and n.name not in extra]
        self._graph = GraphFunction(template, input_names, output_names, weight_names, fold=fold,
                                    phase_values=phase_values)
        self._tables = list(self._graph.tables.tables.values())  # tracked by the module (SavedModel export)
        with tf.init_scope():
            self._vars = {
                w: tf.Variable(
                    np.asarray(values[w]), name=_variable_name(w), trainable=False, dtype=spec.dtype
                )
                for w, spec in zip(weight_names, self._graph.weight_specs)
            }
        self._adapters: dict[str, Adapter] = {}
        self._lora_plan: list[tuple[int, int, int, Adapter]] = []
        self._add_adapters(adapters, values)
        self._statistics = [s for s in weight_names if s in set(statistics)]
        roles = statistics if isinstance(statistics, Mapping) else {}
        self._statistic_roles = {s: roles.get(s, "statistic") for s in self._statistics}
        stats = set(self._statistics)
        self._trainable = [w for w in self._vars if w not in stats]
        self._version = 0
        self._compiled: dict[Any, Callable] = {}
        self._forward_hooks = HookList(self._changed)
        self._gradient_hooks = HookList(self._changed)
        self._update_hooks = HookList(self._changed)

    def _add_adapters(self, adapters: Sequence[Adapter], values: Mapping[str, Any]) -> None:
        """Adds each adapter's two variables (after the graph's weights) from ``values``."""
        with tf.init_scope():
            for adapter in adapters:
                if adapter.target not in self._vars or adapter.target in self._adapters:
                    raise WeightError(f"Adapter for {adapter.target!r}: no such base weight, or it has one already.")
                base = self._vars[adapter.target]
                for name, shape in zip((adapter.a, adapter.b), adapter.shapes(base.shape)):
                    value = np.asarray(values[name])
                    if value.shape != shape:
                        raise WeightError(f"Adapter weight {name!r} has shape {shape}; received shape {value.shape}.")
                    self._vars[name] = tf.Variable(value, name=_variable_name(name), trainable=False, dtype=base.dtype)
                self._adapters[adapter.target] = adapter
        index = {n: i for i, n in enumerate(self._vars)}
        self._lora_plan = [(index[ad.target], index[ad.a], index[ad.b], ad) for ad in self._adapters.values()]

    def _changed(self) -> None:
        self._version += 1
        self._compiled.clear()

    @classmethod
    def from_frozen_graph(
        cls,
        path_or_graph_def: PathLike | bytes | graph_pb2.GraphDef,
        inputs: str | Sequence[str],
        outputs: str | Sequence[str],
        **kwargs,
    ) -> TFNet:
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

    @classmethod
    def from_keras(cls, model, **kwargs) -> TFNet:
        """Freezes a built Keras 3 model in inference mode and wraps it.

        Weights are named by their Keras paths (``"dense/kernel"``), inputs by the Keras input
        names and outputs by the output layer names (a ``Sequential`` model's output by its last
        layer's name). Dropout is off and batch norm uses its moving statistics, which are frozen
        by default. Lookup tables (``TextVectorization``, ``StringLookup``, ``IntegerLookup``) are
        kept in the graph with their contents (see :mod:`tfnet.tables`).

        Args:
            model: A built ``keras.Model``, or the path of a saved one (a ``.keras`` file or a legacy
                ``.h5`` file, loaded with ``keras.models.load_model(path, compile=False)``).
            **kwargs: ``trainable``, ``relax_batch``, ``fold_batch_norm``, ``name``; see :class:`TFNet`.

        Raises:
            FileNotFoundError: a path that does not exist.
            GraphLoadError: a path Keras cannot load (a SavedModel folder: use :meth:`from_saved_model`).
        """
        from tfnet.freeze import freeze_keras, load_keras_file

        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            model = load_keras_file(model)
        return cls._from_frozen(freeze_keras(model), **kwargs)

    @classmethod
    def from_saved_model(cls, path: PathLike, signature: str = "serving_default", **kwargs) -> TFNet:
        """Loads one signature of a SavedModel, freezing its variables into weights.

        Inputs are the signature's argument names, outputs its output keys.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            GraphLoadError: ``path`` is not a SavedModel.
            TensorNameError: ``signature`` does not exist; the message lists the signatures.
        """
        from tfnet.saving import load_saved_model_signature

        return cls._from_frozen(load_saved_model_signature(path, signature), **kwargs)

    @classmethod
    def from_export_folder(cls, folder: PathLike, *, storage_options=None, **kwargs) -> TFNet:
        """Loads the Analytics Zoo export layout: ``frozen_inference_graph.pb`` plus
        ``graph_meta.json`` with ``input_names`` and ``output_names``. Folders written by
        :meth:`save` also restore the weight list and the trainable selection. ``folder`` may be a
        URI fsspec understands (``s3://bucket/run/export``), with its ``storage_options``."""
        from tfnet.saving import read_export_folder

        graph_def, meta = read_export_folder(folder, storage_options)
        extra = meta.get("tfnet", {})
        if "weight_names" in extra:
            kwargs.setdefault("weights", extra["weight_names"])
        if extra.get("phase_values"):
            kwargs.setdefault("phase_values", {k: tuple(v) for k, v in extra["phase_values"].items()})
        net = cls(graph_def, meta["input_names"], meta["output_names"], **kwargs)
        if "trainable" in extra and "trainable" not in kwargs:
            net._set_trainable_names([t for t in extra["trainable"] if t in net._vars])
        return net

    load = from_export_folder

    @classmethod
    def from_onnx(
        cls,
        path_or_model_proto,
        inputs: str | Sequence[str] | None = None,
        outputs: str | Sequence[str] | None = None,
        **kwargs,
    ) -> TFNet:
        """Converts an ONNX model (for example one from ``torch.onnx.export``) into a TFNet.

        The ONNX initializers become the weights, named by their ONNX names (characters TensorFlow
        does not allow become ``_``); ``BatchNormalization`` means and variances are statistics,
        frozen by default. Convolutions run in NHWC. The batch dimension is dynamic. Needs
        ``pip install tfnet[onnx]``; see :mod:`tfnet.onnx`.

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
        from tfnet.onnx.build import net_from_onnx

        return net_from_onnx(cls, path_or_model_proto, inputs, outputs, **kwargs)


    # ------------------------------------------------------------------ weights

    @property
    def input_names(self) -> list[str]:
        """Input tensor names (``"name:0"``), in the order inputs are passed."""
        return list(self._graph.input_names)

    @property
    def output_names(self) -> list[str]:
        """Output tensor names, in the order outputs are returned."""
        return list(self._graph.output_names)

    @property
    def input_specs(self) -> list[tf.TensorSpec]:
        """dtype and shape of each input (dimension 0, the batch, is usually ``None``)."""
        return list(self._graph.input_specs)

    @property
    def phase_values(self) -> dict[str, tuple]:
        """``{tensor name: (training value, inference value)}``, as given to the constructor."""
        return dict(self._graph.phase_values)

    @property
    def output_specs(self) -> list[tf.TensorSpec]:
        return list(self._graph.output_specs)

    @property
    def _weight_specs(self) -> list[tf.TensorSpec]:
        """One spec per weight, in :attr:`weight_names` order (the graph's, then the adapters)."""
        count = len(self._graph.weight_specs)
        extra = [tf.TensorSpec(v.shape, v.dtype) for v in list(self._vars.values())[count:]]
        return list(self._graph.weight_specs) + extra

    @property
    def weight_names(self) -> list[str]:
        """Every weight's name: the graph's in graph order, then the adapters' (:meth:`with_lora`)."""
        return list(self._vars)

    @property
    def statistic_names(self) -> list[str]:
        """Weights holding batch-norm statistics (frozen unless named explicitly)."""
        return list(self._statistics)

    @property
    def statistics(self) -> dict[str, str]:
        """What was detected as normalisation statistics, by graph structure: ``{weight: role}``
        with role ``"mean"`` or ``"variance"`` (``"statistic"`` when carried over from a net this
        one was cut from or extended). These are frozen by default, as the original framework
        does not train them."""
        return dict(self._statistic_roles)

    @property
    def weight_variables(self) -> dict[str, tf.Variable]:
        """The ``tf.Variable`` behind each weight, by name."""
        return dict(self._vars)

    @property
    def trainable_variables(self) -> tuple[tf.Variable, ...]:
        return tuple(self._vars[n] for n in self._trainable)

    def get_weights(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Returns copies of the weights (all, or the given names) as numpy arrays."""
        names = self.weight_names if names is None else [self._check_weight_name(n) for n in names]
        return {n: _copy(self._vars[n]) for n in names}

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Sets some or all weights. Names, shapes and dtypes are all checked before any is set.

        Raises:
            WeightError: an unknown name or a wrong shape.
            WeightTypeError: a value that is not a float array.
        """
        checked = self._check_weight_values(weights, "set_weights")
        for name, value in checked.items():
            self._vars[name].assign(value)

    def _check_weight_name(self, name: str) -> str:
        if not isinstance(name, str):
            raise WeightError(f"Weight names are strings. Received: {name!r}")
        key = name[:-2] if name.endswith(":0") and name[:-2] in self._vars else name
        if key not in self._vars:
            if not self._vars:
                raise NoWeightsError(f"Unknown weight {name!r}: this graph has no weights.")
            raise WeightError(unknown_name_message("weight", name, self._vars))
        return key

    def _check_weight_values(self, weights: Mapping[str, Any], what: str) -> dict[str, tf.Tensor]:
        if not isinstance(weights, Mapping):
            raise TypeError(f"{what} takes a dict of name -> array. Received: {type(weights).__name__}")
        checked = {}
        for name, value in weights.items():
            key = self._check_weight_name(name)
            var = self._vars[key]
            if isinstance(value, (tf.Tensor, tf.Variable)):
                kind_ok = value.dtype.is_floating or value.dtype.is_integer
                shape = tuple(value.shape)
            else:
                value = np.asarray(value)
                kind_ok = value.dtype.kind in "fiu"
                shape = value.shape
            if not kind_ok:
                raise WeightTypeError(
                    f"{what}: weight {key!r} takes numbers of dtype {var.dtype.name}; received "
                    f"dtype {getattr(value.dtype, 'name', value.dtype)}."
                )
            if shape != tuple(var.shape):
                raise WeightError(
                    f"{what}: weight {key!r} has shape {tuple(var.shape)}; received shape {shape}."
                )
            checked[key] = tf.cast(value, var.dtype)
        return checked

    @property
    def trainable(self) -> list[str]:
        """The names of the weights that train, in graph order.

        Set it with:
          * a list of names: exactly those weights (batch-norm statistics too, if named);
          * a string: every weight whose name starts with that prefix;
          * a compiled regex (``re.compile``): every weight whose name it matches (``re.search``);
          * a callable ``name -> bool``;
          * ``True``: every weight except batch-norm statistics (the default); ``False``: none.

        Prefix, regex and callable selections leave batch-norm statistics frozen.
        """
        return list(self._trainable)

    @trainable.setter
    def trainable(self, spec: TrainableSpec) -> None:
        if not self._vars:
            raise NoWeightsError(
                "This graph has no weights (no float constants of rank >= 1), so nothing can be "
                "trained. It still works as a fixed function through forward()."
            )
        stats = set(self._statistics)
        names = self.weight_names
        if spec is True or spec is None:
            chosen = [n for n in names if n not in stats]
        elif spec is False:
            chosen = []
        elif isinstance(spec, str):
            chosen = [n for n in names if n.startswith(spec) and n not in stats]
            if not chosen and spec in stats:
                chosen = [spec]
            if not chosen:
                raise WeightError(
                    f"No weight name starts with {spec!r}. "
                    + unknown_name_message("weight prefix", spec, names)
                )
        elif isinstance(spec, re.Pattern):
            chosen = [n for n in names if spec.search(n) and n not in stats]
            if not chosen:
                raise WeightError(f"No weight name matches {spec.pattern!r}. Weights: {names[:10]}")
        elif callable(spec):
            chosen = [n for n in names if spec(n) and n not in stats]
        elif isinstance(spec, Iterable):
            wanted = [self._check_weight_name(n) for n in spec]
            chosen = [n for n in names if n in set(wanted)]
        else:
            raise TypeError(
                "`trainable` takes a list of names, a prefix string, a compiled regex, a callable or "
                f"a bool. Received: {spec!r}"
            )
        self._set_trainable_names(chosen)

    def _set_trainable_names(self, chosen: Sequence[str]) -> None:
        self._trainable = [n for n in self._vars if n in set(chosen)]
        self._changed()

    # ------------------------------------------------------------------ compute

    def _run_graph(
        self, inputs: Sequence[tf.Tensor], weights: Sequence[tf.Tensor], training: bool = False
    ) -> list[tf.Tensor]:
        """Imports the graph into the function being traced, wired to ``inputs`` and ``weights`` (all
        of :attr:`weight_names`: each adapted weight is fed ``W + alpha / rank * A @ B``); phase
        tensors get their training values when ``training``."""
        graph_weights = adapted_weights(weights, self._lora_plan, len(self._graph.weight_names))
        return self._graph(inputs, graph_weights, training=training)

    @property
    def _template(self) -> graph_pb2.GraphDef:
        return self._graph.template

    def _pure(self, training: bool = False) -> Callable:
        """``(inputs, weights) -> outputs``, compiled once per mode with a batch-agnostic signature."""
        key = ("pure", bool(training) and bool(self._graph.phase_values))
        fn = self._compiled.get(key)
        if fn is None:
            signature = [list(self.input_specs), list(self._weight_specs)]

            def run(inputs, weights):
                return self._run_graph(inputs, weights, training=key[1])

            if self._graph.v1_loops:
                # v1 loop frames and tf.function's automatic control dependencies do not mix.
                n_in = len(self.input_specs)
                wrapped = tf.compat.v1.wrap_function(
                    lambda *args: run(list(args[:n_in]), list(args[n_in:])), signature[0] + signature[1]
                )

                def fn(inputs, weights):
                    return wrapped(*inputs, *weights)
            else:
                fn = tf.function(run, input_signature=signature, autograph=False)
            self._compiled[key] = fn
        return fn

    def _weight_values(self) -> list[tf.Tensor]:
        return [v.value() for v in self._vars.values()]

    def prepare_inputs(self, inputs: Any) -> list[tf.Tensor]:
        """Checks inputs (one array, a list in input order, or a dict by name) and converts them to
        tensors of the graph's dtypes.

        Raises:
            InputSpecError: wrong number of inputs, rank or shape.
            InputTypeError: a dtype the input cannot take.
        """
        values = arrange(inputs, self.input_names)
        tensors = [convert(v, s, n) for v, s, n in zip(values, self.input_specs, self.input_names)]
        batch_size_of(tensors)
        return tensors

    def _call_pure(self, tensors: list[tf.Tensor], weights: list[tf.Tensor], training: bool = False) -> list[tf.Tensor]:
        try:
            return list(self._pure(training)(tensors, weights))
        except tf.errors.OpError as exc:
            raise GraphExecutionError(
                f"TensorFlow failed to run the graph on inputs of shapes "
                f"{[tuple(t.shape) for t in tensors]}: {first_line(exc.message)}"
            ) from None

    def __call__(self, inputs: Any, training: bool = False) -> tf.Tensor | list[tf.Tensor]:
        """Runs the graph on tensors and returns tensors, with forward hooks applied.

        Works inside ``tf.function`` and ``tf.GradientTape`` (gradients reach the weight variables).
        ``training`` selects the training values of :attr:`phase_values`.
        """
        tensors = self.prepare_inputs(inputs)
        # Always through the compiled function: a tape records its call as one differentiable op.
        outs = self._call_pure(tensors, self._weight_values(), training)
        return self._forward_hooks.run(self._pack(outs))

    def forward(self, inputs: Any, *, as_tensors: bool = False, batch_size: int | None = None,
                training: bool = False):
        """Runs the graph.

        Args:
            inputs: One array (single-input graphs), a list in :attr:`input_names` order, or a dict
                by input name. Numpy arrays, lists or tensors; floats are cast to the graph's float
                dtype, integers and strings pass through.
            as_tensors: Return ``tf.Tensor`` s instead of numpy arrays. Default: False.
            batch_size: Run in chunks of this many rows and concatenate. Default: one call.
            training: Feed :attr:`phase_values` their training values. Default: False.

        Returns:
            One array for single-output graphs, else a list in :attr:`output_names` order.
        """
        tensors = self.prepare_inputs(inputs)
        weights = self._weight_values()
        n = batch_size_of(tensors)
        if batch_size and n and n > batch_size:
            chunks = [
                self._call_pure([t[i : i + batch_size] for t in tensors], weights, training)
                for i in range(0, n, batch_size)
            ]
            outs = [tf.concat([c[j] for c in chunks], axis=0) for j in range(len(self.output_names))]
        else:
            outs = self._call_pure(tensors, weights, training)
        outs = self._forward_hooks.run(self._pack(outs))
        return outs if as_tensors else tf.nest.map_structure(lambda t: t.numpy(), outs)

    def backward(self, inputs: Any, grad_outputs: Any = None, *, as_tensors: bool = False,
                 training: bool = False):
        """Vector-Jacobian product of the outputs with ``grad_outputs``.

        Args:
            inputs: As for :meth:`forward`.
            grad_outputs: One gradient per output (a single array, a list, or a dict by output
                name). ``None`` for an output means it does not contribute. Default: ones for every
                output (the gradient of ``sum(outputs)``).
            as_tensors: Return tensors instead of numpy arrays. Default: False.
            training: Feed :attr:`phase_values` their training values. Default: False.

        Returns:
            ``(grad_inputs, grad_weights)``: a list with one gradient per input (``None`` for
            non-float inputs) and a dict over the trainable weights. Gradient hooks are applied to
            ``grad_weights``.

        Raises:
            NoWeightsError: the graph has no weights.
            GradientUnavailableError: TensorFlow has no gradient for the graph (nested v1 control
                flow loops); the message names the node.
        """
        if not self._vars:
            raise NoWeightsError(
                "backward() needs weights, and this graph has none (no float constants of rank "
                ">= 1); it works as a fixed function only. For input gradients, record "
                "net(inputs) under tf.GradientTape."
            )
        tensors = self.prepare_inputs(inputs)
        grads_out = self._prepare_grad_outputs(grad_outputs)
        names = self._trainable
        weights = self._weight_values()
        float_inputs = [i for i, t in enumerate(tensors) if t.dtype.is_floating]
        index = {n: i for i, n in enumerate(self._vars)}
        if self._graph.v1_loops:
            grads = self._graph_mode_grads(tensors, weights, grads_out, float_inputs, names, training)
        else:
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                for i in float_inputs:
                    tape.watch(tensors[i])
                for n in names:
                    tape.watch(weights[index[n]])
                outs = self._call_pure(tensors, weights, training)
                outs = tf.nest.flatten(self._forward_hooks.run(self._pack(outs)))
            sources = [tensors[i] for i in float_inputs] + [weights[index[n]] for n in names]
            if grads_out is not None:  # an output without a gradient does not contribute
                grads_out = [tf.zeros_like(o) if g is None else g for g, o in zip(grads_out, outs)]
            grads = tape.gradient(outs, sources, output_gradients=grads_out)
            grads = [_dense_or_zeros(g, s) for g, s in zip(grads, sources)]
        grad_inputs: list = [None] * len(tensors)
        for k, i in enumerate(float_inputs):
            grad_inputs[i] = grads[k]
        grad_weights = dict(zip(names, grads[len(float_inputs):]))
        grad_weights = self._gradient_hooks.run(grad_weights)
        if not as_tensors:
            grad_inputs = [None if g is None else g.numpy() for g in grad_inputs]
            grad_weights = {k: v.numpy() for k, v in grad_weights.items()}
        if len(grad_inputs) == 1:
            grad_inputs = grad_inputs[0]
        return grad_inputs, grad_weights

    def _graph_mode_grads(self, tensors, weights, grads_out, float_inputs, names, training) -> list:
        """Gradients by ``tf.gradients`` in the graph the frozen graph is imported into, with v1 loop
        contexts rebuilt (see :mod:`tfnet.v1_loops`): TensorFlow's tape cannot differentiate v1 loops."""

        index = {n: i for i, n in enumerate(self._vars)}
        sources = [("input", i) for i in float_inputs] + [("weight", index[n]) for n in names]
        fn = self._v1_vjp(sources, training, grads_out is not None, hooks=True)
        if grads_out is not None and any(g is None for g in grads_out):
            outs = self._call_pure(tensors, weights, training)
            grads_out = [tf.zeros_like(o) if g is None else g for g, o in zip(grads_out, outs)]
        try:
            return list(fn(tensors, weights, grads_out or ()))
        except tf.errors.OpError as exc:
            raise GraphExecutionError(f"TensorFlow failed to differentiate the graph: {first_line(exc.message)}") from None

    def _v1_vjp(self, sources, training: bool, with_grad_outputs: bool, hooks: bool) -> Callable:
        """``(inputs, weights, grad_outputs) -> gradients`` for graphs with v1 loops, compiled once."""
        from tfnet.v1_loops import graph_mode_vjp

        key = ("vjp", tuple(sources), bool(training), with_grad_outputs, hooks)
        fn = self._compiled.get(key)
        if fn is None:
            fn = graph_mode_vjp(
                lambda i, w: self._run_graph(i, w, training=training), self.input_specs, self._weight_specs,
                self.output_specs, sources, with_grad_outputs,
                post=(lambda outs: self._forward_hooks.run(self._pack(outs))) if hooks else None,
            )
            self._compiled[key] = fn
        return fn

    def _prepare_grad_outputs(self, grad_outputs) -> list | None:
        if grad_outputs is None:
            return None
        values = arrange(grad_outputs, self.output_names, what="output gradient")
        if all(v is None for v in values):
            raise InputSpecError("Every output gradient is None; give at least one.")
        return [
            None if v is None else convert(v, spec, f"gradient of {name}")
            for v, spec, name in zip(values, self.output_specs, self.output_names)
        ]

    # ------------------------------------------------------------------ updates and hooks

    def apply_updates(self, updates: Mapping[str, Any]) -> None:
        """The weight-update hook: sets each named weight ``w`` to ``w + update``, then runs the
        update hooks on the updated weights."""
        checked = self._check_weight_values(updates, "apply_updates")
        for name, delta in checked.items():
            self._vars[name].assign_add(delta)
        self._run_update_hooks(list(checked))

    def _run_update_hooks(self, names: Sequence[str]) -> None:
        if not self._update_hooks:
            return
        current = {n: self._vars[n].value() for n in names}
        new = self._update_hooks.run(dict(current))
        changed = {k: v for k, v in new.items() if v is not current.get(k)}
        for name, value in self._check_weight_values(changed, "update hook").items():
            self._vars[name].assign(value)

    @property
    def hooks(self) -> dict[str, tuple[Callable, ...]]:
        """The registered hooks by kind, each in the order they run: ``{"forward": (...), "gradient":
        (...), "update": (...)}`` (read-only; register and remove them through the methods)."""
        return {"forward": tuple(self._forward_hooks), "gradient": tuple(self._gradient_hooks),
                "update": tuple(self._update_hooks)}

    def register_forward_hook(self, fn: Callable) -> HookHandle:
        """``fn(outputs) -> outputs or None`` runs on the outputs of every forward pass (and inside
        the fused training step). ``outputs`` is a tensor, or a list for several outputs.
        Write hooks with TensorFlow ops: inside compiled steps they are traced once."""
        return self._forward_hooks.add(fn)

    def register_gradient_hook(self, fn: Callable) -> HookHandle:
        """``fn(grads: dict[name, tensor]) -> dict or None`` runs on the weight gradients before
        they are used: to clip or mask them."""
        return self._gradient_hooks.add(fn)

    def register_update_hook(self, fn: Callable) -> HookHandle:
        """``fn(weights: dict[name, tensor]) -> dict or None`` runs after every weight update on the
        updated weights; a returned dict of new values is assigned (to constrain weights)."""
        return self._update_hooks.add(fn)

    def _pack(self, outs: Sequence[tf.Tensor]):
        """One output as a tensor, several as a list: the structure users and hooks see."""
        return outs[0] if len(outs) == 1 else list(outs)

    # ------------------------------------------------------------------ graph surgery

    def cut(self, tensor_names: str | Sequence[str]) -> TFNet:
        """Returns a new TFNet that ends at the given tensor(s), such as the features before a
        classifier. Weights past the cut are dropped; the rest keep their current values and
        trainable state."""
        outputs = gu.check_tensor_names(self._template, as_name_list(tensor_names, "tensor_names"), "cut")
        template = gu.subgraph(self._template, outputs, feeds=self.input_names + list(self.phase_values))
        kept = gu.nodes_by_name(template)
        used = used_tensors(template) | set(outputs)
        inputs = [n for n in self.input_names if n in used]
        adapters = [ad for ad in self._adapters.values() if ad.target in kept]
        keep = kept.keys() | {n for ad in adapters for n in (ad.a, ad.b)}
        values = {w: _copy(v) for w, v in self._vars.items() if w in keep}
        net = TFNet._from_template(
            template, inputs, outputs, values, self.statistics, self._trainable, name=self.name,
            fold=self._graph.fold, phase_values=self._used_phase_values(template), adapters=adapters,
        )
        net._onnx_source = getattr(self, "_onnx_source", None)  # for save_onnx
        return net

    def add_head(self, head, name: str = "head") -> TFNet:
        """Attaches a Keras head (a layer, a list of layers, or a model) to this net's single output
        and returns one TFNet whose weights include the head's, under ``name/``.

        The head's weights start from their Keras initial values and are trainable; this net's
        weights keep their trainable state (set ``net.trainable = "head/"`` to train the head only).
        """
        from tfnet.head import freeze_head

        if len(self.output_names) != 1:
            raise InputSpecError(
                f"add_head needs a net with one output; this one has {self.output_names}. "
                "Use cut() to choose the feature tensor first."
            )
        frozen = freeze_head(head, self.output_specs[0])
        head_weights = frozen.weights
        head_stats = find_statistics(frozen.template, head_weights)
        head_values = frozen.values
        head_outputs = frozen.outputs
        merged = gu.merge(
            self._template, frozen.template, name, {gu.node_name(frozen.inputs[0]): self.output_names[0]}
        )
        values = {w: _copy(v) for w, v in self._vars.items()}
        values.update({f"{name}/{k}": v for k, v in head_values.items()})
        stats = {**self.statistics, **{f"{name}/{s}": role for s, role in head_stats.items()}}
        trainable = self._trainable + [f"{name}/{w}" for w in head_weights if w not in head_stats]
        outputs = [f"{name}/{o}" for o in head_outputs]
        net = TFNet._from_template(
            merged, self.input_names, outputs, values, stats, trainable, name=self.name, fold=self._graph.fold,
            phase_values=self.phase_values, adapters=list(self._adapters.values()),
        )
        net._onnx_source = getattr(self, "_onnx_source", None)  # for save_onnx
        return net

    def _used_phase_values(self, template) -> dict[str, tuple]:
        kept = gu.nodes_by_name(template)
        return {k: v for k, v in self._graph.phase_values.items() if gu.node_name(k) in kept}

    # ------------------------------------------------------------------ low-rank adapters

    def with_lora(self, targets, rank: int = 8, alpha: float | None = None, *, seed: int | None = None) -> TFNet:
        """Returns a new TFNet in which each target weight ``W`` is used as ``W + (alpha / rank) * A @ B``
        (LoRA, with Keras 3's conventions; see :mod:`tfnet.lora`).

        ``A`` and ``B`` are new weights named ``<W>/lora_a`` and ``<W>/lora_b``: ``A`` of shape
        ``(in, rank)`` (``W.shape[:-1] + (rank,)`` for an attention projection's kernel, as Keras's
        ``EinsumDense``) drawn He-uniform, ``B`` of shape ``(rank, out)`` at zero, so the new net
        computes exactly what this one does. Only the adapters are trainable in the new net (set its
        :attr:`trainable` to train more, e.g. ``lora.adapter_names + ["head/kernel"]``). This net is
        left as it was; its weights are copied.

        Saving a net with adapters (:meth:`save`, :meth:`save_saved_model`, :meth:`save_onnx`,
        :meth:`frozen_graph_def`) writes :meth:`merged`'s graph: serving costs nothing extra.

        Args:
            targets: What :attr:`trainable` takes: a prefix string, a list of names, a compiled regex,
                a callable ``name -> bool``, or ``True`` for every candidate (:meth:`lora_candidates`).
                Prefix, regex and callable skip weights that are not kernels (biases, norms).
            rank: The rank of ``A @ B``. Default: 8.
            alpha: The scale's numerator. Default: None, which means ``rank`` (Keras's default).
            seed: Seeds ``A``'s draw. Default: None (a fresh draw).

        Raises:
            WeightError: nothing matches; a named weight does not exist, is not a kernel, or already has
                an adapter. The message lists the candidates, closest first.
            ValueError: ``rank`` or ``alpha`` is not positive.

        Example:
            >>> import tensorflow as tf, numpy as np
            >>> g = tf.Graph()
            >>> with g.as_default():
            ...     x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
            ...     y = tf.matmul(x, tf.constant(np.ones((3, 2), np.float32), name="w"), name="y")
            >>> lora = TFNet.from_frozen_graph(g.as_graph_def(), "x", "y").with_lora("w", rank=1, seed=0)
            >>> lora.trainable
            ['w/lora_a', 'w/lora_b']
            >>> lora.forward(np.ones((1, 3), np.float32))
            array([[3., 3.]], dtype=float32)
        """
        from tfnet import lora

        found = self._lora_targets()
        chosen = lora.select_targets(targets, found, self.weight_names, taken=self._adapters)
        variables = self._vars
        adapters, values = lora.new_adapters(
            chosen, found, {n: tuple(variables[n].shape) for n in chosen},
            {n: variables[n].dtype.as_numpy_dtype for n in chosen}, rank, alpha, seed)
        clash = [n for n in values if n in variables or n in gu.nodes_by_name(self._template)]
        if clash:
            raise WeightError(f"The adapters' names {clash} are taken by the graph's own nodes; rename those nodes.")
        values.update({w: _copy(v) for w, v in variables.items()})
        every = list(self._adapters.values()) + adapters
        net = TFNet._from_template(
            self._template, self.input_names, self.output_names, values, self.statistics,
            [n for ad in every for n in (ad.a, ad.b)], name=self.name, fold=self._graph.fold,
            phase_values=self.phase_values, adapters=every,
        )
        net._onnx_source = getattr(self, "_onnx_source", None)  # for save_onnx (of the merged net)
        return net

    def lora_candidates(self) -> list[str]:
        """The weights :meth:`with_lora` can target, in graph order: float kernels read by ``MatMul``,
        ``BatchMatMul`` or ``Einsum`` (dense layers, attention projections) and embedding tables read
        by ``Gather``; not convolution kernels, biases or normalisation scales."""
        return list(self._lora_targets())

    def _lora_targets(self) -> dict[str, str]:
        from tfnet import lora

        key = ("lora_targets",)
        found = self._compiled.get(key)
        if found is None:
            base = [n for n in self._graph.weight_names if n not in set(self._statistics)]
            found = lora.candidates(self._template, base, {n: tuple(self._vars[n].shape) for n in base})
            self._compiled[key] = found
        return found

    @property
    def adapters(self) -> dict[str, Adapter]:
        """``{target weight: Adapter}`` (target, rank, alpha, layout; ``.a`` and ``.b`` name its weights),
        empty for a net without adapters."""
        return dict(self._adapters)

    @property
    def adapter_names(self) -> list[str]:
        """The adapters' weight names (``<W>/lora_a``, ``<W>/lora_b`` for each target)."""
        return [n for ad in self._adapters.values() for n in (ad.a, ad.b)]

    def merged(self) -> TFNet:
        """A plain TFNet with each adapter folded into its weight (``W + alpha / rank * A @ B``): the same
        function, no adapters, so it saves as a frozen graph, SavedModel or ONNX and serves at the base
        net's cost. Weights whose adapters were trainable are trainable in it; the rest keep their
        state. A net without adapters gives a copy of itself."""
        trainable = set(self._trainable)
        keep = [n for n in self._trainable if n in self._graph.weight_names]
        keep += [ad.target for ad in self._adapters.values() if {ad.a, ad.b} & trainable]
        net = TFNet._from_template(
            self._template, self.input_names, self.output_names, self._graph_weight_arrays(), self.statistics,
            keep, name=self.name, fold=self._graph.fold, phase_values=self.phase_values,
        )
        net._onnx_source = getattr(self, "_onnx_source", None)  # for save_onnx
        return net

    def _graph_weight_arrays(self) -> dict[str, np.ndarray]:
        """The values the graph's weight placeholders are fed, as numpy copies (adapters folded in)."""
        names = self._graph.weight_names
        if not self._adapters:
            return {n: _copy(self._vars[n]) for n in names}
        fed = adapted_weights(self._weight_values(), self._lora_plan, len(names))
        return {n: np.array(t.numpy(), copy=True) for n, t in zip(names, fed)}

    # ------------------------------------------------------------------ training and saving

    def train_step(self, loss_fn: Callable, transform, *, reducer: Callable | None = None, precision: str = "fp32"):
        """Compiles forward, loss, backward, gradient hooks, update and update hooks into one
        ``tf.function``. See :class:`tfnet.step.TrainStep`.

        ``precision="bf16"`` computes forward and backward in bfloat16 with float32 master weights,
        optimiser state and loss (:mod:`tfnet.precision`); default ``"fp32"``.

        The step is cached: the same ``loss_fn``, ``transform``, ``reducer`` and ``precision`` give
        the same compiled step until the trainable set or the hooks change."""
        from tfnet.step import TrainStep

        key = ("train_step", id(loss_fn), id(transform), id(reducer), precision)
        step = self._compiled.get(key)
        if step is None:
            step = TrainStep(self, loss_fn, transform, reducer=reducer, precision=precision)
            self._compiled[key] = step
        return step

    def summary(self, print_fn=print, line_length: int = 100) -> str:
        """A Keras-style table: inputs and outputs (names, shapes, dtypes), every weight (shape,
        values, trainable, frozen or a statistic), the totals, and the graph's ops. Printed with
        ``print_fn`` (None: only returned)."""
        from tfnet.summary import summary

        return summary(self, print_fn, line_length)

    def tensor_names(self, op_types=None, contains: str | None = None, include_plumbing: bool = False) -> list[str]:
        """The graph's tensor names in graph order: where :meth:`cut` can end the net. Filter by op
        type (``op_types=["Relu"]``) or by text (``contains="block5"``); plumbing ops (constants,
        identities, reshapes, shape arithmetic) are left out unless ``include_plumbing``."""
        from tfnet.summary import tensor_names

        return tensor_names(self, op_types, contains, include_plumbing)

    def save(self, path: PathLike, *, storage_options=None) -> None:
        """Writes ``path/frozen_inference_graph.pb`` (a frozen graph with the current weights) and
        ``path/graph_meta.json``, each atomically. Plain TensorFlow can import the graph;
        :meth:`load` reads it back as an identical layer (a net with adapters as its :meth:`merged`
        net: checkpoints keep the adapters apart). ``path`` may be a URI fsspec understands
        (``s3://bucket/run/export``; ``pip install tfnet[s3]``), with its ``storage_options``."""
        from tfnet.saving import write_export_folder

        write_export_folder(self.merged() if self._adapters else self, path, storage_options)

    def save_onnx(self, path: PathLike) -> None:
        """Writes the net as ONNX with the current weights, atomically, checked by ``onnx.checker``
        (a net with adapters: its :meth:`merged` net).

        A net made by :meth:`from_onnx` is written as the whole ONNX graph it came from (even if
        ``outputs`` chose other values). After :meth:`cut` and :meth:`add_head` it is written as the
        part of that graph the outputs need, followed by the Keras head as ONNX nodes (Dense,
        activations, Dropout, Flatten, pooling, BatchNormalization). See ``docs/onnx.md``.

        Raises:
            tfnet.onnx.NotOnnxNetError: the net's body did not come from ``from_onnx`` (a frozen
                graph, SavedModel or Keras model: use :meth:`save`).
            tfnet.onnx.OnnxExportError: the head holds an op with no ONNX mapping.
        """
        from tfnet.onnx.export import write_onnx

        write_onnx(self.merged() if self._adapters else self, path)

    def save_saved_model(self, path: PathLike) -> None:
        """Writes a SavedModel with a ``serving_default`` signature and the weights as variables (a net
        with adapters: its :meth:`merged` net)."""
        from tfnet.saving import write_saved_model

        write_saved_model(self.merged() if self._adapters else self, path)

    def frozen_graph_def(self, phase: str | None = None) -> graph_pb2.GraphDef:
        """The graph with the current weights baked in as constants (adapters folded in).

        Args:
            phase: ``None`` keeps the :attr:`phase_values` tensors as they are (the saved graph
                can still train); ``"inference"`` or ``"training"`` also bakes in their inference
                or training values, for a graph that serves on its own. Default: None.
        """
        if phase not in (None, "inference", "training"):
            raise ValueError(f"`phase` must be None, 'inference' or 'training'. Received: phase={phase!r}")
        graph_def = with_init_all_tables(gu.placeholders_to_consts(self._template, self._graph_weight_arrays()))
        if phase is None or not self._graph.phase_values:
            return graph_def
        index = 0 if phase == "training" else 1
        values = {name: np.asarray(pair[index], dtype=self._graph.phase_specs[name].dtype.as_numpy_dtype)
                  for name, pair in self._graph.phase_values.items()}
        return gu.bake_tensors(graph_def, values)

    def __repr__(self) -> str:
        n_params = sum(int(np.prod(v.shape)) for v in self._vars.values())
        n_train = sum(int(np.prod(self._vars[n].shape)) for n in self._trainable)
        return (
            f"TFNet(inputs={self.input_names}, outputs={self.output_names}, "
            f"weights={len(self._vars)} ({n_params:,} values, {n_train:,} trainable))"
        )


def _init_kwargs(kwargs) -> dict:
    """Maps the public keyword arguments onto ``_init``'s, refusing unknown ones."""
    allowed = {"trainable": "trainable", "relax_batch": "relax_batch", "fold_batch_norm": "fold", "name": "name",
               "phase_values": "phase_values"}
    unknown = set(kwargs) - set(allowed)
    if unknown:
        raise TypeError(f"Unknown arguments {sorted(unknown)}; expected some of {sorted(allowed)}.")
    return {allowed[k]: v for k, v in kwargs.items()}


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


def _variable_name(weight: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./-]", "_", weight)


def _copy(var: tf.Variable) -> np.ndarray:
    """A numpy copy of a variable. ``var.numpy()`` can share the variable's buffer on the CPU, so
    a later in-place update would change the array the caller holds."""
    return np.array(var.numpy(), copy=True)


def _dense_or_zeros(grad, source):
    if grad is None:
        return tf.zeros_like(source)
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad
