"""Gradient transformations: pure update rules, optax style.

A transformation is a pair of pure functions::

    state = t.init(params)                        # params: dict name -> tensor
    updates, state = t.update(grads, state, params)

``updates`` are deltas (``w <- w + update``: ``TFNet.apply_updates``). States are small NamedTuples
of tensors, so they can be checkpointed, broadcast and passed through ``tf.function``. Behaviour is
composed with :func:`chain`: clipping, weight decay and schedules are transforms in the chain.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

Params = Mapping[str, tf.Tensor]
Schedule = float | Callable[[tf.Tensor], tf.Tensor]


class GradientTransformation(NamedTuple):
    init: Callable[[Params], Any]
    update: Callable[[Params, Any, Params], tuple[dict, Any]]


class EmptyState(NamedTuple):
    pass


class CountState(NamedTuple):
    count: tf.Tensor


class TraceState(NamedTuple):
    count: tf.Tensor
    momentum: dict


class AdamState(NamedTuple):
    count: tf.Tensor
    m: dict
    v: dict
    v_hat: dict


class RMSState(NamedTuple):
    count: tf.Tensor
    velocity: dict
    momentum: dict
    average_grad: dict


class AdagradState(NamedTuple):
    count: tf.Tensor
    accumulator: dict


class PartitionState(NamedTuple):
    inner: tuple


def _count0():
    return tf.constant(0, tf.int64)


def _zeros(params: Params) -> dict:
    return {k: tf.zeros_like(v) for k, v in params.items()}


def _lr(schedule: Schedule, count: tf.Tensor, dtype) -> tf.Tensor:
    value = schedule(count) if callable(schedule) else schedule
    return tf.cast(value, dtype)


def check_non_negative(name: str, value, allow_schedule: bool = False) -> None:
    if allow_schedule and callable(value):
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"`{name}` must be a non-negative number. Received: {name}={value!r}")


def check_unit_interval(name: str, value, closed_right: bool = False) -> None:
    ok = isinstance(value, (int, float)) and 0 <= value and (value <= 1 if closed_right else value < 1)
    if not ok:
        right = "]" if closed_right else ")"
        raise ValueError(f"`{name}` must be a float in [0, 1{right}. Received: {name}={value!r}")


# ---------------------------------------------------------------- composition


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Applies transforms in order; the state is the tuple of their states."""

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(grads, state, params=None):
        new_state = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s, params)
            new_state.append(s)
        return grads, tuple(new_state)

    return GradientTransformation(init, update)


def identity() -> GradientTransformation:
    return GradientTransformation(lambda params: EmptyState(), lambda g, s, p=None: (dict(g), s))


def set_to_zero() -> GradientTransformation:
    """Frozen: every update is zero."""
    return GradientTransformation(
        lambda params: EmptyState(), lambda g, s, p=None: ({k: tf.zeros_like(v) for k, v in g.items()}, s)
    )


def matcher(key) -> Callable[[str], bool]:
    """A group key: a compiled regex (``re.search``), or a string prefix."""
    if isinstance(key, re.Pattern):
        return lambda name: key.search(name) is not None
    if isinstance(key, str):
        return lambda name: name.startswith(key)
    raise TypeError(f"Group keys are name prefixes (str) or compiled regexes. Received: {key!r}")


def assign_groups(keys: Sequence, names: Sequence[str]) -> dict[str, int | None]:
    """Each name's group: the index of the first key that matches it, or None."""
    tests = [matcher(k) for k in keys]
    out = {}
    for name in names:
        out[name] = next((i for i, t in enumerate(tests) if t(name)), None)
    return out


def partition(groups: Mapping[Any, GradientTransformation | None]) -> GradientTransformation:
    """Per-group transforms: ``{prefix_or_regex: transform}``. A weight takes the first group whose
    key matches it; a weight matching no group, or a group whose transform is ``None``, is frozen
    (zero updates)."""
    keys = list(groups)
    transforms = [groups[k] for k in keys]

    def split(tree: Params, names: Sequence[str]):
        assignment = assign_groups(keys, names)
        return [{n: tree[n] for n in names if assignment[n] == i} for i in range(len(keys))]

    def init(params):
        parts = split(params, list(params))
        return PartitionState(tuple(
            t.init(p) if t is not None else EmptyState() for t, p in zip(transforms, parts)
        ))

    def update(grads, state, params=None):
        names = list(grads)
        g_parts = split(grads, names)
        p_parts = split(params, names) if params is not None else [None] * len(keys)
        updates = {n: tf.zeros_like(g) for n, g in grads.items()}
        new_inner = []
        for t, g, p, s in zip(transforms, g_parts, p_parts, state.inner):
            if t is None or not g:
                new_inner.append(s)
                continue
            u, s = t.update(g, s, p)
            updates.update(u)
            new_inner.append(s)
        return updates, PartitionState(tuple(new_inner))

    return GradientTransformation(init, update)


# ---------------------------------------------------------------- clipping and decay


def clip(max_delta: float) -> GradientTransformation:
    """Clips every gradient element to ``[-max_delta, max_delta]`` (Keras ``clipvalue``)."""
    check_non_negative("clipvalue", max_delta)

    def update(grads, state, params=None):
        return {k: tf.clip_by_value(g, -max_delta, max_delta) for k, g in grads.items()}, state

    return GradientTransformation(lambda p: EmptyState(), update)


def clip_by_norm(max_norm: float) -> GradientTransformation:
    """Scales each gradient tensor whose L2 norm exceeds ``max_norm`` (Keras ``clipnorm``)."""
    check_non_negative("clipnorm", max_norm)

    def one(g):
        l2sum = tf.reduce_sum(tf.square(g))
        safe = tf.where(l2sum > 0, l2sum, tf.ones_like(l2sum))
        norm = tf.where(l2sum > 0, tf.sqrt(safe), l2sum)
        return g * max_norm / tf.maximum(norm, max_norm)

    def update(grads, state, params=None):
        return {k: one(g) for k, g in grads.items()}, state

    return GradientTransformation(lambda p: EmptyState(), update)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scales all gradients together when their joint L2 norm exceeds ``max_norm``
    (Keras ``global_clipnorm``)."""
    check_non_negative("global_clipnorm", max_norm)

    def update(grads, state, params=None):
        names = list(grads)
        clipped, _ = tf.clip_by_global_norm([grads[n] for n in names], max_norm)
        return dict(zip(names, clipped)), state

    return GradientTransformation(lambda p: EmptyState(), update)


def add_decayed_weights(weight_decay: float, mask: Callable[[str], bool] | None = None) -> GradientTransformation:
    """L2 weight decay: ``g <- g + weight_decay * w`` (for names ``mask`` accepts)."""
    check_non_negative("weight_decay", weight_decay)

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("add_decayed_weights needs the current params.")
        return {
            k: g + tf.cast(weight_decay, g.dtype) * params[k] if (mask is None or mask(k)) else g
            for k, g in grads.items()
        }, state

    return GradientTransformation(lambda p: EmptyState(), update)


def decoupled_weight_decay(weight_decay: float, learning_rate: Schedule, mask=None) -> GradientTransformation:
    """Keras' ``weight_decay``: an update of ``-w * weight_decay * lr`` added to the rest.

    Must come last in a chain, after the rule it decouples from (it adds to the updates)."""
    check_non_negative("weight_decay", weight_decay)

    def init(params):
        return CountState(_count0())

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("decoupled_weight_decay needs the current params.")
        out = {}
        for k, u in updates.items():
            if mask is None or mask(k):
                lr = _lr(learning_rate, state.count, params[k].dtype)
                u = -(params[k] * tf.cast(weight_decay, u.dtype) * lr) + u
            out[k] = u
        return out, CountState(state.count + 1)

    return GradientTransformation(init, update)


# ---------------------------------------------------------------- update rules (Keras 3 formulas)


def sgd_rule(learning_rate: Schedule, momentum=0.0, nesterov=False, dampening=0.0) -> GradientTransformation:
    """Keras' SGD: ``m <- momentum * m - lr * g``; ``w <- w + m`` (or, with Nesterov,
    ``w <- w + momentum * m - lr * g``). With ``dampening``, ``g`` is scaled by ``1 - dampening``
    from the second step on, as in PyTorch."""

    def init(params):
        return TraceState(_count0(), _zeros(params) if momentum else {})

    def update(grads, state, params=None):
        updates, new_m = {}, {}
        for k, g in grads.items():
            lr = _lr(learning_rate, state.count, g.dtype)
            if not momentum:
                updates[k] = -(g * lr)
                continue
            mom = tf.cast(momentum, g.dtype)
            if dampening:
                g_eff = g * tf.where(state.count > 0, tf.cast(1 - dampening, g.dtype), tf.cast(1, g.dtype))
            else:
                g_eff = g
            m = state.momentum[k] * mom - g_eff * lr
            new_m[k] = m
            updates[k] = (m * mom - g * lr) if nesterov else m
        return updates, TraceState(state.count + 1, new_m)

    return GradientTransformation(init, update)


def adam_rule(learning_rate: Schedule, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False) -> GradientTransformation:
    """Keras' Adam: ``alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)``, ``w <- w - alpha * m /
    (sqrt(v) + epsilon)``."""

    def init(params):
        return AdamState(_count0(), _zeros(params), _zeros(params), _zeros(params) if amsgrad else {})

    def update(grads, state, params=None):
        updates, ms, vs, vhs = {}, {}, {}, {}
        for k, g in grads.items():
            dt = g.dtype
            lr = _lr(learning_rate, state.count, dt)
            t = tf.cast(state.count + 1, dt)
            b1p = tf.pow(tf.cast(beta_1, dt), t)
            b2p = tf.pow(tf.cast(beta_2, dt), t)
            alpha = lr * tf.sqrt(1 - b2p) / (1 - b1p)
            m = state.m[k] + (g - state.m[k]) * (1 - beta_1)
            v = state.v[k] + (tf.square(g) - state.v[k]) * (1 - beta_2)
            ms[k], vs[k] = m, v
            if amsgrad:
                v = tf.maximum(state.v_hat[k], v)
                vhs[k] = v
            updates[k] = -((m * alpha) / (tf.sqrt(v) + epsilon))
        return updates, AdamState(state.count + 1, ms, vs, vhs)

    return GradientTransformation(init, update)


def rmsprop_rule(learning_rate: Schedule, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False) -> GradientTransformation:
    """Keras' RMSprop: ``v <- rho v + (1 - rho) g^2``; ``step = lr g / sqrt(v [- avg^2] + eps)``;
    with momentum, ``m <- momentum m + step``, ``w <- w - m``."""

    def init(params):
        return RMSState(
            _count0(), _zeros(params), _zeros(params) if momentum > 0 else {}, _zeros(params) if centered else {}
        )

    def update(grads, state, params=None):
        updates, vel, mom, avg = {}, {}, {}, {}
        for k, g in grads.items():
            lr = _lr(learning_rate, state.count, g.dtype)
            v = rho * state.velocity[k] + (1 - rho) * tf.square(g)
            vel[k] = v
            if centered:
                a = rho * state.average_grad[k] + (1 - rho) * g
                avg[k] = a
                denominator = v - tf.square(a) + epsilon
            else:
                denominator = v + epsilon
            increment = (lr * g) / tf.sqrt(denominator)
            if momentum > 0:
                m = momentum * state.momentum[k] + increment
                mom[k] = m
                updates[k] = -m
            else:
                updates[k] = -increment
        return updates, RMSState(state.count + 1, vel, mom, avg)

    return GradientTransformation(init, update)


def adagrad_rule(learning_rate: Schedule, initial_accumulator_value=0.1, epsilon=1e-7) -> GradientTransformation:
    """Keras' Adagrad: ``acc <- acc + g^2``; ``w <- w - lr g / sqrt(acc + eps)``."""

    def init(params):
        return AdagradState(
            _count0(), {k: tf.fill(tf.shape(v), tf.cast(initial_accumulator_value, v.dtype)) for k, v in params.items()}
        )

    def update(grads, state, params=None):
        updates, acc = {}, {}
        for k, g in grads.items():
            lr = _lr(learning_rate, state.count, g.dtype)
            a = state.accumulator[k] + tf.square(g)
            acc[k] = a
            updates[k] = -((lr * g) / tf.sqrt(a + epsilon))
        return updates, AdagradState(state.count + 1, acc)

    return GradientTransformation(init, update)


def scale_by_trust_ratio(trust_coefficient=0.001, epsilon=0.0, mask=None) -> GradientTransformation:
    """LARS' layer-wise adaptation: ``g <- g * eta * ||w|| / ||g||`` where both norms are
    positive (else unchanged), for names ``mask`` accepts."""

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("scale_by_trust_ratio needs the current params.")
        out = {}
        for k, g in grads.items():
            if mask is not None and not mask(k):
                out[k] = g
                continue
            w_norm = tf.norm(params[k])
            g_norm = tf.norm(g)
            ratio = trust_coefficient * w_norm / (g_norm + epsilon)
            ratio = tf.where(tf.logical_and(w_norm > 0, g_norm > 0), ratio, tf.ones_like(ratio))
            out[k] = g * tf.cast(ratio, g.dtype)
        return out, state

    return GradientTransformation(lambda p: EmptyState(), update)
