"""The state of a :class:`tfnet.TFNet`: the graph as a function (:class:`tfnet.graph_function.GraphFunction`)
and the ``tf.Variable`` s that hold its weights, their names, statistics, adapters, trainable selection, hooks
and compiled functions, as the public attributes of one :class:`NetState`.

A ``TFNet`` holds one (``net.state``) and delegates to functions of it: :mod:`tfnet.net_compute`,
:mod:`tfnet.net_surgery`, :mod:`tfnet.net_export` and :mod:`tfnet.net_loading` (see :mod:`tfnet.net`). This
module holds what every one of them needs: the state, its weight checks and its trainable selection.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import tensorflow as tf

from tfnet import regularizers
from tfnet.errors import NoWeightsError, WeightError, WeightTypeError, unknown_name_message
from tfnet.graph_function import GraphFunction
from tfnet.hooks import HookList
from tfnet.library import prepare_library
from tfnet.lora import Adapter, adapted_weights
from tfnet.parts import NetParts

TrainableSpec = Union[bool, str, "re.Pattern[str]", Iterable[str], Callable[[str], bool], None]

__all__ = ["NetState", "TrainableSpec", "copy_array"]


class NetState(tf.Module):
    """The graph, the weight variables and the trainable selection of a :class:`tfnet.TFNet`, built from
    :class:`NetParts` (weights keep the values given; the trainable selection is ``parts.trainable``, names the
    net lacks skipped, or every weight but the statistics). A ``tf.Module``, so its variables are tracked.

    Attributes:
        graph: The graph as a function of inputs and weights (:class:`tfnet.graph_function.GraphFunction`).
        tables: The lookup tables the graph reads (:mod:`tfnet.tables`), tracked for SavedModel export.
        weights: ``{weight name: tf.Variable}``: the graph's weights in graph order, then the adapters' two each.
        adapters: ``{target weight: Adapter}`` (:mod:`tfnet.lora`).
        lora_plan: ``(target index, a index, b index, Adapter)`` per adapter, for :func:`tfnet.lora.adapted_weights`.
        statistics: The weights holding normalisation statistics, in graph order.
        statistic_roles: ``{statistic: "mean" | "variance" | "statistic"}``.
        trainable: The names of the weights that train, in graph order.
        version: Goes up whenever the trainable selection or the hooks change.
        compiled: Functions compiled for this state, by key; cleared when :attr:`version` changes.
        forward_hooks, gradient_hooks, update_hooks: The hook lists (:class:`tfnet.hooks.HookList`).
        onnx_source: The ONNX model the net's body came from (:class:`tfnet.onnx.export.OnnxSource`), or None.
        keras_source: The Keras model the net came from, serialized (:mod:`tfnet.keras_source`), or None.
        regularizers: ``{weight name: Keras's serialized regularizer}`` (:mod:`tfnet.regularizers`).
        seed_step, seed_stream: The training steps taken and the stream (the rank) of the seeds of a Keras model's
            dropout and noise (:mod:`tfnet.keras_training`); ``seed_step`` is None without them.
    """

    def __init__(self, parts: NetParts):
        super().__init__(name=parts.name)
        template = parts.template
        prepare_library(template)
        extra = {n for ad in parts.adapters for n in (ad.a, ad.b)}
        weight_names = [n.name for n in template.node if n.name in parts.values and n.name not in extra]
        self.graph = GraphFunction(template, list(parts.input_names), list(parts.output_names), weight_names,
                                   fold=parts.fold, phase_values=parts.phase_values, loss_names=parts.losses,
                                   seed_inputs=parts.seed_inputs, updates=parts.updates)
        self.tables = list(self.graph.tables.tables.values())
        with tf.init_scope():
            self.weights = {
                w: tf.Variable(np.asarray(parts.values[w]), name=_variable_name(w), trainable=False, dtype=spec.dtype)
                for w, spec in zip(weight_names, self.graph.weight_specs)
            }
        self.adapters: dict[str, Adapter] = {}
        self.lora_plan: list[tuple[int, int, int, Adapter]] = []
        self._add_adapters(parts.adapters, parts.values)
        detected = set(parts.statistics)
        self.statistics = [s for s in weight_names if s in detected]
        roles = parts.statistics if isinstance(parts.statistics, Mapping) else {}
        self.statistic_roles = {s: roles.get(s, "statistic") for s in self.statistics}
        stats = set(self.statistics)
        self.trainable = [w for w in self.weights if w not in stats]
        self.version = 0
        self.compiled: dict[Any, Callable] = {}
        self.forward_hooks = HookList(self.changed)
        self.gradient_hooks = HookList(self.changed)
        self.update_hooks = HookList(self.changed)
        self.onnx_source = parts.onnx_source
        self.keras_source: str | None = None
        self.keep_regularizers(parts.regularizers or {})
        #: The training steps taken, for the seeds of a Keras model's dropout and noise (:mod:`tfnet.keras_training`;
        #: None without them); the training step adds one. ``seed_stream``: this process's stream of them (the rank).
        self.seed_step = None
        if self.graph.seed_inputs:
            with tf.init_scope():
                self.seed_step = tf.Variable(int(parts.seed_step), dtype=tf.int64, trainable=False, name="seed_step")
        self.seed_stream = 0
        if parts.trainable is not None:
            self.set_trainable_names([t for t in parts.trainable if t in self.weights])

    def _add_adapters(self, adapters: Sequence[Adapter], values: Mapping[str, Any]) -> None:
        """Adds each adapter's two variables (after the graph's weights) from ``values``."""
        with tf.init_scope():
            for adapter in adapters:
                if adapter.target not in self.weights or adapter.target in self.adapters:
                    raise WeightError(f"Adapter for {adapter.target!r}: no such base weight, or it has one already.")
                base = self.weights[adapter.target]
                for name, shape in zip((adapter.a, adapter.b), adapter.shapes(base.shape)):
                    value = np.asarray(values[name])
                    if value.shape != shape:
                        raise WeightError(f"Adapter weight {name!r} has shape {shape}; received shape {value.shape}.")
                    self.weights[name] = tf.Variable(value, name=_variable_name(name), trainable=False,
                                                     dtype=base.dtype)
                self.adapters[adapter.target] = adapter
        index = {n: i for i, n in enumerate(self.weights)}
        self.lora_plan = [(index[ad.target], index[ad.a], index[ad.b], ad) for ad in self.adapters.values()]

    def changed(self) -> None:
        """The trainable selection or the hooks changed: compiled functions must retrace."""
        self.version += 1
        self.compiled.clear()

    # ------------------------------------------------------------------ weights

    def weight_specs(self) -> list[tf.TensorSpec]:
        """One spec per weight, in :attr:`weights` order (the graph's, then the adapters)."""
        count = len(self.graph.weight_specs)
        extra = [tf.TensorSpec(v.shape, v.dtype) for v in list(self.weights.values())[count:]]
        return list(self.graph.weight_specs) + extra

    def weight_values(self) -> list[tf.Tensor]:
        """Every weight's current value, in :attr:`weights` order."""
        return [v.value() for v in self.weights.values()]

    def graph_weight_arrays(self) -> dict[str, np.ndarray]:
        """The values the graph's weight placeholders are fed, as numpy copies (adapters folded in)."""
        names = self.graph.weight_names
        if not self.adapters:
            return {n: copy_array(self.weights[n]) for n in names}
        fed = adapted_weights(self.weight_values(), self.lora_plan, len(names))
        return {n: np.array(t.numpy(), copy=True) for n, t in zip(names, fed)}

    def get_weights(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Returns copies of the weights (all, or the given names) as numpy arrays."""
        names = list(self.weights) if names is None else [self.check_weight_name(n) for n in names]
        return {n: copy_array(self.weights[n]) for n in names}

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Sets some or all weights. Names, shapes and dtypes are all checked before any is set.

        Raises:
            WeightError: an unknown name or a wrong shape.
            WeightTypeError: a value that is not a float array.
        """
        for name, value in self.check_weight_values(weights, "set_weights").items():
            self.weights[name].assign(value)

    def check_weight_name(self, name: str) -> str:
        """The weight's name (``"w:0"`` is ``"w"``).

        Raises:
            WeightError: not a weight; the message lists the closest names.
            NoWeightsError: the graph has no weights.
        """
        if not isinstance(name, str):
            raise WeightError(f"Weight names are strings. Received: {name!r}")
        key = name[:-2] if name.endswith(":0") and name[:-2] in self.weights else name
        if key not in self.weights:
            if not self.weights:
                raise NoWeightsError(f"Unknown weight {name!r}: this graph has no weights.")
            raise WeightError(unknown_name_message("weight", name, self.weights))
        return key

    def check_weight_values(self, weights: Mapping[str, Any], what: str) -> dict[str, tf.Tensor]:
        """``{weight name: tensor of the weight's dtype}``, every name, dtype and shape checked (``what`` names
        the caller in the messages)."""
        if not isinstance(weights, Mapping):
            raise TypeError(f"{what} takes a dict of name -> array. Received: {type(weights).__name__}")
        checked = {}
        for name, value in weights.items():
            key = self.check_weight_name(name)
            var = self.weights[key]
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
                raise WeightError(f"{what}: weight {key!r} has shape {tuple(var.shape)}; received shape {shape}.")
            checked[key] = tf.cast(value, var.dtype)
        return checked

    # ------------------------------------------------------------------ the trainable selection

    def select_trainable(self, spec: TrainableSpec) -> None:
        """Sets :attr:`trainable` from what ``TFNet.trainable`` takes (see :attr:`tfnet.TFNet.trainable`)."""
        if not self.weights:
            raise NoWeightsError(
                "This graph has no weights (no float constants of rank >= 1), so nothing can be "
                "trained. It still works as a fixed function through forward()."
            )
        stats = set(self.statistics)
        names = list(self.weights)
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
                    f"No weight name starts with {spec!r}. " + unknown_name_message("weight prefix", spec, names)
                )
        elif isinstance(spec, re.Pattern):
            chosen = [n for n in names if spec.search(n) and n not in stats]
            if not chosen:
                raise WeightError(f"No weight name matches {spec.pattern!r}. Weights: {names[:10]}")
        elif callable(spec):
            chosen = [n for n in names if spec(n) and n not in stats]
        elif isinstance(spec, Iterable):
            wanted = {self.check_weight_name(n) for n in spec}
            chosen = [n for n in names if n in wanted]
        else:
            raise TypeError(
                "`trainable` takes a list of names, a prefix string, a compiled regex, a callable or "
                f"a bool. Received: {spec!r}"
            )
        self.set_trainable_names(chosen)

    def set_trainable_names(self, chosen: Sequence[str]) -> None:
        """Exactly the named weights train (statistics too, if named)."""
        named = set(chosen)
        self.trainable = [n for n in self.weights if n in named]
        self.changed()

    # ------------------------------------------------------------------ regularizers

    def set_regularizers(self, mapping: Mapping[str, Any]) -> None:
        """Exactly these weights are regularized: ``{weight name: regularizer}``, each what
        ``keras.regularizers.get`` takes (a ``Regularizer``, ``"l2"``, a config dict), or None to leave it out."""
        if not isinstance(mapping, Mapping):
            raise TypeError("`regularizers` must be a dict {weight name: Keras regularizer}. "
                            f"Received: {type(mapping).__name__}")
        chosen = {}
        for name, reg in mapping.items():
            key = self.check_weight_name(name)
            if reg is not None:
                chosen[key] = regularizers.serialized(key, reg)
        self.keep_regularizers(chosen)
        self.changed()

    def keep_regularizers(self, configs: Mapping[str, Mapping]) -> None:
        """:attr:`regularizers` from Keras's serialized ones (a source's, a saved net's), in weight order; names the
        net lacks are skipped. The rebuilt regularizers are rebuilt again when next needed."""
        self.regularizers = {n: dict(configs[n]) for n in self.weights if n in configs}
        self._regularizer_fns: dict[str, Callable] | None = None

    def regularizer_fns(self) -> dict[str, Callable]:
        """``{weight name: regularizer}``, rebuilt from :attr:`regularizers` once.

        Raises:
            RegularizerError: Keras cannot rebuild one here (:func:`tfnet.regularizers.rebuild`).
        """
        if self._regularizer_fns is None:
            self._regularizer_fns = {n: regularizers.rebuild(n, c) for n, c in self.regularizers.items()}
        return self._regularizer_fns

    def seed_steps(self) -> int:
        """The training steps counted for the seeds of a Keras model's dropout and noise (:attr:`seed_step`), 0
        without them: what a copy of the net (saved, shipped, cut) goes on from."""
        return 0 if self.seed_step is None else int(self.seed_step.numpy())

    def regularization_loss(self) -> tf.Tensor:
        """What Keras adds to the loss for the weights' regularizers: the sum over the trainable weights that have
        one, at their current values (float32; 0 where none has one)."""
        total = regularizers.penalty(self.regularizer_fns(), {n: v.value() for n, v in self.weights.items()},
                                     self.trainable)
        return tf.constant(0.0, tf.float32) if total is None else total


def _variable_name(weight: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./-]", "_", weight)


def copy_array(var: tf.Variable) -> np.ndarray:
    """A numpy copy of a variable. ``var.numpy()`` can share the variable's buffer on the CPU, so
    a later in-place update would change the array the caller holds."""
    return np.array(var.numpy(), copy=True)
