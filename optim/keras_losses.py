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

        #: What was given: a ``keras.losses.Loss``, or a function. Shipped as it is (a function by cloudpickle, with its
        #: globals; Keras's wrapper would pickle it as Keras serializes a lambda, without them), wrapped where it runs.
        self.source = loss
        self._wrapped = None
        if isinstance(loss, keras.losses.Loss):
            self.name = loss.name
        else:
            self.name = re.sub(r"[^A-Za-z0-9_.]", "_", getattr(loss, "__name__", "") or "").strip("_") or "loss"

    @property
    def loss(self):
        """The Keras loss called: the one given, or Keras's ``LossFunctionWrapper`` around the function given (the
        wrapper Keras's compile puts around a loss function; Keras exports no name for it, and its reduction and
        rank alignment are the point)."""
        if self._wrapped is None:
            import keras

            if isinstance(self.source, keras.losses.Loss):
                self._wrapped = self.source
            else:
                from keras.src.losses.losses import LossFunctionWrapper

                self._wrapped = LossFunctionWrapper(self.source, name=self.name)  # "<lambda>" is no scope name
        return self._wrapped

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_wrapped"] = None
        import keras

        if isinstance(self.source, keras.losses.Loss):
            # by value: a Keras loss pickles as Keras serializes it, which a class of the user's own (defined in a
            # notebook, not registered) does not survive on the ranks; its class goes by cloudpickle, by value too
            state["source"] = _ByValue(type(self.source), dict(self.source.__dict__))
        return state

    def __setstate__(self, state):
        source = state["source"]
        if isinstance(source, _ByValue):
            state["source"] = source.rebuild()
        self.__dict__.update(state)

    def __call__(self, y_true, y_pred):
        weights = None
        if isinstance(y_true, SampleWeighted):
            y_true, weights = y_true.labels, y_true.weights
        return self.loss(y_true, y_pred, sample_weight=weights)

    def check_shapes(self, y_true_shape, y_pred_shape):
        return

    def __repr__(self):
        return f"KerasLoss({self.name})"


def named(name: str) -> KerasLoss | None:
    """The Keras loss of that name (``keras.losses.get``: ``"kld"``, ``"poisson"``, ...), or None."""
    try:
        import keras

        found = keras.losses.get(name)
    except (ImportError, ValueError, TypeError):
        return None
    return KerasLoss(found) if callable(found) else None


class _ByValue:
    """An object as its class and attributes, rebuilt without its ``__init__`` (or Keras's ``__reduce__``)."""

    def __init__(self, cls, attributes: dict):
        self.cls, self.attributes = cls, attributes

    def rebuild(self):
        obj = self.cls.__new__(self.cls)
        obj.__dict__.update(self.attributes)
        return obj
