"""Running a :class:`tfnet.TFNet`: forward, backward (vector-Jacobian products), weight updates and
the forward, gradient and update hooks, as functions of its :class:`tfnet.net_state.NetState`.

``TFNet``'s methods of the same names call these with ``net.state`` (see :mod:`tfnet.net`). The
internal interface, for tfnet's own modules (:mod:`tfnet.step`'s fused training step,
:mod:`tfnet.saving`'s SavedModel export): :func:`run_graph`, :func:`pure_function`, :func:`compiled_vjp` (the
vector-Jacobian product that ``backward`` and the step's graphs with v1 loops use) and :func:`pack`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from tfnet.errors import GradientUnavailableError, GraphExecutionError, InputSpecError, first_line, op_error_reason
from tfnet.graph_function import own_function
from tfnet.hooks import HookHandle
from tfnet.inputs import arrange, batch_size_of, convert, is_batched
from tfnet.lora import adapted_weights
from tfnet.net_state import NetState
from tfnet.v1_loops import graph_mode_function, restored_loops

__all__ = [
    "added_loss", "apply_updates", "backward", "call", "compiled_vjp", "forward", "hooks", "pack", "prepare_inputs", "pure_function",
    "register_forward_hook", "register_gradient_hook", "register_update_hook", "run_graph",
]

# ---------------------------------------------------------------------- internal interface


def run_graph(
    state: NetState, inputs: Sequence[tf.Tensor], weights: Sequence[tf.Tensor], training: bool = False,
    differentiated: bool = False, losses: bool = False, updates: bool = False,
) -> list[tf.Tensor]:
    """Imports the graph into the function being traced, wired to ``inputs`` and ``weights`` (all
    of :attr:`weight_names`: each adapted weight is fed ``W + alpha / rank * A @ B``); phase
    tensors get their training values when ``training`` (internal interface).

    Args:
        inputs: One tensor per input, in :attr:`input_names` order.
        weights: One tensor per weight, in :attr:`weight_names` order.
        training: Feed :attr:`phase_values` their training values. Default: False.
        differentiated: Gradients will be taken of it: the graph as :mod:`tfnet.remapper_guard` keeps it
            differentiable. Default: False.
        losses: Return the :attr:`loss_names` tensors after the outputs. Default: False.
        updates: Return the :attr:`update_names` tensors after those. Default: False.
    """
    graph_weights = adapted_weights(weights, state.lora_plan, len(state.graph.weight_names))
    seed = None
    if training and state.seed_step is not None:  # a Keras model's dropout: the noise of this step (tfnet.keras_training)
        seed = tf.stack([tf.constant(state.seed_stream, tf.int64), state.seed_step.read_value()])
    return state.graph(cast_inputs(state, inputs), graph_weights, training=training, differentiated=differentiated,
                       losses=losses, seed=seed, updates=updates)


def added_loss(terms: Sequence[tf.Tensor]) -> tf.Tensor | None:
    """The sum of the :attr:`loss_names` tensors' sums, float32, as Keras's ``fit`` adds ``model.losses``; None for
    none (internal interface)."""
    if not terms:
        return None
    return tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in terms])


def cast_inputs(state: NetState, inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """``inputs`` cast to the graph's input dtypes where they differ: a float input given narrow integers
    (:data:`tfnet.inputs.NARROW_DTYPES`, by :func:`prepare_inputs` with ``narrow``) casts them here, inside the
    function being traced (internal interface)."""
    return [t if t.dtype == s.dtype else tf.cast(t, s.dtype) for t, s in zip(inputs, state.graph.input_specs)]


def pure_function(state: NetState, training: bool = False, dtypes: Sequence[tf.DType] | None = None,
                  losses: bool = False) -> Callable:
    """``(inputs, weights) -> outputs``, compiled once per mode and input dtypes with a batch-agnostic signature
    (internal interface).

    Args:
        training: Feed :attr:`phase_values` their training values. Default: False.
        dtypes: The dtypes the inputs come in (a float input may take narrow integers, cast inside). Default: the
            graph's.
        losses: The :attr:`loss_names` tensors too, after the outputs. Default: False.
    """
    specs = list(state.graph.input_specs)
    own = tuple(s.dtype for s in specs)
    dtypes = own if dtypes is None else tuple(tf.as_dtype(d) for d in dtypes)
    losses = bool(losses) and bool(state.graph.loss_names)
    key = ("pure", bool(training) and bool(state.graph.phase_values)) + ((dtypes,) if dtypes != own else ()) + \
        (("losses",) if losses else ())
    fn = state.compiled.get(key)
    if fn is None:
        input_specs = [tf.TensorSpec(s.shape, d, s.name) for s, d in zip(specs, dtypes)]
        signature = [input_specs, state.weight_specs()]

        def run(inputs, weights):
            return run_graph(state, inputs, weights, training=key[1], losses=losses)

        if state.graph.v1_loops:  # v1 loop frames and tf.function's automatic control dependencies do not mix
            fn = graph_mode_function(run, signature)
        else:
            fn = own_function(run, input_signature=signature, autograph=False)
        state.compiled[key] = fn
    return fn


def compiled_vjp(state: NetState, dtypes: Sequence[tf.DType] | None, training: bool, given: tuple[bool, ...] | None,
                 *, inputs: bool = True, hooks: bool = True) -> Callable:
    """``(inputs, weights, grad_outputs) -> gradients + outputs``, compiled once per mode, input dtypes and set of
    outputs given a gradient (internal interface): the gradients on the float inputs (with ``inputs``), then on the
    trainable weights (zeros where not connected), then the outputs (flat, after the forward hooks with ``hooks``).
    ``given`` says which outputs ``grad_outputs`` holds a gradient for, in order (the others contribute nothing);
    ``None``: none is given, every output counts with ones. ``dtypes``: the inputs' (None: the graph's own).

    One function computes the forward pass and its gradient (``tf.gradients``), so Grappler optimises one graph
    once, where an eager tape around the forward function builds two (the forward pass keeping its intermediates,
    then the backward pass). The first ``backward`` of Keras's ResNet50 (32x32, batch 8) took 3.7 CPU-s that way and
    2.65 this way, each later one 206 ms and 184 ms; NASNetMobile's first, 15.2 and 12.8 CPU-s (2-core AMD EPYC
    Zen 4; docs/benchmarks.md, 2026-12-03). A graph with v1 loops is compiled in graph mode with its loops'
    contexts rebuilt (:mod:`tfnet.v1_loops`): TensorFlow cannot differentiate them otherwise.
    """
    own = tuple(s.dtype for s in state.graph.input_specs)
    dtypes = own if dtypes is None else tuple(tf.as_dtype(d) for d in dtypes)
    phases = bool(training) and bool(state.graph.phase_values)
    key = ("compiled_vjp", phases, given, inputs, hooks) + ((dtypes,) if dtypes != own else ())
    fn = state.compiled.get(key)
    if fn is None:
        float_inputs = [i for i, d in enumerate(dtypes) if d.is_floating] if inputs else []
        index = {n: i for i, n in enumerate(state.weights)}
        trainable = [index[n] for n in state.trainable]
        input_specs = [tf.TensorSpec(s.shape, d, s.name) for s, d in zip(state.graph.input_specs, dtypes)]
        grad_specs = [s for s, g in zip(state.graph.output_specs, given or ()) if g]
        v1_loops = bool(state.graph.v1_loops)
        # v1 control flow's gradient code raises ValueError or TypeError where it meets what it cannot follow
        cannot = (LookupError, ValueError, TypeError) if v1_loops else (LookupError,)

        def run(inputs, weights, grads_out):
            sources = [inputs[i] for i in float_inputs] + [weights[k] for k in trainable]

            def imported():
                return run_graph(state, inputs, weights, phases, differentiated=True)

            outs = restored_loops(imported) if v1_loops else imported()
            outs = tf.nest.flatten(state.forward_hooks.run(pack(outs))) if hooks else list(outs)
            if given is None:
                grad_ys = None
            else:  # an output without a gradient does not contribute
                supplied = iter(grads_out)
                grad_ys = [next(supplied) if g else tf.zeros_like(o) for g, o in zip(given, outs)]
            # The imported graph's ops are created below the Python op layer, where a GradientTape inside this
            # function does not see them; symbolic gradients walk the graph itself (as tfnet.step's do).
            try:
                grads = tf.gradients(outs, sources, grad_ys=grad_ys)
            except cannot as exc:
                raise GradientUnavailableError(
                    f"TensorFlow cannot differentiate the graph{' (its v1 control flow)' if v1_loops else ''}: "
                    f"{first_line(str(exc))}"
                ) from None
            # the outputs too, so the forward pass runs whole (a graph that fails on these inputs fails here too,
            # though Grappler could prune what no gradient needs)
            return [_dense_or_zeros(g, s) for g, s in zip(grads, sources)] + outs

        signature = [input_specs, state.weight_specs(), grad_specs]
        fn = (graph_mode_function(run, signature) if v1_loops
              else own_function(run, input_signature=signature, autograph=False))
        state.compiled[key] = fn
    return fn


def pack(outs: Sequence[tf.Tensor]):
    """One output as a tensor, several as a list: the structure users and hooks see (internal interface)."""
    return outs[0] if len(outs) == 1 else list(outs)


# ---------------------------------------------------------------------- forward


def prepare_inputs(state: NetState, inputs: Any, narrow: bool = False) -> list[tf.Tensor]:
    """Checks inputs (one array, a list in input order, or a dict by name) and converts them to
    tensors of the graph's dtypes; with ``narrow``, a float input given narrow integers
    (:data:`tfnet.inputs.NARROW_DTYPES`) keeps them, for the graph to cast (:func:`run_graph`).

    Raises:
        InputSpecError: wrong number of inputs, rank or shape.
        InputTypeError: a dtype the input cannot take.
    """
    names, specs = list(state.graph.input_names), list(state.graph.input_specs)
    values = arrange(inputs, names)
    tensors = [convert(v, s, n, narrow) for v, s, n in zip(values, specs, names)]
    batch_size_of(tensors, specs)
    return tensors


def _call_pure(state: NetState, tensors: list[tf.Tensor], weights: list[tf.Tensor],
               training: bool = False, losses: bool = False) -> list[tf.Tensor]:
    try:
        return list(pure_function(state, training, [t.dtype for t in tensors], losses)(tensors, weights))
    except tf.errors.OpError as exc:
        raise GraphExecutionError(
            f"TensorFlow failed to run the graph on inputs of shapes "
            f"{[tuple(t.shape) for t in tensors]}: {op_error_reason(exc.message)}"
        ) from None


def call(state: NetState, inputs: Any, training: bool = False) -> tf.Tensor | list[tf.Tensor]:
    """Runs the graph on tensors and returns tensors, with forward hooks applied.

    Works inside ``tf.function`` and ``tf.GradientTape`` (gradients reach the weight variables).
    ``training`` selects the training values of :attr:`phase_values`.
    """
    tensors = prepare_inputs(state, inputs)
    # Always through the compiled function: a tape records its call as one differentiable op.
    outs = _call_pure(state, tensors, state.weight_values(), training)
    return state.forward_hooks.run(pack(outs))


def forward(state: NetState, inputs: Any, *, as_tensors: bool = False, batch_size: int | None = None,
            training: bool = False, return_losses: bool = False):
    """Runs the graph.

    Args:
        inputs: One array (single-input graphs), a list in :attr:`input_names` order, or a dict
            by input name. Numpy arrays, lists or tensors; floats are cast to the graph's float
            dtype, integers and strings pass through. A float input given narrow integers (uint8
            pixels: :data:`tfnet.inputs.NARROW_DTYPES`) takes them into the graph, which casts them.
        as_tensors: Return ``tf.Tensor`` s instead of numpy arrays. Default: False.
        batch_size: Run in chunks of this many rows and concatenate. Default: one call. Inputs
            whose dimension 0 is fixed in :attr:`input_specs` are whole tensors, not rows: each
            chunk gets all of them.
        training: Feed :attr:`phase_values` their training values. Default: False.
        return_losses: Also return what the training loss adds for these inputs (:attr:`loss_names`: a Keras
            model's ``add_loss`` and activity terms, as ``model.losses`` holds them after a call), summed, a float32
            scalar (0 for a net without). Computed on the whole batch: not with ``batch_size``. Default: False.

    Returns:
        One array for single-output graphs, else a list in :attr:`output_names` order; with ``return_losses``, the
        pair ``(outputs, added loss)``.

    Raises:
        InputSpecError: the inputs that take a batch (dimension 0 open) have different sizes there.
        ValueError: ``return_losses`` with ``batch_size``.
    """
    if return_losses and batch_size:
        raise ValueError("forward(return_losses=True) computes the losses of the whole batch; it takes no "
                         f"batch_size. Received: batch_size={batch_size}")
    tensors = prepare_inputs(state, inputs, narrow=True)
    if return_losses:
        outs = _call_pure(state, tensors, state.weight_values(), training, losses=True)
        n = len(state.graph.output_names)
        added = added_loss(outs[n:])
        outs = state.forward_hooks.run(pack(outs[:n]))
        added = tf.constant(0.0, tf.float32) if added is None else added
        return (outs, added) if as_tensors else (tf.nest.map_structure(lambda t: t.numpy(), outs), added.numpy())
    weights = state.weight_values()
    specs = list(state.graph.input_specs)
    n = batch_size_of(tensors, specs)
    if batch_size and n and n > batch_size:  # inputs with a fixed dimension 0 go whole into every chunk
        chunks = [
            _call_pure(state, [t[i : i + batch_size] if is_batched(s) else t for t, s in zip(tensors, specs)],
                       weights, training)
            for i in range(0, n, batch_size)
        ]
        outs = [tf.concat([c[j] for c in chunks], axis=0) for j in range(len(state.graph.output_names))]
    else:
        outs = _call_pure(state, tensors, weights, training)
    outs = state.forward_hooks.run(pack(outs))
    return outs if as_tensors else tf.nest.map_structure(lambda t: t.numpy(), outs)


# ---------------------------------------------------------------------- backward


def backward(state: NetState, inputs: Any, grad_outputs: Any = None, *, as_tensors: bool = False,
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
        non-float inputs) and a dict over the trainable weights (empty for a graph without weights,
        such as a pooling or reshaping layer's: its input gradients still come, as Keras gives them).
        Gradient hooks are applied to ``grad_weights``.

    Raises:
        GradientUnavailableError: TensorFlow has no gradient for the graph (an op without a registered
            gradient, nested v1 control flow loops); the message names the node.
    """
    tensors = prepare_inputs(state, inputs)
    grads_out = _prepare_grad_outputs(state, grad_outputs)
    names = list(state.trainable)
    weights = state.weight_values()
    float_inputs = [i for i, t in enumerate(tensors) if t.dtype.is_floating]
    given = None if grads_out is None else tuple(g is not None for g in grads_out)
    fn = compiled_vjp(state, [t.dtype for t in tensors], training, given)
    try:
        grads = list(fn(tensors, weights, [g for g in grads_out or () if g is not None]))[:len(float_inputs) + len(names)]
    except tf.errors.OpError as exc:
        raise GraphExecutionError(
            f"TensorFlow failed to differentiate the graph on inputs of shapes "
            f"{[tuple(t.shape) for t in tensors]}: {op_error_reason(exc.message)}"
        ) from None
    grad_inputs: list = [None] * len(tensors)
    for k, i in enumerate(float_inputs):
        grad_inputs[i] = grads[k]
    grad_weights = dict(zip(names, grads[len(float_inputs):]))
    grad_weights = state.gradient_hooks.run(grad_weights)
    if not as_tensors:
        grad_inputs = [None if g is None else g.numpy() for g in grad_inputs]
        grad_weights = {k: v.numpy() for k, v in grad_weights.items()}
    if len(grad_inputs) == 1:
        grad_inputs = grad_inputs[0]
    return grad_inputs, grad_weights


def _prepare_grad_outputs(state: NetState, grad_outputs) -> list | None:
    if grad_outputs is None:
        return None
    names = list(state.graph.output_names)
    values = arrange(grad_outputs, names, what="output gradient")
    if all(v is None for v in values):
        raise InputSpecError("Every output gradient is None; give at least one.")
    return [
        None if v is None else convert(v, spec, f"gradient of {name}")
        for v, spec, name in zip(values, state.graph.output_specs, names)
    ]


# ---------------------------------------------------------------------- updates and hooks


def apply_updates(state: NetState, updates: Mapping[str, Any]) -> None:
    """The weight-update hook: sets each named weight ``w`` to ``w + update``, then runs the
    update hooks on the updated weights."""
    checked = state.check_weight_values(updates, "apply_updates")
    for name, delta in checked.items():
        state.weights[name].assign_add(delta)
    if not state.update_hooks:
        return
    current = {n: state.weights[n].value() for n in checked}
    new = state.update_hooks.run(dict(current))
    changed = {k: v for k, v in new.items() if v is not current.get(k)}
    for name, value in state.check_weight_values(changed, "update hook").items():
        state.weights[name].assign(value)


def hooks(state: NetState) -> dict[str, tuple[Callable, ...]]:
    """The registered hooks by kind, each in the order they run: ``{"forward": (...), "gradient":
    (...), "update": (...)}`` (read-only; register and remove them through the methods)."""
    return {"forward": tuple(state.forward_hooks), "gradient": tuple(state.gradient_hooks),
            "update": tuple(state.update_hooks)}


def register_forward_hook(state: NetState, fn: Callable) -> HookHandle:
    """``fn(outputs) -> outputs or None`` runs on the outputs of every forward pass (and inside
    the fused training step). ``outputs`` is a tensor, or a list for several outputs.
    Write hooks with TensorFlow ops: inside compiled steps they are traced once."""
    return state.forward_hooks.add(fn)


def register_gradient_hook(state: NetState, fn: Callable) -> HookHandle:
    """``fn(grads: dict[name, tensor]) -> dict or None`` runs on the weight gradients before
    they are used: to clip or mask them."""
    return state.gradient_hooks.add(fn)


def register_update_hook(state: NetState, fn: Callable) -> HookHandle:
    """``fn(weights: dict[name, tensor]) -> dict or None`` runs after every weight update on the
    updated weights; a returned dict of new values is assigned (to constrain weights)."""
    return state.update_hooks.add(fn)


def _dense_or_zeros(grad, source):
    if grad is None:
        return tf.zeros_like(source)
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad
