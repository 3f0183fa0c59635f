"""Gradient clipping, as Keras' ``clipvalue``, ``clipnorm`` and ``global_clipnorm``."""

from __future__ import annotations

import tensorflow as tf

from optim.transforms.base import EmptyState, GradientTransformation, check_non_negative

__all__ = ["clip", "clip_by_norm", "clip_by_global_norm"]


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
