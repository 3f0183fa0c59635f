"""An exponential moving average of the weights, as Keras 3's ``use_ema`` keeps it
(``keras/src/optimizers/base_optimizer.py``): after each update, ``avg <- m avg + (1 - m) w`` with ``m`` the momentum (0
at the first step, so the average starts at the first updated weights); every ``overwrite_frequency``-th step the
weights take the average's value; and when training ends the weights become the average
(:meth:`optim.methods.Method.final_weights`, as Keras's ``finalize_variable_values`` at the end of ``fit``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from optim.transforms.base import GradientTransformation, check_unit_interval, count0, zeros

__all__ = ["EmaState", "weight_average"]


class EmaState(NamedTuple):
    count: tf.Tensor  # steps taken, int64
    average: dict  # the moving average of each weight
    inner: Any  # the wrapped method's state


def weight_average(inner: GradientTransformation, momentum: float = 0.99,
                   overwrite_frequency: int | None = None) -> GradientTransformation:
    """``inner``'s updates, and the moving average of the weights they give.

    Raises:
        ValueError: ``momentum`` outside [0, 1], or ``overwrite_frequency`` not a positive integer.
    """
    check_unit_interval("ema_momentum", momentum, closed_right=True)
    if overwrite_frequency is not None and (isinstance(overwrite_frequency, bool) or
                                            not isinstance(overwrite_frequency, int) or overwrite_frequency < 1):
        raise ValueError(f"`ema_overwrite_frequency` must be a positive integer or None. Received: "
                         f"ema_overwrite_frequency={overwrite_frequency!r}")

    def init(params):
        return EmaState(count0(), zeros(params), inner.init(params))

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("The weights' moving average needs the current params. Received: params=None")
        updates, inner_state = inner.update(grads, state.inner, params)
        average = {}
        for k, u in updates.items():
            w = params[k] + tf.cast(u, params[k].dtype)
            m = tf.cast(tf.not_equal(state.count, 0), w.dtype) * tf.cast(momentum, w.dtype)
            average[k] = m * state.average[k] + (1 - m) * w
        if overwrite_frequency is not None:
            overwrite = tf.equal((state.count + 1) % overwrite_frequency, 0)
            updates = {k: tf.where(overwrite, tf.cast(average[k] - params[k], u.dtype), u) for k, u in updates.items()}
        return updates, EmaState(state.count + 1, average, inner_state)

    return GradientTransformation(init, update)
