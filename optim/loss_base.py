"""The loss contract every tfnet loss keeps: :class:`Loss` (``loss(y_true, y_pred) -> scalar``, the mean over the
batch, of the per-example values ``call`` gives) and :class:`SampleWeighted` labels. :mod:`optim.losses` builds its
losses on it and re-exports both; :mod:`optim.keras_losses` builds the Keras loss wrapper on it."""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from optim.errors import LabelShapeError

__all__ = ["Loss", "SampleWeighted", "as_tensors", "weighted_mean"]


class SampleWeighted(NamedTuple):
    """Labels with one weight per example: what a loss receives when the data carries sample
    weights (``(x, y, w)``, or ``optimize(..., sample_weight=w)``)."""

    labels: Any
    weights: Any


def as_tensors(y_true, y_pred):
    return tf.convert_to_tensor(y_true), tf.convert_to_tensor(y_pred)


def weighted_mean(per_example: tf.Tensor, weights) -> tf.Tensor:
    """Keras's ``sum_over_batch_size`` reduction of weighted losses: ``sum(w * loss) / n``, a
    weight spread over an example's elements, ``n`` the number of loss elements."""
    w = tf.cast(tf.convert_to_tensor(weights), per_example.dtype)
    w = tf.reshape(w, tf.concat([[-1], tf.ones([tf.rank(per_example) - 1], tf.int32)], 0))
    total = tf.reduce_sum(per_example * w)
    return total / tf.cast(tf.size(per_example), per_example.dtype)


class Loss:
    """Base class. Subclasses implement ``call(y_true, y_pred)`` returning per-example losses."""

    name = "loss"

    def __call__(self, y_true, y_pred) -> tf.Tensor:
        weights = None
        if isinstance(y_true, SampleWeighted):
            y_true, weights = y_true.labels, y_true.weights
        y_true, y_pred = as_tensors(y_true, y_pred)
        per_example = self.call(self.align(y_true, y_pred), y_pred)
        return tf.reduce_mean(per_example) if weights is None else weighted_mean(per_example, weights)

    def align(self, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        """The labels in the form :meth:`call` takes (a subclass pairs ``(n,)`` labels with ``(n, 1)`` outputs here).
        Default: as they are."""
        return y_true

    def call(self, y_true, y_pred) -> tf.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_shapes(self, y_true_shape: tuple, y_pred_shape: tuple) -> None:
        """Raises LabelShapeError when the shapes cannot be paired. Default: equal shapes."""
        if tuple(y_true_shape) != tuple(y_pred_shape):
            raise LabelShapeError(
                f"{type(self).__name__} needs labels shaped like the predictions {tuple(y_pred_shape)}; "
                f"received labels of shape {tuple(y_true_shape)}."
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
