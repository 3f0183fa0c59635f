"""Keras's transfer-learning flow, as Keras's guide writes it: a base model with batch norm frozen with
``base.trainable = False`` and called with ``training=False``, a new head trained by ``fit``, then the base
unfrozen (``base.trainable = True``, its batch norm left frozen) and the whole model fine-tuned at a low rate. The oracle for tfnet's handling
of Keras's trainable flags, locally and over ranks."""

from __future__ import annotations

import numpy as np

from tests.models import _randomise_bn

LR_HEAD, LR_FINE = 0.1, 0.01


def transfer_model(seed: int = 0, regularized: bool = False):
    """``(model, base)``: the base frozen, the head new. ``regularized``: the base's convolution and the head carry
    weight regularizers (L2 kernels, an L1 bias), which Keras's ``fit`` adds to the loss for the trainable ones, and
    activity regularizers (L1 on the convolution's output, which its batch norm also reads; L2 on the head's), which it
    adds whatever trains."""
    import keras

    keras.utils.set_random_seed(seed)
    reg = {"kernel_regularizer": keras.regularizers.L2(0.05),
           "activity_regularizer": keras.regularizers.L1(0.01)} if regularized else {}
    head_reg = {"kernel_regularizer": keras.regularizers.L2(0.02), "bias_regularizer": keras.regularizers.L1(0.03),
                "activity_regularizer": keras.regularizers.L2(0.05)} if regularized else {}
    base = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv", **reg),
                             keras.layers.BatchNormalization(name="bn"), keras.layers.Activation("relu"),
                             keras.layers.GlobalAveragePooling2D()], name="base")
    _randomise_bn(base, seed)
    base.trainable = False
    inputs = keras.Input((8, 8, 3), name="img")
    outputs = keras.layers.Dense(3, name="head", **head_reg)(base(inputs, training=False))
    return keras.Model(inputs, outputs), base


def unfreeze_all_but_batch_norm(base) -> None:
    """Phase two of the guide: ``base.trainable = True``, its batch norm kept frozen (in inference mode)."""
    import keras

    base.trainable = True
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False


def data(n: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 3)).astype(np.float32)
    return x, (x[..., 0].mean((1, 2)) > 0).astype(np.int64) + (x[..., 1].mean((1, 2)) > 0.1).astype(np.int64)


def keras_fit(model, x, y, lr: float, batch_size: int) -> dict:
    """One epoch of Keras's own ``fit`` (plain SGD, no shuffling); the weights by path after it."""
    import keras

    model.compile(optimizer=keras.optimizers.SGD(lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return {v.path: v.numpy() for v in model.weights}


def max_diff(net, weights: dict) -> float:
    got = net.get_weights()
    assert set(got) == set(weights), sorted(set(got) ^ set(weights))
    return max(float(np.abs(got[k] - weights[k]).max()) for k in got)
