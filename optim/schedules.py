"""Learning-rate schedules: callables ``step -> learning rate`` built from TensorFlow ops, so they
run inside the compiled training step. ``step`` counts updates from 0. Formulas follow
``keras.optimizers.schedules``.

Any schedule can follow a linear warm-up: ``warmup(cosine(0.1, 1000), warmup_steps=100)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tensorflow as tf

from optim.transforms import check_non_negative

__all__ = ["constant", "step_decay", "exponential", "polynomial", "cosine", "warmup", "Schedule"]


class Schedule:
    """A learning-rate schedule. Call it with a step (int or tensor) to get the rate."""

    def __init__(self, fn: Callable[[tf.Tensor], tf.Tensor], description: str):
        self._fn = fn
        self.description = description

    def __call__(self, step) -> tf.Tensor:
        return self._fn(tf.cast(step, tf.float32))

    def __repr__(self) -> str:
        return self.description


def _positive(name: str, value) -> None:
    if not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"`{name}` must be positive. Received: {name}={value!r}")


def constant(learning_rate: float) -> Schedule:
    check_non_negative("learning_rate", learning_rate)
    return Schedule(lambda step: tf.constant(learning_rate, tf.float32), f"constant({learning_rate})")


def step_decay(learning_rate: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """``lr * gamma ** floor(step / step_size)`` (PyTorch's StepLR, per step)."""
    check_non_negative("learning_rate", learning_rate)
    _positive("step_size", step_size)
    check_non_negative("gamma", gamma)
    return Schedule(
        lambda step: learning_rate * tf.pow(tf.constant(gamma, tf.float32), tf.floor(step / step_size)),
        f"step_decay({learning_rate}, step_size={step_size}, gamma={gamma})",
    )


def exponential(learning_rate: float, decay_steps: int, decay_rate: float, staircase: bool = False) -> Schedule:
    """``lr * decay_rate ** (step / decay_steps)``, the exponent floored if ``staircase``
    (Keras ``ExponentialDecay``)."""
    check_non_negative("learning_rate", learning_rate)
    _positive("decay_steps", decay_steps)
    check_non_negative("decay_rate", decay_rate)

    def fn(step):
        p = step / decay_steps
        if staircase:
            p = tf.floor(p)
        return learning_rate * tf.pow(tf.constant(decay_rate, tf.float32), p)

    return Schedule(fn, f"exponential({learning_rate}, decay_steps={decay_steps}, decay_rate={decay_rate})")


def polynomial(
    learning_rate: float, decay_steps: int, end_learning_rate: float = 1e-4, power: float = 1.0, cycle: bool = False
) -> Schedule:
    """``(lr - end) * (1 - step / decay_steps) ** power + end`` (Keras ``PolynomialDecay``)."""
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("end_learning_rate", end_learning_rate)
    _positive("decay_steps", decay_steps)

    def fn(step):
        steps = tf.constant(float(decay_steps))
        if cycle:
            mult = tf.where(tf.equal(step, 0), 1.0, tf.math.ceil(step / steps))
            steps = steps * mult
        else:
            step = tf.minimum(step, steps)
        return (learning_rate - end_learning_rate) * tf.pow(1 - step / steps, power) + end_learning_rate

    return Schedule(fn, f"polynomial({learning_rate}, decay_steps={decay_steps}, end={end_learning_rate}, power={power})")


def cosine(learning_rate: float, decay_steps: int, alpha: float = 0.0) -> Schedule:
    """``lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps)) + alpha)``
    (Keras ``CosineDecay``)."""
    check_non_negative("learning_rate", learning_rate)
    _positive("decay_steps", decay_steps)

    def fn(step):
        done = tf.minimum(step, float(decay_steps)) / decay_steps
        decayed = (1 - alpha) * 0.5 * (1.0 + tf.cos(math.pi * done)) + alpha
        return learning_rate * decayed

    return Schedule(fn, f"cosine({learning_rate}, decay_steps={decay_steps}, alpha={alpha})")


def warmup(schedule: Schedule | float, warmup_steps: int, start_learning_rate: float = 0.0) -> Schedule:
    """Rises linearly from ``start_learning_rate`` to ``schedule(0)`` over ``warmup_steps``, then
    follows ``schedule`` counted from the end of the warm-up."""
    if not callable(schedule):
        schedule = constant(schedule)
    _positive("warmup_steps", warmup_steps)
    check_non_negative("start_learning_rate", start_learning_rate)

    def fn(step):
        target = schedule(0)
        ramp = start_learning_rate + (target - start_learning_rate) * (step / warmup_steps)
        after = schedule(tf.maximum(step - warmup_steps, 0.0))
        return tf.where(step < warmup_steps, ramp, after)

    return Schedule(fn, f"warmup({schedule!r}, warmup_steps={warmup_steps})")
