"""Weight regularizers, as Keras's ``fit`` adds them to the loss.

A Keras layer built with ``kernel_regularizer``, ``bias_regularizer``, ``gamma_regularizer``... gives its variable a
``regularizer``; Keras's ``fit`` and ``evaluate`` add ``regularizer(variable)`` of every *trainable* variable to the
compiled loss (``Trainer.compute_loss``: ``model.losses``, each summed and cast to float). A frozen graph has no
variables to carry them, so a net keeps them beside its weights: ``{weight name: Keras's serialized regularizer}``
(JSON, so they travel in the net's container and export folder as the rest of its metadata does), rebuilt with
``keras.regularizers.deserialize`` where a step runs. The training step adds :func:`penalty` of the trainable
weights to the loss it differentiates, and evaluation adds it to each batch's loss, as Keras does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tensorflow as tf

from tfnet.errors import RegularizerError

__all__ = ["from_variables", "penalty", "plain", "rebuild", "serialized"]


def serialized(weight: str, regularizer: Any) -> dict:
    """Keras's serialized form of ``regularizer`` (a ``keras.regularizers.Regularizer``, a name such as ``"l2"``
    or a config dict: what ``keras.regularizers.get`` takes), checked to rebuild.

    Raises:
        RegularizerError: Keras cannot take it, or cannot rebuild it from its config.
    """
    import keras

    try:
        config = keras.regularizers.serialize(keras.regularizers.get(regularizer))
    except (TypeError, ValueError) as exc:
        raise RegularizerError(f"The regularizer of weight {weight!r} is not one Keras takes ({exc}). "
                               f"Received: {regularizer!r}") from None
    rebuild(weight, config)
    return config


def rebuild(weight: str, config: Mapping) -> Callable:
    """The regularizer from its serialized form.

    Raises:
        RegularizerError: Keras cannot rebuild it (its class or function is not registered where this runs).
    """
    import keras

    try:
        fn = keras.regularizers.deserialize(plain(config))
    except (TypeError, ValueError) as exc:
        fn = exc
    if not callable(fn):  # Keras gives a plain function's name back as a string
        raise RegularizerError(
            f"Keras cannot rebuild the regularizer of weight {weight!r} from {plain(config)!r}: a regularizer must "
            "be a keras.regularizers class, or a class or function decorated with "
            "@keras.saving.register_keras_serializable() and imported where the net trains (as for saving the "
            "Keras model). Or leave it out: net.regularizers = {...} without it.") from None
    return fn


def plain(config: Any) -> Any:
    """``config`` as plain dicts and lists (a ``tf.Module`` attribute holds them wrapped for tracking), for JSON."""
    if isinstance(config, Mapping):
        return {str(k): plain(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [plain(v) for v in config]
    return config


def from_variables(names: Mapping[str, Any]) -> dict[str, dict]:
    """``{weight name: serialized regularizer}`` for the Keras variables (``{weight name: variable}``) that have one,
    whether trainable or not (a weight a user unfreezes later is regularized then, as in Keras). A regularizer Keras
    cannot serialize is kept as its config all the same: :func:`rebuild` says so where a step would use it."""
    found = {name: var.regularizer for name, var in names.items() if getattr(var, "regularizer", None) is not None}
    if not found:
        return {}
    import keras

    return {name: keras.regularizers.serialize(reg) for name, reg in found.items()}


def penalty(fns: Mapping[str, Callable], values: Mapping[str, tf.Tensor], names: Iterable[str]) -> tf.Tensor | None:
    """The sum of ``fns[n](values[n])`` over ``names`` that have a regularizer, in float32 (each term summed and cast
    as Keras's ``_aggregate_additional_loss`` does); None where none has one."""
    terms = []
    for n in names:
        if n in fns:
            term = tf.convert_to_tensor(fns[n](values[n]))
            terms.append(tf.cast(tf.reduce_sum(term), tf.float32))
    return tf.add_n(terms) if terms else None
