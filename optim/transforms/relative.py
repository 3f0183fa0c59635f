"""Keras 3's remaining optimisers' rules, so ``optim.Adadelta``, ``optim.Lamb`` and ``optim.Adafactor`` equal
``keras.optimizers.Adadelta``, ``Lamb`` and ``Adafactor`` step for step (``keras/src/optimizers/{adadelta,lamb,
adafactor}.py``). Lamb and Adafactor read the weights (a trust ratio, a step relative to the weights' size): where the
method has a ``weight_decay``, Keras reads them after that step's decay (``w - w * wd * lr``), and so do these.

* Adadelta (Zeiler, 2012): ``a <- rho a + (1 - rho) g^2``, ``d = sqrt(s + eps) g / sqrt(a + eps)``,
  ``s <- rho s + (1 - rho) d^2``; then the rate;
* Lamb (You et al., 2019): Adam's bias-corrected ``m / (sqrt(v) + eps)`` times ``||w|| / ||that||`` per weight
  (1 where either norm is 0); then the rate;
* FTRL-proximal (McMahan et al., 2013, Keras's form): the weights solved from an accumulated linear term and the
  summed squared gradients, with L1, L2 and L2-shrinkage: the whole update, the rate inside it;
* Adafactor (Shazeer and Stern, 2018, Keras's form): the second moment of a matrix kept as its row and column means,
  ``rho_t = min(lr, 1 / sqrt(t))``, a step ``max(eps_2, rms(w)) * rho_t`` times the gradient over the root of the
  second moment, clipped to an RMS of ``clip_threshold``: the whole update, the rate inside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from optim.transforms.base import (
    GradientTransformation,
    Schedule,
    check_non_negative,
    check_unit_interval,
    count0,
    rate,
    zeros,
)

__all__ = ["ScaleByAdadeltaState", "ScaleByLambState", "AdafactorState", "FtrlState", "scale_by_adadelta",
           "scale_by_lamb", "adafactor", "ftrl"]

#: ``(weight_decay, learning_rate, mask)``: the decay Keras applies before the step that reads the weights
Decay = tuple[float, Schedule, Callable[[str], bool] | None]


class ScaleByAdadeltaState(NamedTuple):
    grad_sq: dict
    delta_sq: dict


class ScaleByLambState(NamedTuple):
    count: tf.Tensor
    mu: dict
    nu: dict


class FtrlState(NamedTuple):
    count: tf.Tensor
    accumulator: dict
    linear: dict


class AdafactorState(NamedTuple):
    count: tf.Tensor
    rows: dict  # a matrix's (rank >= 2) second moment, its mean over the last axis
    cols: dict  # and over the one before
    full: dict  # a vector's (rank < 2) second moment


def decayed(params: dict, count, decay: Decay | None) -> dict:
    """The weights as Keras's step reads them: after this step's decoupled weight decay, where there is one."""
    if decay is None or not decay[0]:
        return params
    weight_decay, learning_rate, mask = decay
    out = {}
    for k, w in params.items():
        factor = tf.cast(weight_decay, w.dtype) * rate(learning_rate, count, w.dtype)
        out[k] = w - w * factor if mask is None or mask(k) else w
    return out


def _rms(x: tf.Tensor) -> tf.Tensor:
    return tf.sqrt(tf.reduce_mean(tf.square(x)))


def scale_by_adadelta(rho: float = 0.95, epsilon: float = 1e-7) -> GradientTransformation:
    """Adadelta's direction. Defaults as Keras's: rho 0.95, epsilon 1e-7."""
    check_unit_interval("rho", rho)
    check_non_negative("epsilon", epsilon)

    def update(grads, state, params=None):
        out, grad_sq, delta_sq = {}, {}, {}
        for k, g in grads.items():
            grad_sq[k] = rho * state.grad_sq[k] + (1 - rho) * tf.square(g)
            out[k] = tf.sqrt(state.delta_sq[k] + epsilon) * g / tf.sqrt(grad_sq[k] + epsilon)
            delta_sq[k] = rho * state.delta_sq[k] + (1 - rho) * tf.square(out[k])
        return out, ScaleByAdadeltaState(grad_sq, delta_sq)

    return GradientTransformation(lambda params: ScaleByAdadeltaState(zeros(params), zeros(params)), update)


def scale_by_lamb(beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
                  decay: Decay | None = None) -> GradientTransformation:
    """Lamb's direction: Adam's, scaled per weight by the trust ratio ``||w|| / ||d||`` (the weights after
    ``decay``'s step, as Keras reads them). Defaults as Keras's: beta_1 0.9, beta_2 0.999, epsilon 1e-6."""
    check_unit_interval("beta_1", beta_1)
    check_unit_interval("beta_2", beta_2)
    check_non_negative("epsilon", epsilon)

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("scale_by_lamb needs the current params. Received: params=None")
        weights = decayed(params, state.count, decay)
        out, mu, nu = {}, {}, {}
        for k, g in grads.items():
            t = tf.cast(state.count + 1, g.dtype)
            mu[k] = state.mu[k] + (g - state.mu[k]) * (1 - beta_1)
            nu[k] = state.nu[k] + (tf.square(g) - state.nu[k]) * (1 - beta_2)
            m_hat = mu[k] / (1.0 - tf.pow(tf.cast(beta_1, g.dtype), t))
            direction = m_hat / (tf.sqrt(nu[k] / (1.0 - tf.pow(tf.cast(beta_2, g.dtype), t))) + epsilon)
            w_norm, d_norm = tf.norm(weights[k]), tf.norm(direction)
            ratio = tf.where(w_norm > 0, tf.where(d_norm > 0, w_norm / d_norm, 1.0), 1.0)
            out[k] = ratio * direction
        return out, ScaleByLambState(state.count + 1, mu, nu)

    return GradientTransformation(lambda params: ScaleByLambState(count0(), zeros(params), zeros(params)), update)


def adafactor(learning_rate: Schedule = 0.001, beta_2_decay: float = -0.8, epsilon_1: float = 1e-30,
              epsilon_2: float = 1e-3, clip_threshold: float = 1.0, decay: Decay | None = None) -> GradientTransformation:
    """Adafactor's whole update, the rate and ``decay``'s weight decay inside it (Keras's step scales by neither
    afterwards). Defaults as Keras's."""
    check_non_negative("learning_rate", learning_rate, allow_schedule=True)
    for name, value in (("epsilon_1", epsilon_1), ("epsilon_2", epsilon_2), ("clip_threshold", clip_threshold)):
        check_non_negative(name, value)

    def init(params):
        rows = {k: tf.zeros(v.shape[:-1], v.dtype) for k, v in params.items() if v.shape.rank >= 2}
        cols = {k: tf.zeros(v.shape[:-2] + v.shape[-1:], v.dtype) for k, v in params.items() if v.shape.rank >= 2}
        full = {k: tf.zeros_like(v) for k, v in params.items() if v.shape.rank < 2}
        return AdafactorState(count0(), rows, cols, full)

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("adafactor needs the current params. Received: params=None")
        weights = decayed(params, state.count, decay)
        out, rows, cols, full = {}, {}, {}, {}
        for k, g in grads.items():
            t = tf.cast(state.count + 1, g.dtype)
            lr = rate(learning_rate, state.count, g.dtype)
            step = tf.minimum(lr, 1.0 / tf.sqrt(t))
            alpha = tf.maximum(tf.cast(epsilon_2, g.dtype), _rms(weights[k])) * step
            g2 = tf.square(g) + epsilon_1
            b = 1.0 - tf.pow(t, tf.cast(beta_2_decay, g.dtype))
            if g.shape.rank >= 2:
                rows[k] = b * state.rows[k] + (1.0 - b) * tf.reduce_mean(g2, axis=-1)
                cols[k] = b * state.cols[k] + (1.0 - b) * tf.reduce_mean(g2, axis=-2)
                v = (tf.expand_dims(rows[k] / tf.reduce_mean(rows[k], axis=-1, keepdims=True), -1)
                     * tf.expand_dims(cols[k], -2))
            else:
                v = full[k] = b * state.full[k] + (1.0 - b) * g2
            u = g / tf.sqrt(v)
            u = u / tf.maximum(1.0, _rms(u) / clip_threshold)
            out[k] = (weights[k] - params[k]) - alpha * u  # the decay's step (0 without one), then Adafactor's
        return out, AdafactorState(state.count + 1, rows, cols, full)

    return GradientTransformation(init, update)


def ftrl(learning_rate: Schedule = 0.001, learning_rate_power: float = -0.5, initial_accumulator_value: float = 0.1,
         l1: float = 0.0, l2: float = 0.0, l2_shrinkage: float = 0.0, beta: float = 0.0,
         decay: Decay | None = None) -> GradientTransformation:
    """FTRL-proximal's whole update, the rate and ``decay``'s weight decay inside it: the new weights are solved, not
    stepped to, as Keras's ``Ftrl`` assigns them. Defaults as Keras's."""
    check_non_negative("learning_rate", learning_rate, allow_schedule=True)
    for name, value in (("initial_accumulator_value", initial_accumulator_value), ("l1_regularization_strength", l1),
                        ("l2_regularization_strength", l2), ("l2_shrinkage_regularization_strength", l2_shrinkage),
                        ("beta", beta)):
        check_non_negative(name, value)
    if learning_rate_power > 0:
        raise ValueError(f"`learning_rate_power` must be negative or zero. Received: learning_rate_power="
                         f"{learning_rate_power}")

    def init(params):
        accumulator = {k: tf.fill(tf.shape(v), tf.cast(initial_accumulator_value, v.dtype)) for k, v in params.items()}
        return FtrlState(count0(), accumulator, zeros(params))

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("ftrl needs the current params. Received: params=None")
        weights = decayed(params, state.count, decay)
        out, accumulator, linear = {}, {}, {}
        for k, g in grads.items():
            w, lr, power = weights[k], rate(learning_rate, state.count, g.dtype), tf.cast(-learning_rate_power, g.dtype)
            l2_total = l2 + beta / (2.0 * lr)
            accumulator[k] = state.accumulator[k] + tf.square(g)
            shrunk = g + 2.0 * l2_shrinkage * w
            linear[k] = state.linear[k] + shrunk - (tf.pow(accumulator[k], power)
                                                    - tf.pow(state.accumulator[k], power)) / lr * w
            quadratic = tf.pow(accumulator[k], power) / lr + 2.0 * l2_total
            solved = (tf.clip_by_value(linear[k], -l1, l1) - linear[k]) / quadratic
            out[k] = solved - params[k]
        return out, FtrlState(state.count + 1, accumulator, linear)

    return GradientTransformation(init, update)
