"""The state of a :class:`tfnet.TFNet`: the graph as a function (:class:`tfnet.graph_function.GraphFunction`)
and the ``tf.Variable`` s that hold its weights, their names, specs, statistics and trainable selection.

:class:`NetState` is the base of ``TFNet``'s mixins (see :mod:`tfnet.net`). It also holds the part of
the internal interface that tfnet's own modules (:mod:`tfnet.step`, :mod:`tfnet.serialize`,
:mod:`tfnet.saving`, :mod:`tfnet.onnx`) read: :attr:`NetState.graph`, :attr:`NetState.template`,
:attr:`NetState.version`, :attr:`NetState.tables`, :attr:`NetState.onnx_source` and
:meth:`NetState.from_parts`, which builds a net from a :class:`tfnet.parts.NetParts`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfnet.errors import NoWeightsError, WeightError, WeightTypeError, unknown_name_message
from tfnet.graph_function import GraphFunction
from tfnet.hooks import HookList
from tfnet.library import prepare_library
from tfnet.lora import Adapter, adapted_weights
from tfnet.parts import NetParts

TrainableSpec = Union[bool, str, "re.Pattern[str]", Iterable[str], Callable[[str], bool], None]

__all__ = ["NetState", "TrainableSpec", "copy_array"]


class NetState(tf.Module):
    """The graph, the weight variables and the trainable selection of a :class:`tfnet.TFNet`.

    Not built directly: ``TFNet``'s constructors call :meth:`_setup` (or :meth:`from_parts`).
    """

    @classmethod
    def from_parts(cls, parts: NetParts):
        """A net from :class:`NetParts` (internal interface: surgery, :mod:`tfnet.serialize` and
        :mod:`tfnet.onnx.build` build nets with it). Weights keep the values given; the trainable
        selection is ``parts.trainable`` (names the net lacks are skipped) or the default."""
        net = cls.__new__(cls)
        net._setup(parts.template, list(parts.input_names), list(parts.output_names), parts.values, parts.statistics,
                   name=parts.name, fold=parts.fold, phase_values=parts.phase_values, adapters=parts.adapters,
                   onnx_source=parts.onnx_source)
        if parts.trainable is not None:
            net._set_trainable_names([t for t in parts.trainable if t in net._vars])
        return net

    def _setup(self, template, input_names, output_names, values, statistics, name="tfnet", fold=True,
               phase_values=None, adapters=(), onnx_source=None):
        """Builds the graph function and one variable per weight (then the adapters' two each)."""
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
        self._onnx_source = onnx_source
        #: The Keras model the net came from, serialized (tfnet.keras_source; :meth:`from_keras` sets it), for
        #: ``to_keras``; None for other nets and after graph surgery.
        self.keras_source: str | None = None

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

    # ------------------------------------------------------------------ internal interface

    @property
    def graph(self) -> GraphFunction:
        """The graph as a function of inputs and weights (internal interface)."""
        return self._graph

    @property
    def template(self) -> graph_pb2.GraphDef:
        """The weightless graph, each weight a placeholder (internal interface)."""
        return self._graph.template

    @property
    def version(self) -> int:
        """Goes up whenever the trainable selection or the hooks change, so compiled functions
        that traced them know to retrace (internal interface)."""
        return self._version

    @property
    def tables(self) -> list:
        """The lookup tables the graph reads (:mod:`tfnet.tables`), for SavedModel export (internal interface)."""
        return list(self._tables)

    @property
    def onnx_source(self):
        """The ONNX model the net's body came from (:class:`tfnet.onnx.export.OnnxSource`), or None
        (internal interface: ``save_onnx``)."""
        return self._onnx_source

    # ------------------------------------------------------------------ names and specs

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

    # ------------------------------------------------------------------ weights

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
        return {n: copy_array(self._vars[n]) for n in names}

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

    def _weight_values(self) -> list[tf.Tensor]:
        return [v.value() for v in self._vars.values()]

    def _graph_weight_arrays(self) -> dict[str, np.ndarray]:
        """The values the graph's weight placeholders are fed, as numpy copies (adapters folded in)."""
        names = self._graph.weight_names
        if not self._adapters:
            return {n: copy_array(self._vars[n]) for n in names}
        fed = adapted_weights(self._weight_values(), self._lora_plan, len(names))
        return {n: np.array(t.numpy(), copy=True) for n, t in zip(names, fed)}

    # ------------------------------------------------------------------ the trainable selection

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

    def __repr__(self) -> str:
        n_params = sum(int(np.prod(v.shape)) for v in self._vars.values())
        n_train = sum(int(np.prod(self._vars[n].shape)) for n in self._trainable)
        return (
            f"TFNet(inputs={self.input_names}, outputs={self.output_names}, "
            f"weights={len(self._vars)} ({n_params:,} values, {n_train:,} trainable))"
        )


def _variable_name(weight: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./-]", "_", weight)


def copy_array(var: tf.Variable) -> np.ndarray:
    """A numpy copy of a variable. ``var.numpy()`` can share the variable's buffer on the CPU, so
    a later in-place update would change the array the caller holds."""
    return np.array(var.numpy(), copy=True)
