"""More preconditioners with Keras 3's formulas, so ``optim.Lion``, ``optim.Adamax`` and ``optim.Nadam`` equal
``keras.optimizers.Lion``, ``Adamax`` and ``Nadam`` step for step (``keras/src/optimizers/{lion,adamax,nadam}.py``):

* Lion (Chen et al., 2023): ``d = sign(b1 m + (1 - b1) g)``, then ``m <- b2 m + (1 - b2) g``;
* Adamax: ``m <- m + (g - m)(1 - b1)``, ``u <- max(b2 u, |g|)``, ``d = m / ((1 - b1^t)(u + epsilon))``;
* Nadam (Dozat, 2016, with Keras's momentum schedule ``u_t = b1 (1 - 0.5 * 0.96^t)``): ``m``, ``v`` as Adam's,
  ``d = (u_{t+1} m / (1 - P_t u_{t+1}) + (1 - u_t) g / (1 - P_t)) / (sqrt(v / (1 - b2^t)) + epsilon)`` where ``P_t``
  is the product of ``u_1 .. u_t``.

Each gives a direction; :func:`optim.transforms.scale_by_learning_rate` then scales it by ``-lr``.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from optim.transforms.base import GradientTransformation, check_non_negative, check_unit_interval, count0, zeros

__all__ = ["ScaleByLionState", "ScaleByAdamaxState", "ScaleByNadamState", "scale_by_lion", "scale_by_adamax",
           "scale_by_nadam"]


class ScaleByLionState(NamedTuple):
    mu: dict


class ScaleByAdamaxState(NamedTuple):
    count: tf.Tensor
    mu: dict
    u: dict


class ScaleByNadamState(NamedTuple):
    count: tf.Tensor
    u_product: tf.Tensor  # the product of the momentum schedule's values so far (Keras's _u_product)
    mu: dict
    nu: dict


def scale_by_lion(beta_1: float = 0.9, beta_2: float = 0.99) -> GradientTransformation:
    """Lion's direction. Defaults as Keras's: beta_1 0.9, beta_2 0.99."""
    check_unit_interval("beta_1", beta_1, closed_right=True)
    check_unit_interval("beta_2", beta_2, closed_right=True)

    def update(grads, state, params=None):
        out, mu = {}, {}
        for k, g in grads.items():
            out[k] = tf.sign(state.mu[k] * beta_1 + g * (1.0 - beta_1))
            mu[k] = state.mu[k] * beta_2 + g * (1.0 - beta_2)
        return out, ScaleByLionState(mu)

    return GradientTransformation(lambda params: ScaleByLionState(zeros(params)), update)


def scale_by_adamax(beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7) -> GradientTransformation:
    """Adamax's direction (Adam with the infinity norm). Defaults as Keras's."""
    check_unit_interval("beta_1", beta_1)
    check_unit_interval("beta_2", beta_2)
    check_non_negative("epsilon", epsilon)

    def update(grads, state, params=None):
        out, mu, u = {}, {}, {}
        for k, g in grads.items():
            t = tf.cast(state.count + 1, g.dtype)
            mu[k] = state.mu[k] + (g - state.mu[k]) * (1 - beta_1)
            u[k] = tf.maximum(beta_2 * state.u[k], tf.abs(g))
            out[k] = mu[k] / ((1 - tf.pow(tf.cast(beta_1, g.dtype), t)) * (u[k] + epsilon))
        return out, ScaleByAdamaxState(state.count + 1, mu, u)

    return GradientTransformation(lambda params: ScaleByAdamaxState(count0(), zeros(params), zeros(params)), update)


def scale_by_nadam(beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7) -> GradientTransformation:
    """Nadam's direction, Keras 3's formula (its momentum schedule and running product). Defaults as Keras's."""
    check_unit_interval("beta_1", beta_1)
    check_unit_interval("beta_2", beta_2)
    check_non_negative("epsilon", epsilon)

    def init(params):
        return ScaleByNadamState(count0(), tf.constant(1.0, tf.float32), zeros(params), zeros(params))

    def update(grads, state, params=None):
        t = tf.cast(state.count + 1, tf.float32)
        u_product = state.u_product * beta_1 * (1.0 - 0.5 * tf.pow(0.96, t))  # once per step, before the weights
        out, mu, nu = {}, {}, {}
        for k, g in grads.items():
            dt = g.dtype
            step, b1, b2 = tf.cast(t, dt), tf.cast(beta_1, dt), tf.cast(beta_2, dt)
            u_t = b1 * (1.0 - 0.5 * tf.pow(tf.cast(0.96, dt), step))
            u_next = b1 * (1.0 - 0.5 * tf.pow(tf.cast(0.96, dt), step + 1))
            product = tf.cast(u_product, dt)
            mu[k] = state.mu[k] + (g - state.mu[k]) * (1 - b1)
            nu[k] = state.nu[k] + (tf.square(g) - state.nu[k]) * (1 - b2)
            m_hat = u_next * mu[k] / (1 - product * u_next) + (1 - u_t) * g / (1 - product)
            v_hat = nu[k] / (1 - tf.pow(b2, step))
            out[k] = m_hat / (tf.sqrt(v_hat) + epsilon)
        return out, ScaleByNadamState(state.count + 1, u_product, mu, nu)

    return GradientTransformation(init, update)
