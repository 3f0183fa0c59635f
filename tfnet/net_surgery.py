"""Graph surgery on a :class:`tfnet.TFNet`: new nets cut from it (:func:`cut`), extended by a Keras head
(:func:`add_head`), given low-rank adapters (:func:`with_lora`) or with the adapters folded in (:func:`merged`).

Each is a function of the net's :class:`tfnet.net_state.NetState` that describes the new net as
:class:`tfnet.parts.NetParts`; ``TFNet``'s methods of the same names build the net from them
(``TFNet.from_parts``), so this module need not import the facade. The net operated on is left as it was;
its weights are copied.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfnet import graph_utils as gu
from tfnet import lora
from tfnet.errors import InputSpecError, WeightError
from tfnet.graph_function import used_tensors
from tfnet.head import freeze_head
from tfnet.inputs import as_name_list
from tfnet.net_state import NetState, copy_array
from tfnet.parts import NetParts
from tfnet.statistics import find_statistics

__all__ = ["adapter_names", "add_head", "cut", "lora_candidates", "merged", "with_lora"]


def cut(state: NetState, tensor_names: str | Sequence[str]) -> NetParts:
    """Returns a new TFNet that ends at the given tensor(s), such as the features before a
    classifier. Weights past the cut are dropped; the rest keep their current values and
    trainable state."""
    outputs = gu.check_tensor_names(state.graph.template, as_name_list(tensor_names, "tensor_names"), "cut")
    feeds = list(state.graph.input_names) + list(state.graph.phase_values)
    losses = _within(state, outputs, feeds, state.graph.loss_names)
    updates = {t: state.graph.updates[t] for t in _within(state, outputs, feeds, state.graph.update_names)}
    template = gu.subgraph(state.graph.template, outputs + losses + list(updates), feeds=feeds)
    kept = gu.nodes_by_name(template)
    used = used_tensors(template) | set(outputs)
    inputs = [n for n in state.graph.input_names if n in used]
    adapters = [ad for ad in state.adapters.values() if ad.target in kept]
    keep = kept.keys() | {n for ad in adapters for n in (ad.a, ad.b)}
    values = {w: copy_array(v) for w, v in state.weights.items() if w in keep}
    phase_values = {k: v for k, v in state.graph.phase_values.items() if gu.node_name(k) in kept}
    return NetParts(
        template, inputs, outputs, values, dict(state.statistic_roles), list(state.trainable), name=state.name,
        fold=state.graph.fold, phase_values=phase_values, adapters=adapters, onnx_source=state.onnx_source,
        regularizers=state.regularizers, losses=losses,
        seed_inputs=[n for n in state.graph.seed_inputs if gu.node_name(n) in kept], seed_step=state.seed_steps(),
        updates=updates,
    )


def _within(state: NetState, outputs: list[str], feeds: list[str], names) -> list[str]:
    """Those of ``names`` (the net's :attr:`loss_names` or :attr:`update_names`) that the net cut at ``outputs`` still
    has: those computed from no op past the cut (an activity term or batch norm of a layer the cut keeps, not of one
    it drops), as a Keras model made of the kept layers has only their losses and statistics."""
    template = gu.without_control_inputs(state.graph.template)  # a traced function's outputs wait on all its reads
    kept = set(gu.nodes_by_name(gu.subgraph(template, outputs, feeds=feeds)))
    dropped = set(gu.nodes_by_name(gu.subgraph(template, list(state.graph.output_names), feeds=feeds))) - kept
    return [n for n in names
            if not set(gu.nodes_by_name(gu.subgraph(template, [n], feeds=feeds))) & dropped]


def add_head(state: NetState, head, name: str = "head", train_batch_norm: bool = False) -> NetParts:
    """Attaches a Keras head (a layer, a list of layers, or a model) to this net's single output
    and returns one TFNet whose weights include the head's, under ``name/``.

    The head's weights start from their Keras initial values and are trainable; this net's
    weights keep their trainable state (set ``net.trainable = "head/"`` to train the head only).

    Args:
        head: A Keras layer, a list of layers, or a model.
        name: The prefix of the head's node and weight names. Default: ``"head"``.
        train_batch_norm: The head's trainable batch norms normalize by each batch's statistics in the training step
            and their moving statistics move, as Keras's ``fit`` trains them (``updates``, as
            ``TFNet.from_keras(model, train_batch_norm=True)``); else they stay in inference mode. Default: False.

    Raises:
        InputSpecError: this net has more than one output.
    """
    outputs = list(state.graph.output_names)
    if len(outputs) != 1:
        raise InputSpecError(
            f"add_head needs a net with one output; this one has {outputs}. "
            "Use cut() to choose the feature tensor first."
        )
    frozen = freeze_head(head, state.graph.output_specs[0], train_batch_norm)
    head_weights = frozen.weights
    head_stats = find_statistics(frozen.template, head_weights)
    merged = gu.merge(state.graph.template, frozen.template, name, {gu.node_name(frozen.inputs[0]): outputs[0]})
    values = {w: copy_array(v) for w, v in state.weights.items()}
    values.update({f"{name}/{k}": v for k, v in frozen.values.items()})
    stats = {**dict(state.statistic_roles), **{f"{name}/{s}": role for s, role in head_stats.items()}}
    trainable = list(state.trainable) + [f"{name}/{w}" for w in head_weights if w not in head_stats]
    return NetParts(
        merged, list(state.graph.input_names), [f"{name}/{o}" for o in frozen.outputs], values, stats, trainable,
        name=state.name, fold=state.graph.fold,
        phase_values={**state.graph.phase_values, **{f"{name}/{t}": v for t, v in frozen.phase_values.items()}},
        adapters=list(state.adapters.values()), onnx_source=state.onnx_source,
        regularizers={**state.regularizers, **{f"{name}/{w}": c for w, c in frozen.regularizers.items()}},
        losses=list(state.graph.loss_names) + [f"{name}/{t}" for t in frozen.losses],
        seed_inputs=list(state.graph.seed_inputs) + [f"{name}/{t}" for t in frozen.seed_inputs],
        seed_step=state.seed_steps(),
        updates={**state.graph.updates, **{f"{name}/{t}": f"{name}/{w}" for t, w in frozen.updates.items()}},
    )


# ---------------------------------------------------------------------- low-rank adapters


def with_lora(state: NetState, targets, rank: int = 8, alpha: float | None = None, *,
              seed: int | None = None) -> NetParts:
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
        >>> from tfnet import TFNet
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
    found = _lora_targets(state)
    chosen = lora.select_targets(targets, found, list(state.weights), taken=state.adapters)
    variables = state.weights
    adapters, values = lora.new_adapters(
        chosen, found, {n: tuple(variables[n].shape) for n in chosen},
        {n: variables[n].dtype.as_numpy_dtype for n in chosen}, rank, alpha, seed)
    clash = [n for n in values if n in variables or n in gu.nodes_by_name(state.graph.template)]
    if clash:
        raise WeightError(f"The adapters' names {clash} are taken by the graph's own nodes; rename those nodes.")
    values.update({w: copy_array(v) for w, v in variables.items()})
    every = list(state.adapters.values()) + adapters
    return NetParts(
        state.graph.template, list(state.graph.input_names), list(state.graph.output_names), values,
        dict(state.statistic_roles), [n for ad in every for n in (ad.a, ad.b)], name=state.name, fold=state.graph.fold,
        phase_values=dict(state.graph.phase_values), adapters=every, onnx_source=state.onnx_source,
        regularizers=state.regularizers, losses=state.graph.loss_names, seed_inputs=state.graph.seed_inputs,
        seed_step=state.seed_steps(),
        updates=state.graph.updates,
    )


def lora_candidates(state: NetState) -> list[str]:
    """The weights :meth:`with_lora` can target, in graph order: float kernels read by ``MatMul``,
    ``BatchMatMul`` or ``Einsum`` (dense layers, attention projections) and embedding tables read
    by ``Gather``; not convolution kernels, biases or normalisation scales."""
    return list(_lora_targets(state))


def _lora_targets(state: NetState) -> dict[str, str]:
    key = ("lora_targets",)
    found = state.compiled.get(key)
    if found is None:
        stats = set(state.statistics)
        base = [n for n in state.graph.weight_names if n not in stats]
        found = lora.candidates(state.graph.template, base, {n: tuple(state.weights[n].shape) for n in base})
        state.compiled[key] = found
    return found


def adapter_names(state: NetState) -> list[str]:
    """The adapters' weight names (``<W>/lora_a``, ``<W>/lora_b`` for each target)."""
    return [n for ad in state.adapters.values() for n in (ad.a, ad.b)]


def merged(state: NetState) -> NetParts:
    """A plain TFNet with each adapter folded into its weight (``W + alpha / rank * A @ B``): the same
    function, no adapters, so it saves as a frozen graph, SavedModel or ONNX and serves at the base
    net's cost. Weights whose adapters were trainable are trainable in it; the rest keep their
    state. A net without adapters gives a copy of itself."""
    trainable = set(state.trainable)
    keep = [n for n in state.trainable if n in state.graph.weight_names]
    keep += [ad.target for ad in state.adapters.values() if {ad.a, ad.b} & trainable]
    return NetParts(
        state.graph.template, list(state.graph.input_names), list(state.graph.output_names),
        state.graph_weight_arrays(), dict(state.statistic_roles), keep, name=state.name, fold=state.graph.fold,
        phase_values=dict(state.graph.phase_values), onnx_source=state.onnx_source, regularizers=state.regularizers,
        losses=state.graph.loss_names, seed_inputs=state.graph.seed_inputs, seed_step=state.seed_steps(), updates=state.graph.updates,
    )
