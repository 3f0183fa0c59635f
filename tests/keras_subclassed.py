"""A subclassed Keras model as Keras's guide "Making new layers and models via subclassing" writes one, for the
tests of ``TFNet.from_keras`` on such models, in one process and over Spark."""

import keras
import numpy as np

from tests.tfnet.keras_models import randomise_statistics


class SmallCNN(keras.Model):
    """The guide's kind of model: layers made in ``__init__``, wired in ``call``, batch norm and dropout following
    ``training``."""

    def __init__(self, classes=3, frozen_bn=False, dropout=0.5, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, name="conv")
        self.bn = keras.layers.BatchNormalization(name="bn")
        self.bn.trainable = not frozen_bn
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.drop = keras.layers.Dropout(dropout)
        self.head = keras.layers.Dense(classes, name="head")

    def call(self, x, training=None):
        x = keras.ops.relu(self.bn(self.conv(x), training=training))
        return self.head(self.drop(self.pool(x), training=training))


def subclassed_cnn(seed=0, **kwargs):
    """``(model, x)``: a :class:`SmallCNN` named "cnn" built by its first call on ``x`` (2 images of 8x8x3), its
    batch-norm statistics randomised."""
    keras.utils.set_random_seed(seed)
    model = SmallCNN(name="cnn", **kwargs)
    x = np.random.default_rng(seed).normal(size=(2, 8, 8, 3)).astype(np.float32)
    model(x)  # built by its first call, as the guide builds it
    randomise_statistics(model, seed)
    return model, x
