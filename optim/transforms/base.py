"""The transformation contract, composition and argument checks.

A transformation is a pair of pure functions, as in optax::

    state = t.init(params)                        # params: dict name -> tensor
    updates, state = t.update(grads, state, params)

``updates`` are deltas (``w <- w + update``: ``TFNet.apply_updates``). States are small NamedTuples
of tensors, so they can be checkpointed, broadcast and passed through ``tf.function``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import tensorflow as tf

from optim.errors import OptimizerStateError

__all__ = [
    "GradientTransformation",
    "EmptyState",
    "CountState",
    "Params",
    "Schedule",
    "chain",
    "identity",
    "set_to_zero",
    "check_non_negative",
    "check_unit_interval",
]

Params = Mapping[str, tf.Tensor]
#: A learning rate: a number, or a callable ``step -> rate`` made of TensorFlow ops.
Schedule = float | Callable[[tf.Tensor], tf.Tensor]


class GradientTransformation(NamedTuple):
    """``init(params) -> state`` and ``update(grads, state, params=None) -> (updates, state)``."""

    init: Callable[[Params], Any]
    update: Callable[..., tuple[dict, Any]]


class EmptyState(NamedTuple):
    """The state of a transformation that keeps none."""


class CountState(NamedTuple):
    """A step count (int64, from 0): the state of transformations that read a schedule."""

    count: tf.Tensor


def count0() -> tf.Tensor:
    return tf.constant(0, tf.int64)


def zeros(params: Params) -> dict:
    return {k: tf.zeros_like(v) for k, v in params.items()}


def rate(schedule: Schedule, count: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """The value of ``schedule`` (a number or ``step -> value``) at ``count``, as ``dtype``."""
    value = schedule(count) if callable(schedule) else schedule
    return tf.cast(value, dtype)


def check_non_negative(name: str, value, allow_schedule: bool = False) -> None:
    """Raises ValueError unless ``value`` is a number >= 0 (or, if allowed, a callable schedule)."""
    if allow_schedule and callable(value):
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"`{name}` must be a non-negative number. Received: {name}={value!r}")


def check_unit_interval(name: str, value, closed_right: bool = False) -> None:
    """Raises ValueError unless ``value`` is a number in [0, 1) (or [0, 1] if ``closed_right``)."""
    ok = isinstance(value, (int, float)) and 0 <= value and (value <= 1 if closed_right else value < 1)
    if not ok:
        right = "]" if closed_right else ")"
        raise ValueError(f"`{name}` must be a float in [0, 1{right}. Received: {name}={value!r}")


def _describe(states) -> str:
    return ", ".join(type(s).__name__ for s in states)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Applies ``transforms`` in order; the state is the plain tuple of their states.

    ``update`` checks the state it is given: a state from another chain (another method, a
    checkpoint written with another optimiser) raises :class:`optim.errors.OptimizerStateError`
    instead of being zipped short.

    Example:
        >>> from optim import transforms as T
        >>> sgd = T.chain(T.scale_by_learning_rate(0.1), T.trace(momentum=0.9))
        >>> len(sgd.init({"w": tf.zeros([2])}))
        2
    """
    # Each part's state type, from an init over no weights (cheap, and the same NamedTuple class
    # that init gives for any weights); None where a part cannot say (then only the count is checked).
    expected = []
    for t in transforms:
        try:
            expected.append(type(t.init({})))
        except (KeyError, TypeError, ValueError):
            expected.append(None)

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(grads, state, params=None):
        if type(state) is not tuple or len(state) != len(transforms) or any(
            e is not None and type(s) is not e for e, s in zip(expected, state)
        ):
            got = f"{len(state)} ({_describe(state)})" if type(state) is tuple else f"one {type(state).__name__}"
            want = ", ".join("?" if e is None else e.__name__ for e in expected)
            raise OptimizerStateError(
                f"This chain of {len(transforms)} transforms expects a tuple of {len(transforms)} states ({want}); "
                f"received {got}. The state was made by another optimiser; start from this one's init()."
            )
        new_state = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s, params)
            new_state.append(s)
        return grads, tuple(new_state)

    return GradientTransformation(init, update)


def identity() -> GradientTransformation:
    """Leaves the updates unchanged."""
    return GradientTransformation(lambda params: EmptyState(), lambda g, s, p=None: (dict(g), s))


def set_to_zero() -> GradientTransformation:
    """Frozen: every update is zero."""
    return GradientTransformation(
        lambda params: EmptyState(), lambda g, s, p=None: ({k: tf.zeros_like(v) for k, v in g.items()}, s)
    )
