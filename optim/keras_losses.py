"""A Keras loss in tfnet's training, called as Keras's ``compile`` calls it (:class:`KerasLoss`), and any name
``keras.losses.get`` takes (:func:`named`). :func:`optim.losses.from_keras` decides where tfnet's own loss computes the
same instead."""

from __future__ import annotations

import re

from optim.loss_base import Loss, SampleWeighted

__all__ = ["KerasLoss", "named"]


class KerasLoss(Loss):
    """A Keras loss, called as Keras's compiled loss calls it: ``loss(y_true, y_pred, sample_weight=w)``, with its own
    options and reduction (``label_smoothing``, ``ignore_class``, ``reduction="sum"``, a focal loss's ``gamma``, ...),
    so training and evaluation compute exactly Keras's loss. A Keras loss *function* (``keras.losses.kl_divergence``,
    ``"kld"``: per-example values) is wrapped as Keras's ``compile`` wraps it, in Keras's ``LossFunctionWrapper``
    (the mean over the batch, sample weights included). Label shapes are Keras's to check.

    Args:
        loss: A ``keras.losses.Loss``, or a function ``(y_true, y_pred) -> per-example losses`` from Keras.
    """

    def __init__(self, loss):
        import keras

        if not isinstance(loss, keras.losses.Loss):
            # the wrapper Keras's compile puts around a loss function (CompileLoss's get_loss); Keras exports no name
            # for it, and its exact reduction and rank alignment are the point
            from keras.src.losses.losses import LossFunctionWrapper

            name = re.sub(r"[^A-Za-z0-9_.]", "_", getattr(loss, "__name__", "") or "").strip("_")  # "<lambda>"
            loss = LossFunctionWrapper(loss, name=name or "loss")
        self.loss = loss
        self.name = loss.name

    def __call__(self, y_true, y_pred):
        weights = None
        if isinstance(y_true, SampleWeighted):
            y_true, weights = y_true.labels, y_true.weights
        return self.loss(y_true, y_pred, sample_weight=weights)

    def check_shapes(self, y_true_shape, y_pred_shape):
        return

    def __repr__(self):
        return f"KerasLoss({type(self.loss).__name__}, {self.loss.get_config()})"


def named(name: str) -> KerasLoss | None:
    """The Keras loss of that name (``keras.losses.get``: ``"kld"``, ``"poisson"``, ...), or None."""
    try:
        import keras

        found = keras.losses.get(name)
    except (ImportError, ValueError, TypeError):
        return None
    return KerasLoss(found) if callable(found) else None
