"""The fused training step: forward, loss, backward, gradient reduction, gradient hooks, update
and update hooks, compiled into one ``tf.function``.

The optimiser is anything with optax-style pure functions::

    state = transform.init(params)                       # params: dict name -> tensor
    updates, state = transform.update(grads, state, params)

``optim`` provides those. A float stands for plain SGD with that learning rate. The optional
``reducer(grads, loss) -> (grads, loss)`` runs right after the backward pass; the distributed
trainer passes Horovod's allreduce there, and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfnet.errors import NoWeightsError, TFNetError
from tfnet.graph_function import own_function
from tfnet.net_compute import added_loss
from tfnet.precision import bf16_rewrite, check_precision, training_precision
from tfnet.regularizers import penalty


class SGDState(NamedTuple):
    """Plain SGD keeps no state."""


class _PlainSGD:
    def __init__(self, learning_rate: float):
        if not learning_rate > 0:
            raise ValueError(f"`learning_rate` must be positive. Received: learning_rate={learning_rate}")
        self.learning_rate = float(learning_rate)

    def init(self, params):
        return SGDState()

    def update(self, grads, state, params=None):
        return {k: -self.learning_rate * g for k, g in grads.items()}, state


class StepResult(NamedTuple):
    loss: tf.Tensor
    outputs: Any
    state: Any
    finite: tf.Tensor
    reduce_seconds: Any = 0.0  # wall time inside the reducer (the allreduce), when there is one


class TrainStep:
    """One compiled training step over a TFNet's trainable weights.

    Args:
        net: The TFNet.
        loss_fn: ``loss_fn(targets, outputs) -> scalar``; ``outputs`` is a tensor, or a list for
            several outputs.
        transform: An optax-style ``init`` / ``update`` pair, or a float learning rate (plain SGD).
        reducer: ``reducer(grads, loss) -> (grads, loss)``, run after the backward pass (Horovod
            allreduce when distributed). Default: none.
        precision: ``"fp32"`` (default) or ``"bf16"``: forward and backward in bfloat16, with
            float32 weights, optimiser state and loss (see :mod:`tfnet.precision`). On a CPU
            without native bfloat16 a :class:`~tfnet.precision.PrecisionWarning` (once) and fp32.

    The loss differentiated and returned includes the net's weight regularizers (:attr:`TFNet.regularizers`) of the
    trainable weights and the losses computed beside the outputs (:attr:`TFNet.loss_names`: a Keras model's
    ``add_loss`` and activity terms), as Keras's ``fit`` adds ``model.losses``.

    When the loss or any gradient is NaN or infinite, the step leaves the weights and the state as
    they were and returns ``finite=False``; the caller decides whether to stop or skip.
    """

    def __init__(self, net, loss_fn: Callable, transform, *, reducer: Callable | None = None,
                 precision: str = "fp32"):
        check_precision(precision)
        if not net.trainable:
            raise NoWeightsError(
                "Nothing to train: no weight is trainable. Set net.trainable first "
                f"(the net has {len(net.weight_names)} weights)."
            )
        if (net.loss_names or net.updates) and net.graph.v1_loops:
            raise TFNetError("A net with TF1 control-flow loops cannot train with losses or updates beside its "
                             f"outputs ({net.loss_names + list(net.updates)}); export the loops as functional While "
                             "ops (TF2 control flow).")
        if not callable(loss_fn):
            raise TypeError(f"`loss_fn` must be callable (targets, outputs) -> scalar. Received: {loss_fn!r}")
        if isinstance(transform, (int, float)):
            transform = _PlainSGD(transform)
        if not (hasattr(transform, "init") and hasattr(transform, "update")):
            raise TypeError(
                "`transform` must have init(params) and update(grads, state, params), or be a "
                f"float learning rate. Received: {transform!r}"
            )
        self.net = net
        self.loss_fn = loss_fn
        self.transform = transform
        self.reducer = reducer
        #: The precision asked for, and the one that runs (``"fp32"`` where the CPU lacks bf16).
        self.requested_precision = precision
        self.precision = training_precision(precision)
        self.names = list(net.trainable)
        net.state.regularizer_fns()  # a regularizer Keras cannot rebuild here: RegularizerError now, not mid-trace
        self._fns: dict[bool, Callable] = {}
        self._fn_version = net.version
        self._state_vars = None
        #: the trainable weights the loss does not reach (found when the step is traced): left as they are, their
        #: optimiser state too, as Keras's optimisers leave a variable whose gradient is None (and PyTorch's)
        self.unreached: frozenset = frozenset()

    def params(self) -> dict[str, tf.Tensor]:
        variables = self.net.weight_variables
        return {n: variables[n].value() for n in self.names}

    def init_state(self):
        """The optimiser state for the current trainable weights."""
        return self.transform.init(self.params())

    def _check_current(self) -> None:
        if list(self.net.trainable) != self.names:
            raise TFNetError(
                "The net's trainable weights changed after this step was built; build a new one "
                "with net.train_step(...) and a new optimiser state."
            )

    def _compiled(self, kind):
        """The compiled function of ``kind``: False (pure step), True (held state), "grads" or
        "apply" (the two halves of a step, for an exchange outside it)."""
        if self._fn_version != self.net.version:
            self._fns = {}
            self._fn_version = self.net.version
        fn = self._fns.get(kind)
        if fn is None:
            body = {False: self._step, True: self._stateful_step, "grads": self._gradients,
                    "apply": self._stateful_apply}[kind]
            fn = own_function(body, reduce_retracing=True, autograph=False)
            self._fns[kind] = fn
        return fn

    def _stateful_step(self, inputs, targets):
        state = tf.nest.map_structure(lambda v: v.value(), self._state_vars)
        return self._step(inputs, targets, state, assign_to=self._state_vars)

    def _stateful_apply(self, grads, loss):
        state = tf.nest.map_structure(lambda v: v.value(), self._state_vars)
        _, finite = self._apply(grads, loss, state, assign_to=self._state_vars)
        return finite

    def _gradients(self, inputs, targets):
        """Forward, loss and backward, for an exchange outside the step: ``(loss, outputs, {weight name:
        gradient})``; the net's :attr:`~tfnet.TFNet.updates` assigned here, where the loss is finite."""
        loss, outs, grads, updates = self._forward_backward(inputs, targets)
        if updates:
            tf.cond(tf.math.is_finite(loss), lambda: self._assign(updates), lambda: tf.constant(False))
        return loss, outs, grads

    def _assign(self, updates):
        variables = self.net.weight_variables
        for n, value in updates.items():
            variables[n].assign(tf.cast(value, variables[n].dtype))
        return tf.constant(True)

    def _forward_backward(self, inputs, targets):
        """Forward, loss and backward: ``(loss, outputs, {weight name: gradient}, {weight name: new value})``, the
        last the net's :attr:`~tfnet.TFNet.updates` computed in this forward pass."""
        net = self.net
        all_vars = net.weight_variables
        reads = {n: v.value() for n, v in all_vars.items()}
        sources = [reads[n] for n in self.names]
        extra = penalty(net.state.regularizer_fns(), reads, self.names)  # Keras's model.losses, as fit adds them
        updates = {}
        if net.graph.v1_loops:
            # v1 loops differentiate only in graph mode with their loop contexts rebuilt (see
            # tfnet.v1_loops): the outputs' gradient comes from the loss here, the rest from there.
            inputs = net.cast_inputs(inputs)  # narrow integers (prepare_inputs) cast here, in the step's graph
            raw = net.pure_function(training=True)(inputs, list(reads.values()))
            outs = net.forward_hooks.run(net.pack(raw))
            loss = tf.cast(self.loss_fn(targets, outs), tf.float32)
            grad_raw = [tf.zeros_like(r) if g is None else g for g, r in zip(tf.gradients(loss, raw), raw)]
            vjp = net.compiled_vjp(None, True, (True,) * len(raw), inputs=False, hooks=False)
            grads = vjp(inputs, list(reads.values()), grad_raw)[:len(self.names)]
            if extra is not None:
                loss = loss + extra
                grads = [g if e is None else e if g is None else g + e
                         for g, e in zip(grads, tf.gradients(extra, sources))]
        else:
            outs = net.run_graph(inputs, list(reads.values()), training=True, differentiated=True, losses=True,
                                 updates=True)
            n_out, n_loss = len(net.output_names), len(net.loss_names)
            added = added_loss(outs[n_out:n_out + n_loss])  # the model's add_loss and activity terms, as fit adds them
            # a Keras batch norm's new moving statistics, assigned with the step's update (as fit's call assigns them)
            updates = dict(zip(net.graph.updates.values(), outs[n_out + n_loss:]))
            outs = net.forward_hooks.run(net.pack(outs[:n_out]))
            loss = tf.cast(self.loss_fn(targets, outs), tf.float32)
            for term in (extra, added):
                if term is not None:
                    loss = loss + term
            # The imported graph's ops are created below the Python op layer, where GradientTape
            # does not see them; symbolic gradients walk the graph itself and reach every op.
            grads = tf.gradients(loss, sources)
            self.unreached = frozenset(n for n, g in zip(self.names, grads) if g is None)
            if net.state.seed_step is not None:  # the next step's dropout draws the next noise, as Keras's fit does
                net.state.seed_step.assign_add(1)
        grads = {
            n: tf.zeros_like(src) if g is None else tf.convert_to_tensor(g)
            for n, src, g in zip(self.names, sources, grads)
        }
        return loss, outs, grads, updates

    def _reduce(self, grads, loss):
        """The reducer's ``(grads, loss)`` and the seconds it took: from every gradient being ready
        to every reduced one being ready (waiting for slower ranks included). A reducer with
        ``overlaps = True`` starts on each bucket as soon as its gradients are ready; only its
        exposed part (after the last gradient) is timed."""
        if self.reducer is None:
            return grads, loss, tf.constant(0.0, tf.float64)
        with tf.control_dependencies(list(grads.values()) + [loss]):
            t0 = tf.timestamp()
        if not getattr(self.reducer, "overlaps", False):
            with tf.control_dependencies([t0]):
                grads = {n: tf.identity(g) for n, g in grads.items()}
                loss = tf.identity(loss)
        grads, loss = self.reducer(grads, loss)
        with tf.control_dependencies(list(grads.values()) + [loss]):
            reduce_seconds = tf.timestamp() - t0
        return grads, loss, reduce_seconds

    def _apply(self, grads, loss, state, assign_to=None, updates=None):
        """Gradient hooks, the finiteness check, the update, the net's ``updates`` (``{weight: new value}``) and the
        update hooks: ``(new state, finite)``. A non-finite loss or gradient leaves the weights and the state as they
        were."""
        net = self.net
        all_vars = net.weight_variables
        assigned = updates or {}
        grads = net.gradient_hooks.run(grads)
        finite = tf.math.is_finite(loss)
        for g in grads.values():
            finite = tf.logical_and(finite, tf.math.is_finite(tf.reduce_sum(g)))

        def apply():
            params = {n: all_vars[n].value() for n in self.names}
            updates, new_state = self.transform.update(grads, state, params)
            if self.unreached:  # no decay, no momentum, no state change for what the loss does not reach
                updates = {n: u for n, u in updates.items() if n not in self.unreached}
                new_state = _kept(new_state, state, self.unreached)
            for n, u in updates.items():
                all_vars[n].assign_add(tf.cast(u, all_vars[n].dtype))
            if assigned:
                self._assign(assigned)
            if net.update_hooks:
                current = {n: all_vars[n].value() for n in self.names}
                constrained = net.update_hooks.run(dict(current))
                for n, value in constrained.items():
                    if value is not current.get(n):
                        all_vars[n].assign(tf.cast(value, all_vars[n].dtype))
            if assign_to is None:
                return new_state
            for var, value in zip(tf.nest.flatten(assign_to), tf.nest.flatten(new_state)):
                var.assign(value)
            return tf.constant(True)

        if assign_to is None:
            return tf.cond(finite, apply, lambda: state), finite
        tf.cond(finite, apply, lambda: tf.constant(False))
        return None, finite

    def _step(self, inputs, targets, state, assign_to=None):
        loss, outs, grads, updates = self._forward_backward(inputs, targets)
        grads, loss, reduce_seconds = self._reduce(grads, loss)
        new_state, finite = self._apply(grads, loss, state, assign_to, updates)
        return loss, outs, new_state, finite, reduce_seconds

    def __call__(self, inputs, targets, state) -> StepResult:
        """Runs one step with an explicit optimiser state and returns the new one (pure style).

        ``inputs`` as for ``TFNet.forward``; ``targets`` is passed to the loss."""
        self._check_current()
        tensors = self.net.prepare_inputs(inputs, narrow=True)
        targets = tf.nest.map_structure(tf.convert_to_tensor, targets)
        with bf16_rewrite(self.precision == "bf16"):
            loss, outs, state, finite, reduce_seconds = self._compiled(False)(tensors, targets, state)
        return StepResult(loss, outs, state, finite, reduce_seconds)

    # ------------------------------------------------------------------ held state

    def run(self, inputs, targets) -> StepResult:
        """Runs one step on the state this step holds in variables (see :meth:`set_state`), updated
        in place: no second copy of the optimiser state, as a pure step needs for its output.
        ``result.state`` is None."""
        self._check_current()
        if self._state_vars is None:
            self.set_state(self.init_state())
        tensors = self.net.prepare_inputs(inputs, narrow=True)
        targets = tf.nest.map_structure(tf.convert_to_tensor, targets)
        with bf16_rewrite(self.precision == "bf16"):
            loss, outs, _, finite, reduce_seconds = self._compiled(True)(tensors, targets)
        return StepResult(loss, outs, None, finite, reduce_seconds)

    def gradients(self, inputs, targets):
        """The first half of a step, for an exchange outside it (asynchronous training):
        ``(loss, outputs, {weight name: gradient})`` for this batch, nothing applied."""
        self._check_current()
        tensors = self.net.prepare_inputs(inputs, narrow=True)
        targets = tf.nest.map_structure(tf.convert_to_tensor, targets)
        with bf16_rewrite(self.precision == "bf16"):
            return self._compiled("grads")(tensors, targets)

    def apply_gradients(self, grads, loss) -> tf.Tensor:
        """The second half: gradient hooks, the update of the weights and of the held state, and
        the update hooks, unless the loss or a gradient is not finite. Returns ``finite``."""
        self._check_current()
        if self._state_vars is None:
            self.set_state(self.init_state())
        variables = self.net.weight_variables
        grads = {n: tf.cast(grads[n], variables[n].dtype) for n in self.names}
        return self._compiled("apply")(grads, tf.convert_to_tensor(loss, tf.float32))

    def set_state(self, state) -> None:
        """Sets the held optimiser state (a state pytree, e.g. from ``init_state``)."""
        leaves = tf.nest.flatten(state)
        if self._state_vars is not None:
            current = tf.nest.flatten(self._state_vars)
            if len(current) == len(leaves) and all(
                tuple(v.shape) == tuple(np.shape(x)) for v, x in zip(current, leaves)
            ):
                for v, x in zip(current, leaves):
                    v.assign(tf.cast(x, v.dtype))
                return
        with tf.init_scope():
            self._state_vars = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False), state)
        self._fns = {}

    def state_spec(self):
        """The state's structure with a ``tf.TensorSpec`` per leaf."""
        state = self._state_vars if self._state_vars is not None else self.init_state()
        return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), state)

    def get_state(self):
        """The held optimiser state, as tensors (a snapshot)."""
        if self._state_vars is None:
            return self.init_state()
        return tf.nest.map_structure(lambda v: tf.identity(v), self._state_vars)


def _kept(new, old, names: frozenset):
    """``new`` (an optimiser state: named tuples, lists and dicts by weight name) with ``old``'s entries for
    ``names``."""
    if isinstance(new, dict):
        return {k: old[k] if k in names else _kept(v, old[k], names) for k, v in new.items()}
    if isinstance(new, tuple) and hasattr(new, "_fields"):
        return type(new)(*(_kept(a, b, names) for a, b in zip(new, old)))
    if isinstance(new, (list, tuple)):
        return type(new)(_kept(a, b, names) for a, b in zip(new, old))
    return new
