"""TFNet: a frozen TensorFlow graph as a layer with explicit, trainable weights.

The float constants that hold a frozen graph's weights are turned into placeholders, and the graph
becomes a pure function ``f(inputs, weights) -> outputs`` that is imported (``import_graph_def`` with
an ``input_map``) into whichever ``tf.function`` calls it. The weights live in ``tf.Variable`` s that
the layer owns. ``tf.GradientTape`` differentiates straight through the imported ops.

:class:`TFNet` is a facade over mixins, one module per concern:

* :mod:`tfnet.net_state`: the graph as a function, the weight variables, the trainable selection;
* :mod:`tfnet.net_compute`: forward, backward, weight updates and hooks;
* :mod:`tfnet.net_loading`: the constructors (frozen graph, Keras, SavedModel, export folder, ONNX);
* :mod:`tfnet.net_surgery`: ``cut``, ``add_head`` and the low-rank adapters;
* :mod:`tfnet.net_export`: ``save``, ``save_onnx``, ``save_saved_model``, ``frozen_graph_def``.

This module imports those; none of them imports this one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tensorflow.core.framework import graph_pb2

from tfnet.graph_io import PathLike
from tfnet.net_compute import NetCompute
from tfnet.net_export import NetExport
from tfnet.net_loading import NetLoading
from tfnet.net_state import TrainableSpec
from tfnet.parts import NetParts
from tfnet.step import TrainStep
from tfnet.summary import summary as summary_table
from tfnet.summary import tensor_names as graph_tensor_names

__all__ = ["TFNet", "TrainableSpec"]


class TFNet(NetLoading, NetExport, NetCompute):
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

    Internal interface, for tfnet's own modules (step, serialize, saving, onnx export); public
    names so that no module reads another's private members, but not part of the user-facing API:

    * :attr:`graph`: the :class:`tfnet.graph_function.GraphFunction` (``graph.fold``, ``graph.v1_loops``,
      ``graph.folded``); :attr:`template`: the weightless ``GraphDef``;
    * :attr:`version`: goes up when the trainable selection or the hooks change (compiled steps retrace);
    * :attr:`tables`: the lookup tables the graph reads; :attr:`onnx_source`: the ONNX model behind a
      net from :meth:`from_onnx`, or None;
    * :meth:`run_graph` ``(inputs, weights, training)``: the graph imported into the function being
      traced; :meth:`pure_function` ``(training)``: that, compiled; :meth:`v1_vjp`: gradients of graphs
      with v1 loops; :meth:`pack`: one output as a tensor, several as a list;
    * :attr:`forward_hooks`, :attr:`gradient_hooks`, :attr:`update_hooks`: the hook lists
      (:class:`tfnet.hooks.HookList`);
    * :meth:`from_parts` ``(NetParts)``: a net from a weightless graph and its weights' values
      (:class:`tfnet.parts.NetParts`).

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
        self._load_graph_def(graph_def, inputs, outputs, weights=weights, trainable=trainable,
                             relax_batch=relax_batch, fold_batch_norm=fold_batch_norm, phase_values=phase_values,
                             name=name)

    def _derived(self, parts: NetParts) -> TFNet:
        """The net that ``cut``, ``add_head``, ``with_lora`` and ``merged`` return: a ``TFNet``."""
        return TFNet.from_parts(parts)

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
        step = self._compiled.get(key)
        if step is None:
            step = TrainStep(self, loss_fn, transform, reducer=reducer, precision=precision)
            self._compiled[key] = step
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
