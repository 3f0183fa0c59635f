"""Weight decay: coupled (added to the gradient, before the learning rate) or decoupled with its
own learning rate (Keras' ``weight_decay``, for chains whose momentum follows the rate)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from optim.transforms.base import CountState, EmptyState, GradientTransformation, Schedule, check_non_negative, count0, rate

__all__ = ["add_decayed_weights", "decoupled_weight_decay"]


def add_decayed_weights(weight_decay: float, mask: Callable[[str], bool] | None = None) -> GradientTransformation:
    """``u <- u + weight_decay * w`` for the names ``mask`` accepts (all by default).

    Before a preconditioner this is L2 decay (``l2``); between a preconditioner and
    :func:`scale_by_learning_rate` it is decoupled decay (AdamW: ``w <- w - lr (d + wd w)``).
    """
    check_non_negative("weight_decay", weight_decay)

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("add_decayed_weights needs the current params. Received: params=None")
        return {
            k: g + tf.cast(weight_decay, g.dtype) * params[k] if (mask is None or mask(k)) else g
            for k, g in grads.items()
        }, state

    return GradientTransformation(lambda p: EmptyState(), update)


def decoupled_weight_decay(weight_decay: float, learning_rate: Schedule,
                           mask: Callable[[str], bool] | None = None) -> GradientTransformation:
    """Keras' ``weight_decay`` where the rate is already inside the updates: adds
    ``-w * weight_decay * lr`` (the schedule read at this transform's own step count).

    Goes last in a chain whose :func:`trace` follows :func:`scale_by_learning_rate` (Keras' SGD and
    RMSprop with momentum), where :func:`add_decayed_weights` before the rate would put the decay
    into the momentum, which Keras does not.
    """
    check_non_negative("weight_decay", weight_decay)

    def init(params):
        return CountState(count0())

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("decoupled_weight_decay needs the current params. Received: params=None")
        factors = {}  # -weight_decay * lr, one reading of the schedule per dtype
        out = {}
        for k, u in updates.items():
            if mask is None or mask(k):
                if u.dtype not in factors:
                    factors[u.dtype] = -(tf.cast(weight_decay, u.dtype) * rate(learning_rate, state.count, u.dtype))
                u = params[k] * factors[u.dtype] + u
            out[k] = u
        return out, CountState(state.count + 1)

    return GradientTransformation(init, update)
