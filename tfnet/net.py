"""TFNet: a frozen TensorFlow graph as a layer with explicit, trainable weights.

The float constants that hold a frozen graph's weights are turned into placeholders, and the graph
becomes a pure function ``f(inputs, weights) -> outputs`` that is imported (``import_graph_def`` with
an ``input_map``) into whichever ``tf.function`` calls it. The weights live in ``tf.Variable`` s that
the layer owns. ``tf.GradientTape`` differentiates straight through the imported ops.

:class:`TFNet` holds one state object and delegates to modules of functions over it:

* :mod:`tfnet.net_state`: :class:`~tfnet.net_state.NetState`, the graph as a function, the weight
  variables, the trainable selection, the hooks (public attributes; ``net.state``);
* :mod:`tfnet.net_compute`: forward, backward, weight updates and hooks, as functions of the state;
* :mod:`tfnet.net_loading`: the constructors (frozen graph, Keras, SavedModel, export folder, ONNX);
* :mod:`tfnet.net_surgery`: ``cut``, ``add_head`` and the low-rank adapters (each describes the new net
  as :class:`tfnet.parts.NetParts`, which this class builds);
* :mod:`tfnet.net_export`: ``save``, ``save_onnx``, ``save_saved_model``, ``frozen_graph_def``.

This module imports those; none of them imports this one. A method here that has no body of its own is the
function of the same name there (its docstring and signature too).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfnet import net_compute, net_export, net_loading, net_surgery
from tfnet.graph_function import GraphFunction
from tfnet.graph_io import PathLike
from tfnet.hooks import HookList
from tfnet.inputs import NARROW_DTYPES, taken_as_is
from tfnet.lora import Adapter
from tfnet.net_state import NetState, TrainableSpec
from tfnet.parts import NetParts
from tfnet.regularizers import plain as plain_config
from tfnet.step import TrainStep
from tfnet.summary import summary as summary_table
from tfnet.summary import tensor_names as graph_tensor_names

__all__ = ["TFNet", "TrainableSpec"]


def _on_state(fn: Callable) -> Callable:
    """``fn(state, ...)`` as a method: ``net.f(...)`` is ``fn(net.state, ...)``, with ``fn``'s name, docstring
    and signature (less the state)."""

    def method(self, *args, **kwargs):
        return fn(self.state, *args, **kwargs)

    return functools.update_wrapper(method, fn)


def _new_net(fn: Callable) -> Callable:
    """``fn(state, ...) -> NetParts`` as a method that returns the :class:`TFNet` built from them."""

    def method(self, *args, **kwargs):
        return TFNet.from_parts(fn(self.state, *args, **kwargs))

    functools.update_wrapper(method, fn)
    method.__annotations__ = {**fn.__annotations__, "return": "TFNet"}
    method.__signature__ = inspect.signature(fn).replace(return_annotation="TFNet")
    return method


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
        losses: Tensor names of losses the training step adds to its loss, each summed (a TF1 graph's
            regularization loss, say): what Keras's ``fit`` adds as ``model.losses``. ``from_keras`` names those the
            model's ``call`` adds (``activity_regularizer``, ``add_loss``) itself. See :attr:`loss_names`.
            Default: none.
        seed_inputs: int64 tensors of shape ``(2,)`` that each training step feeds ``[stream, step]`` (the rank, and
            the steps the net has taken), for random ops that must draw new values at each step: the seed offset of a
            Keras model's dropout and noise layers (``from_keras`` names them, :mod:`tfnet.keras_training`). Default:
            none.
        updates: ``{tensor name: weight name}``: tensors the training step computes beside the outputs (with the
            phase tensors at their training values) and assigns to those weights after each finite step, the way a
            TF1 graph's ``UPDATE_OPS`` update a batch norm's moving statistics. ``from_keras(train_batch_norm=True)``
            names them itself. See :attr:`updates`. Default: none.
        name: The module name. Default: ``"tfnet"``.

    Internal interface, for tfnet's own modules (step, serialize, saving, onnx export); public
    names so that no module reads another's private members, but not part of the user-facing API:

    * :attr:`graph`: the :class:`tfnet.graph_function.GraphFunction` (``graph.fold``, ``graph.v1_loops``,
      ``graph.folded``); :attr:`template`: the weightless ``GraphDef``;
    * :attr:`version`: goes up when the trainable selection or the hooks change (compiled steps retrace);
    * :attr:`tables`: the lookup tables the graph reads; :attr:`onnx_source`: the ONNX model behind a
      net from :meth:`from_onnx`, or None;
    * :meth:`run_graph` ``(inputs, weights, training)``: the graph imported into the function being
      traced (narrow integer inputs cast first: :meth:`cast_inputs`); :meth:`pure_function` ``(training,
      dtypes)``: that, compiled; :meth:`compiled_vjp`: the vector-Jacobian product ``backward`` runs
      (the step's, for graphs with v1 loops); :meth:`pack`: one output as a tensor, several as a list;
    * :attr:`forward_hooks`, :attr:`gradient_hooks`, :attr:`update_hooks`: the hook lists
      (:class:`tfnet.hooks.HookList`);
    * :meth:`from_parts` ``(NetParts)``: a net from a weightless graph and its weights' values
      (:class:`tfnet.parts.NetParts`); :meth:`from_state` ``(NetState)``: the net holding that state;
    * :attr:`state`: the :class:`tfnet.net_state.NetState` behind all of these, with public attributes
      (``state.weights``, ``state.trainable``, ``state.compiled``, ...).

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
        losses: str | Sequence[str] = (),
        seed_inputs: str | Sequence[str] = (),
        updates: Mapping[str, str] | None = None,
        name: str = "tfnet",
    ):
        self._hold(net_loading.graph_def_state(
            graph_def, inputs, outputs, weights, trainable=trainable, relax_batch=relax_batch,
            fold_batch_norm=fold_batch_norm, phase_values=phase_values, losses=losses,
            seed_inputs=seed_inputs, updates=updates, name=name))

    def _hold(self, state: NetState) -> None:
        super().__init__(name=state.name)
        #: The :class:`tfnet.net_state.NetState` every method works on (internal interface).
        self.state = state

    @classmethod
    def from_state(cls, state: NetState) -> TFNet:
        """The net holding ``state`` (internal interface: the constructors build the state, then the net)."""
        net = cls.__new__(cls)
        net._hold(state)
        return net

    @classmethod
    def from_parts(cls, parts: NetParts) -> TFNet:
        """A net from :class:`NetParts` (internal interface: surgery, :mod:`tfnet.serialize` and
        :mod:`tfnet.onnx.build` build nets with it). Weights keep the values given; the trainable
        selection is ``parts.trainable`` (names the net lacks are skipped) or the default."""
        return cls.from_state(NetState(parts))

    from_frozen_graph = classmethod(net_loading.from_frozen_graph)
    from_keras = classmethod(net_loading.from_keras)
    from_saved_model = classmethod(net_loading.from_saved_model)
    from_export_folder = classmethod(net_loading.from_export_folder)
    load = from_export_folder
    from_onnx = classmethod(net_loading.from_onnx)

    # ------------------------------------------------------------------ internal interface

    @property
    def graph(self) -> GraphFunction:
        """The graph as a function of inputs and weights (internal interface)."""
        return self.state.graph

    @property
    def template(self) -> graph_pb2.GraphDef:
        """The weightless graph, each weight a placeholder (internal interface)."""
        return self.state.graph.template

    @property
    def version(self) -> int:
        """Goes up whenever the trainable selection or the hooks change, so compiled functions
        that traced them know to retrace (internal interface)."""
        return self.state.version

    @property
    def tables(self) -> list:
        """The lookup tables the graph reads (:mod:`tfnet.tables`), for SavedModel export (internal interface)."""
        return list(self.state.tables)

    @property
    def onnx_source(self):
        """The ONNX model the net's body came from (:class:`tfnet.onnx.export.OnnxSource`), or None
        (internal interface: ``save_onnx``)."""
        return self.state.onnx_source

    @property
    def keras_source(self) -> str | None:
        """The Keras model the net came from, serialized (:mod:`tfnet.keras_source`; :meth:`from_keras` sets it),
        for :meth:`to_keras`; None for other nets and after graph surgery."""
        return self.state.keras_source

    @keras_source.setter
    def keras_source(self, value: str | None) -> None:
        self.state.keras_source = value

    run_graph = _on_state(net_compute.run_graph)
    pure_function = _on_state(net_compute.pure_function)
    cast_inputs = _on_state(net_compute.cast_inputs)
    compiled_vjp = _on_state(net_compute.compiled_vjp)
    pack = staticmethod(net_compute.pack)

    @property
    def forward_hooks(self) -> HookList:
        """The forward hooks, in the order they run (internal interface; register with
        :meth:`register_forward_hook`)."""
        return self.state.forward_hooks

    @property
    def gradient_hooks(self) -> HookList:
        """The gradient hooks, in the order they run (internal interface)."""
        return self.state.gradient_hooks

    @property
    def update_hooks(self) -> HookList:
        """The update hooks, in the order they run (internal interface)."""
        return self.state.update_hooks

    # ------------------------------------------------------------------ names and specs

    @property
    def input_names(self) -> list[str]:
        """Input tensor names (``"name:0"``), in the order inputs are passed."""
        return list(self.state.graph.input_names)

    @property
    def output_names(self) -> list[str]:
        """Output tensor names, in the order outputs are returned."""
        return list(self.state.graph.output_names)

    @property
    def loss_names(self) -> list[str]:
        """The tensors whose sums the training step (and evaluation) adds to the loss, beside the outputs: the losses a
        Keras model's ``call`` adds (``activity_regularizer``, ``add_loss``; named ``added_loss_<i>``), as Keras's
        ``fit`` and ``evaluate`` add ``model.losses``, or a frozen graph's given as ``losses``. ``forward(x,
        return_losses=True)`` computes them. Empty for most nets."""
        return list(self.state.graph.loss_names)

    @property
    def updates(self) -> dict[str, str]:
        """``{tensor: weight}``: what the training step assigns to a weight after each finite step (a Keras batch
        norm's moving mean and variance, ``keras_update_<i>``, where ``from_keras(train_batch_norm=True)``, as Keras's
        ``fit`` updates them). On several ranks each rank updates its own copy, as Horovod's Keras training does; the
        driver's net gets rank 0's. ``forward(x, training=True)`` computes with the training phase but assigns
        nothing. Empty for most nets."""
        return dict(self.state.graph.updates)

    @property
    def input_specs(self) -> list[tf.TensorSpec]:
        """dtype and shape of each input (dimension 0, the batch, is usually ``None``)."""
        return list(self.state.graph.input_specs)

    @property
    def input_dtypes(self) -> dict[str, tuple[str, ...]]:
        """``{input name: the dtypes it takes into the graph as they are}``: its own, and for a float input the
        narrow integers (:data:`tfnet.inputs.NARROW_DTYPES`: uint8 pixels first), which :meth:`forward` and a
        training step cast inside the graph, so a batch crosses to the graph at a quarter of the bytes. Any other
        number is converted to the input's dtype before (a float64 array to float32)."""
        return {n: (s.dtype.name,) + tuple(d for d in NARROW_DTYPES if taken_as_is(s.dtype, d))
                for n, s in zip(self.state.graph.input_names, self.state.graph.input_specs)}

    @property
    def output_specs(self) -> list[tf.TensorSpec]:
        return list(self.state.graph.output_specs)

    @property
    def phase_values(self) -> dict[str, tuple]:
        """``{tensor name: (training value, inference value)}``, as given to the constructor."""
        return dict(self.state.graph.phase_values)

    # ------------------------------------------------------------------ weights

    @property
    def weight_names(self) -> list[str]:
        """Every weight's name: the graph's in graph order, then the adapters' (:meth:`with_lora`)."""
        return list(self.state.weights)

    @property
    def statistic_names(self) -> list[str]:
        """Weights holding batch-norm statistics (frozen unless named explicitly)."""
        return list(self.state.statistics)

    @property
    def statistics(self) -> dict[str, str]:
        """What was detected as normalisation statistics, by graph structure: ``{weight: role}``
        with role ``"mean"`` or ``"variance"`` (``"statistic"`` when carried over from a net this
        one was cut from or extended). These are frozen by default, as the original framework
        does not train them."""
        return dict(self.state.statistic_roles)

    @property
    def weight_variables(self) -> dict[str, tf.Variable]:
        """The ``tf.Variable`` behind each weight, by name."""
        return dict(self.state.weights)

    @property
    def trainable_variables(self) -> tuple[tf.Variable, ...]:
        return tuple(self.state.weights[n] for n in self.state.trainable)

    get_weights = _on_state(NetState.get_weights)
    set_weights = _on_state(NetState.set_weights)

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
        return list(self.state.trainable)

    @trainable.setter
    def trainable(self, spec: TrainableSpec) -> None:
        self.state.select_trainable(spec)

    @property
    def regularizers(self) -> dict[str, dict]:
        """``{weight name: Keras's serialized regularizer}``: what the training step adds to the loss, as Keras's
        ``fit`` adds ``model.losses`` (for the *trainable* ones among them; :mod:`tfnet.regularizers`).
        :meth:`from_keras` takes them from the model's variables (``kernel_regularizer``, ``bias_regularizer``, ...).

        Set it with ``{weight name: regularizer}``, each what ``keras.regularizers.get`` takes
        (``keras.regularizers.L2(1e-4)``, ``"l2"``, a config dict); ``{}`` for none.

        Raises (setting):
            WeightError: a name that is not a weight.
            RegularizerError: a regularizer Keras cannot take or rebuild.
        """
        return {n: plain_config(c) for n, c in self.state.regularizers.items()}

    @regularizers.setter
    def regularizers(self, mapping) -> None:
        self.state.set_regularizers(mapping)

    regularization_loss = _on_state(NetState.regularization_loss)

    # ------------------------------------------------------------------ compute, surgery, export

    prepare_inputs = _on_state(net_compute.prepare_inputs)
    __call__ = _on_state(net_compute.call)
    forward = _on_state(net_compute.forward)
    backward = _on_state(net_compute.backward)
    apply_updates = _on_state(net_compute.apply_updates)
    register_forward_hook = _on_state(net_compute.register_forward_hook)
    register_gradient_hook = _on_state(net_compute.register_gradient_hook)
    register_update_hook = _on_state(net_compute.register_update_hook)

    @property
    def hooks(self) -> dict[str, tuple[Callable, ...]]:
        """The registered hooks by kind, each in the order they run: ``{"forward": (...), "gradient":
        (...), "update": (...)}`` (read-only; register and remove them through the methods)."""
        return net_compute.hooks(self.state)

    cut = _new_net(net_surgery.cut)
    add_head = _new_net(net_surgery.add_head)
    with_lora = _new_net(net_surgery.with_lora)
    merged = _new_net(net_surgery.merged)
    lora_candidates = _on_state(net_surgery.lora_candidates)

    @property
    def adapters(self) -> dict[str, Adapter]:
        """``{target weight: Adapter}`` (target, rank, alpha, layout; ``.a`` and ``.b`` name its weights),
        empty for a net without adapters."""
        return dict(self.state.adapters)

    @property
    def adapter_names(self) -> list[str]:
        """The adapters' weight names (``<W>/lora_a``, ``<W>/lora_b`` for each target)."""
        return net_surgery.adapter_names(self.state)

    save = net_export.save
    save_onnx = net_export.save_onnx
    save_saved_model = net_export.save_saved_model
    to_keras = _on_state(net_export.to_keras)
    frozen_graph_def = _on_state(net_export.frozen_graph_def)

    # ------------------------------------------------------------------ training and inspection

    def train_step(self, loss_fn: Callable, transform, *, reducer: Callable | None = None, precision: str = "fp32"):
        """Compiles forward, loss, backward, gradient hooks, update and update hooks into one
        ``tf.function``. See :class:`tfnet.step.TrainStep`.

        ``precision="bf16"`` computes forward and backward in bfloat16 with float32 master weights,
        optimiser state and loss (:mod:`tfnet.precision`); default ``"fp32"``.

        The step is cached: the same ``loss_fn``, ``transform``, ``reducer`` and ``precision`` give
        the same compiled step until the trainable set or the hooks change.

        Args:
            loss_fn: ``loss_fn(targets, outputs) -> scalar``.
            transform: The optimiser (``init(params)`` and ``update(grads, state, params)``), or a
                float learning rate for plain SGD.
            reducer: ``(grads, loss) -> (grads, loss)`` run between backward and update (a gradient
                exchange across ranks). Default: None.
            precision: ``"fp32"`` or ``"bf16"``. Default: ``"fp32"``.
        """
        key = ("train_step", id(loss_fn), id(transform), id(reducer), precision)
        step = self.state.compiled.get(key)
        if step is None:
            step = TrainStep(self, loss_fn, transform, reducer=reducer, precision=precision)
            self.state.compiled[key] = step
        return step

    def summary(self, print_fn=print, line_length: int = 100) -> str:
        """A Keras-style table: inputs and outputs (names, shapes, dtypes), every weight (shape,
        values, trainable, frozen or a statistic), the totals, and the graph's ops. Printed with
        ``print_fn`` (None: only returned)."""
        return summary_table(self, print_fn, line_length)

    def tensor_names(self, op_types=None, contains: str | None = None, include_plumbing: bool = False) -> list[str]:
        """The graph's tensor names in graph order: where :meth:`cut` can end the net. Filter by op
        type (``op_types=["Relu"]``) or by text (``contains="block5"``); plumbing ops (constants,
        identities, reshapes, shape arithmetic) are left out unless ``include_plumbing``."""
        return graph_tensor_names(self, op_types, contains, include_plumbing)

    def __repr__(self) -> str:
        weights = self.state.weights
        n_params = sum(int(np.prod(v.shape)) for v in weights.values())
        n_train = sum(int(np.prod(weights[n].shape)) for n in self.state.trainable)
        return (
            f"TFNet(inputs={self.input_names}, outputs={self.output_names}, "
            f"weights={len(weights)} ({n_params:,} values, {n_train:,} trainable))"
        )
