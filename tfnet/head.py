"""Freezing a Keras head built on a feature tensor, for ``TFNet.add_head``."""

from __future__ import annotations

import tensorflow as tf

from tfnet.errors import InputSpecError
from tfnet.freeze import freeze_keras


def freeze_head(head, feature_spec: tf.TensorSpec, train_batch_norm: bool = False):
    """Builds ``head`` (a Keras layer, a list of layers, or a model) on an input shaped like
    ``feature_spec`` and freezes it into a :class:`tfnet.freeze.Frozen` with one input (its trainable batch norms
    switched to training mode in training with ``train_batch_norm``, as :func:`tfnet.freeze.freeze_keras`)."""
    import keras

    shape = feature_spec.shape
    if shape.rank is None or any(d is None for d in shape.as_list()[1:]):
        raise InputSpecError(
            f"add_head needs a feature tensor with known dimensions after the batch; "
            f"{feature_spec.name!r} has shape {shape}."
        )
    layers = list(head) if isinstance(head, (list, tuple)) else [head]
    for layer in layers:
        if not callable(layer):
            raise TypeError(f"A head is built of Keras layers or models. Received: {layer!r}")
    features = keras.Input(shape=tuple(shape.as_list()[1:]), dtype=feature_spec.dtype.name, name="features")
    x = features
    for layer in layers:
        x = layer(x)
    model = keras.Model(features, x, name="head")
    return freeze_keras(model, train_batch_norm=train_batch_norm)
