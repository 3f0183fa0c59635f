"""Gradient accumulation, as Keras 3's ``gradient_accumulation_steps`` (``keras/src/optimizers/base_optimizer.py``):
each step adds its gradients to an accumulator and leaves the weights; every ``steps``-th step averages the
accumulated gradients with its own, ``(g + acc) / steps``, hands them to the wrapped method (its clipping, weight
decay and update, whose own counters so count updates, not steps, as Keras's ``iterations`` does) and empties the
accumulator. A larger batch in ``steps`` parts, where memory holds one part."""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from optim.transforms.base import GradientTransformation, count0, zeros

__all__ = ["AccumulationState", "accumulate_gradients"]


class AccumulationState(NamedTuple):
    count: tf.Tensor  # steps taken, int64
    accumulated: dict  # the gradients added since the last update
    inner: Any  # the wrapped method's state


def accumulate_gradients(inner: GradientTransformation, steps: int) -> GradientTransformation:
    """``inner`` applied every ``steps``-th step to the mean of that many steps' gradients; no update between.

    Raises:
        ValueError: ``steps`` is not an integer of at least 2.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"`gradient_accumulation_steps` must be an integer >= 2. Received: "
                         f"gradient_accumulation_steps={steps!r}")

    def init(params):
        return AccumulationState(count0(), zeros(params), inner.init(params))

    def update(grads, state, params=None):
        def apply():
            mean = {k: (g + state.accumulated[k]) / tf.cast(steps, g.dtype) for k, g in grads.items()}
            updates, inner_state = inner.update(mean, state.inner, params)
            return updates, {k: tf.zeros_like(a) for k, a in state.accumulated.items()}, inner_state

        def add():
            return ({k: tf.zeros_like(g) for k, g in grads.items()},
                    {k: state.accumulated[k] + g for k, g in grads.items()}, state.inner)

        updates, accumulated, inner_state = tf.cond(tf.equal((state.count + 1) % steps, 0), apply, add)
        return updates, AccumulationState(state.count + 1, accumulated, inner_state)

    return GradientTransformation(init, update)
