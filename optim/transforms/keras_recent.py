"""Keras 3's most recent optimisers' rules, so ``optim.ScheduleFreeAdamW`` and ``optim.Muon`` equal
``keras.optimizers.ScheduleFreeAdamW`` and ``Muon`` step for step (``keras/src/optimizers/{schedule_free_adamw,
muon}.py``). Each is the whole update, its rate and weight decay inside it (the weights read after the step's decay,
as Keras's step reads them).

* Schedule-free AdamW (Defazio et al., 2024): ``z <- z - lr g / (sqrt(v / (1 - b2^t)) + eps)`` (``z`` starts at the
  weights, ``lr`` warmed up over ``warmup_steps``), ``x = (y - (1 - b1) z) / b1`` recovered from the weights ``y``,
  ``x <- (1 - 1/t) x + z / t``, and the weights become ``(1 - b1) z + b1 x``. Keras recovers ``x`` with the ``z`` of
  this step, not the last one as the paper does (its "momentum_old" is the live variable, read after the update), and
  so does this rule, to equal Keras (with the last step's ``z``: 1.5e-2 apart after 10 steps);
* Muon (Jordan et al., 2024, Keras's form with Moonlight's scale): a matrix's Nesterov momentum orthogonalised by
  ``ns_steps`` quintic Newton-Schulz iterations, times ``sqrt(max(rows, cols)) * rms_rate``; every other weight (not
  of rank 2, an embedding's, ``exclude_layers``'s) takes AdamW's step at ``lr * adam_lr_ratio`` with
  ``adam_weight_decay``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from optim.transforms.base import GradientTransformation, Schedule, check_non_negative, check_unit_interval, count0, rate
from optim.transforms.relative import Decay, decayed

__all__ = ["ScheduleFreeState", "MuonState", "schedule_free_adamw", "muon"]


class ScheduleFreeState(NamedTuple):
    count: tf.Tensor
    z: dict  # Keras's "momentum": where the gradient steps are taken
    nu: dict


class MuonState(NamedTuple):
    count: tf.Tensor
    mu: dict
    nu: dict  # the AdamW weights' second moment only


def schedule_free_adamw(learning_rate: Schedule = 0.0025, beta_1: float = 0.9, beta_2: float = 0.999,
                        epsilon: float = 1e-8, warmup_steps: int = 0, decay: Decay | None = None) -> GradientTransformation:
    """Schedule-free AdamW's whole update. Defaults as Keras's."""
    check_non_negative("learning_rate", learning_rate, allow_schedule=True)
    check_unit_interval("beta_1", beta_1)
    check_unit_interval("beta_2", beta_2)
    check_non_negative("epsilon", epsilon)
    check_non_negative("warmup_steps", warmup_steps)

    def init(params):
        return ScheduleFreeState(count0(), {k: tf.identity(v) for k, v in params.items()},
                                 {k: tf.zeros_like(v) for k, v in params.items()})

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("schedule_free_adamw needs the current params. Received: params=None")
        weights = decayed(params, state.count, decay)
        out, z, nu = {}, {}, {}
        for k, g in grads.items():
            t = tf.cast(state.count + 1, g.dtype)
            lr = rate(learning_rate, state.count, g.dtype)
            if warmup_steps > 0:
                lr = lr * tf.minimum(t / warmup_steps, 1.0)
            nu[k] = state.nu[k] + (tf.square(g) - state.nu[k]) * (1 - beta_2)
            z[k] = state.z[k] - lr * g / (tf.sqrt(nu[k] / (1 - tf.pow(tf.cast(beta_2, g.dtype), t))) + epsilon)
            x = (weights[k] - (1 - beta_1) * z[k]) / beta_1
            x = (1.0 - 1.0 / t) * x + z[k] / t
            out[k] = ((1 - beta_1) * z[k] + beta_1 * x) - params[k]
        return out, ScheduleFreeState(state.count + 1, z, nu)

    return GradientTransformation(init, update)


def _newton_schulz(x: tf.Tensor, steps: int, a: float, b: float, c: float) -> tf.Tensor:
    """Keras's ``zeropower_via_newtonschulz5``: ``x`` near its orthogonal factor."""
    wide = x.shape[-2] > x.shape[-1]
    if wide:
        x = tf.linalg.matrix_transpose(x)
    x = x / (tf.norm(x, axis=(-2, -1), keepdims=True) + 1e-7)
    for _ in range(steps):
        gram = x @ tf.linalg.matrix_transpose(x)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return tf.linalg.matrix_transpose(x) if wide else x


def muon(learning_rate: Schedule = 0.001, adamw: Callable[[str, tf.TensorShape], bool] | None = None,
         adam_beta_1: float = 0.9, adam_beta_2: float = 0.999, epsilon: float = 1e-7, adam_lr_ratio: float = 1.0,
         momentum: float = 0.95, ns_steps: int = 5, nesterov: bool = True, rms_rate: float | None = 0.2,
         coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315), decay: Decay | None = None,
         adam_decay: Decay | None = None) -> GradientTransformation:
    """Muon's whole update; ``adamw(name, shape)`` says which weights take AdamW's step instead (default: those not of
    rank 2), ``decay`` and ``adam_decay`` the two groups' weight decay. Defaults as Keras's."""
    check_non_negative("learning_rate", learning_rate, allow_schedule=True)
    check_unit_interval("momentum", momentum, closed_right=True)
    is_adam = adamw or (lambda name, shape: shape.rank != 2)

    def init(params):
        return MuonState(count0(), {k: tf.zeros_like(v) for k, v in params.items()},
                         {k: tf.zeros_like(v) for k, v in params.items() if is_adam(k, v.shape)})

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("muon needs the current params. Received: params=None")
        adam_weights = decayed({k: v for k, v in params.items() if k in state.nu}, state.count, adam_decay)
        muon_weights = decayed({k: v for k, v in params.items() if k not in state.nu}, state.count, decay)
        out, mu, nu = {}, {}, {}
        for k, g in grads.items():
            lr = rate(learning_rate, state.count, g.dtype)
            if k in state.nu:
                t = tf.cast(state.count + 1, g.dtype)
                alpha = (lr * adam_lr_ratio * tf.sqrt(1 - tf.pow(tf.cast(adam_beta_2, g.dtype), t))
                         / (1 - tf.pow(tf.cast(adam_beta_1, g.dtype), t)))
                mu[k] = state.mu[k] + (g - state.mu[k]) * (1 - adam_beta_1)
                nu[k] = state.nu[k] + (tf.square(g) - state.nu[k]) * (1 - adam_beta_2)
                out[k] = (adam_weights[k] - params[k]) - mu[k] * alpha / (tf.sqrt(nu[k]) + epsilon)
                continue
            mu[k] = state.mu[k] + g + state.mu[k] * (momentum - 1)
            direction = _newton_schulz(g + momentum * mu[k] if nesterov else mu[k], ns_steps, *coefficients)
            step = lr * direction
            if rms_rate is not None:
                step = step * tf.sqrt(tf.cast(max(g.shape[0], g.shape[1]), g.dtype)) * rms_rate
            out[k] = (muon_weights[k] - params[k]) - step
        return out, MuonState(state.count + 1, mu, nu)

    return GradientTransformation(init, update)
