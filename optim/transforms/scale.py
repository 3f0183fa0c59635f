"""Directions and scales, factored as in optax: a preconditioner (``scale_by_adam``,
``scale_by_rms``, ``scale_by_adagrad``, ``scale_by_trust_ratio``) turns gradients into a direction,
``scale_by_learning_rate`` multiplies it by ``-lr`` (the schedule read at the step count), and
``trace`` adds momentum.

The formulas are Keras 3's, so that ``optim.methods`` equal ``keras.optimizers`` step for step:
Adam adds ``epsilon`` to ``sqrt(v)`` before the bias correction of ``v`` is applied (Keras'
"epsilon hat"), RMSprop and Adagrad add it under the square root.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from optim.transforms.base import (
    CountState,
    EmptyState,
    GradientTransformation,
    Schedule,
    check_non_negative,
    check_unit_interval,
    count0,
    rate,
    zeros,
)

__all__ = [
    "ScaleByAdamState",
    "ScaleByRmsState",
    "ScaleByAdagradState",
    "TraceState",
    "scale_by_adam",
    "scale_by_rms",
    "scale_by_adagrad",
    "scale_by_learning_rate",
    "scale_by_trust_ratio",
    "trace",
]


class ScaleByAdamState(NamedTuple):
    count: tf.Tensor
    mu: dict
    nu: dict
    nu_max: dict  # empty unless amsgrad


class ScaleByRmsState(NamedTuple):
    nu: dict
    mu: dict  # the gradients' moving average; empty unless centered


class ScaleByAdagradState(NamedTuple):
    sum_of_squares: dict


class TraceState(NamedTuple):
    count: tf.Tensor
    trace: dict


def scale_by_adam(beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                  amsgrad: bool = False) -> GradientTransformation:
    """Adam's direction, Keras 3's formula: ``m <- m + (g - m)(1 - b1)``, ``v <- v + (g^2 - v)(1 - b2)``,
    ``d = m * (sqrt(1 - b2^t) / (1 - b1^t)) / (sqrt(v) + epsilon)`` at step ``t`` (from 1).

    Args:
        beta_1: Decay of the first moment, in [0, 1). Default 0.9.
        beta_2: Decay of the second moment, in [0, 1). Default 0.999.
        epsilon: Added to ``sqrt(v)``. Default 1e-7.
        amsgrad: Use the running maximum of ``v`` (Reddi et al., 2018). Default False.
    """
    check_unit_interval("beta_1", beta_1)
    check_unit_interval("beta_2", beta_2)
    check_non_negative("epsilon", epsilon)

    def init(params):
        return ScaleByAdamState(count0(), zeros(params), zeros(params), zeros(params) if amsgrad else {})

    def update(grads, state, params=None):
        out, mu, nu, nu_max = {}, {}, {}, {}
        for k, g in grads.items():
            dt = g.dtype
            t = tf.cast(state.count + 1, dt)
            correction = tf.sqrt(1 - tf.pow(tf.cast(beta_2, dt), t)) / (1 - tf.pow(tf.cast(beta_1, dt), t))
            m = state.mu[k] + (g - state.mu[k]) * (1 - beta_1)
            v = state.nu[k] + (tf.square(g) - state.nu[k]) * (1 - beta_2)
            mu[k], nu[k] = m, v
            if amsgrad:
                v = nu_max[k] = tf.maximum(state.nu_max[k], v)
            out[k] = (m * correction) / (tf.sqrt(v) + epsilon)
        return out, ScaleByAdamState(state.count + 1, mu, nu, nu_max)

    return GradientTransformation(init, update)


def scale_by_rms(rho: float = 0.9, epsilon: float = 1e-7, centered: bool = False) -> GradientTransformation:
    """RMSprop's direction, Keras 3's formula: ``v <- rho v + (1 - rho) g^2``;
    ``d = g / sqrt(v + epsilon)``, or centered ``a <- rho a + (1 - rho) g``,
    ``d = g / sqrt(v - a^2 + epsilon)``.

    RMSprop's momentum is a :func:`trace` after :func:`scale_by_learning_rate` (the rate inside the
    momentum, as Keras has it).

    Args:
        rho: Decay of the squared-gradient average, in [0, 1). Default 0.9.
        epsilon: Added under the square root. Default 1e-7.
        centered: Divide by the gradients' estimated variance instead. Default False.
    """
    check_unit_interval("rho", rho)
    check_non_negative("epsilon", epsilon)

    def init(params):
        return ScaleByRmsState(zeros(params), zeros(params) if centered else {})

    def update(grads, state, params=None):
        out, nu, mu = {}, {}, {}
        for k, g in grads.items():
            v = nu[k] = rho * state.nu[k] + (1 - rho) * tf.square(g)
            if centered:
                a = mu[k] = rho * state.mu[k] + (1 - rho) * g
                denominator = v - tf.square(a) + epsilon
            else:
                denominator = v + epsilon
            out[k] = g / tf.sqrt(denominator)
        return out, ScaleByRmsState(nu, mu)

    return GradientTransformation(init, update)


def scale_by_adagrad(initial_accumulator_value: float = 0.1, epsilon: float = 1e-7) -> GradientTransformation:
    """Adagrad's direction, Keras 3's formula: ``s <- s + g^2``; ``d = g / sqrt(s + epsilon)``.

    Args:
        initial_accumulator_value: The sums' start value. Default 0.1.
        epsilon: Added under the square root. Default 1e-7.
    """
    check_non_negative("initial_accumulator_value", initial_accumulator_value)
    check_non_negative("epsilon", epsilon)

    def init(params):
        return ScaleByAdagradState(
            {k: tf.fill(tf.shape(v), tf.cast(initial_accumulator_value, v.dtype)) for k, v in params.items()}
        )

    def update(grads, state, params=None):
        out, sums = {}, {}
        for k, g in grads.items():
            s = sums[k] = state.sum_of_squares[k] + tf.square(g)
            out[k] = g / tf.sqrt(s + epsilon)
        return out, ScaleByAdagradState(sums)

    return GradientTransformation(init, update)


def scale_by_learning_rate(learning_rate: Schedule, flip_sign: bool = True) -> GradientTransformation:
    """Multiplies the updates by ``-learning_rate`` (``+`` if not ``flip_sign``), a number or a
    schedule read at this transform's step count (0 at the first update).

    Args:
        learning_rate: A non-negative number, or a callable ``step -> rate`` of TensorFlow ops
            (``optim.schedules``, a Keras ``LearningRateSchedule``).
        flip_sign: Descend (``-lr``). Default True.
    """
    check_non_negative("learning_rate", learning_rate, allow_schedule=True)

    def init(params):
        return CountState(count0())

    def update(updates, state, params=None):
        factors = {}  # one reading of the schedule per dtype; the sign goes on the scalar
        out = {}
        for k, u in updates.items():
            if u.dtype not in factors:
                lr = rate(learning_rate, state.count, u.dtype)
                factors[u.dtype] = -lr if flip_sign else lr
            out[k] = u * factors[u.dtype]
        return out, CountState(state.count + 1)

    return GradientTransformation(init, update)


def trace(momentum: float, nesterov: bool = False, dampening: float = 0.0) -> GradientTransformation:
    """Momentum: ``t <- momentum * t + u``; the update is ``t``, or ``momentum * t + u`` with
    Nesterov. With ``dampening``, ``u`` enters as ``(1 - dampening) u`` from the second step on
    (PyTorch's SGD).

    After :func:`scale_by_learning_rate` this is Keras' SGD momentum (``v <- m v - lr g``) exactly,
    schedules included: the trace accumulates past rates, as Keras' does.

    Args:
        momentum: In [0, 1].
        nesterov: Default False.
        dampening: In [0, 1]. Default 0.0.
    """
    check_unit_interval("momentum", momentum, closed_right=True)
    check_unit_interval("dampening", dampening, closed_right=True)

    def init(params):
        return TraceState(count0(), zeros(params))

    def update(updates, state, params=None):
        out, new = {}, {}
        for k, u in updates.items():
            mom = tf.cast(momentum, u.dtype)
            u_in = u
            if dampening:
                u_in = u * tf.where(state.count > 0, tf.cast(1 - dampening, u.dtype), tf.cast(1, u.dtype))
            t = new[k] = state.trace[k] * mom + u_in
            out[k] = t * mom + u if nesterov else t
        return out, TraceState(state.count + 1, new)

    return GradientTransformation(init, update)


def scale_by_trust_ratio(trust_coefficient: float = 0.001, epsilon: float = 0.0,
                         mask: Callable[[str], bool] | None = None) -> GradientTransformation:
    """LARS' layer-wise adaptation: ``g <- g * eta * ||w|| / (||g|| + epsilon)`` where both norms
    are positive (else unchanged), for the names ``mask`` accepts (all by default)."""
    check_non_negative("trust_coefficient", trust_coefficient)
    check_non_negative("epsilon", epsilon)

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("scale_by_trust_ratio needs the current params. Received: params=None")
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
