"""Keras 3 models for the fidelity corpus, built in code at small sizes (``weights=None``: no
downloads), with batch-norm statistics randomised so that a net that ignores or trains them is
caught."""

from __future__ import annotations

import numpy as np

# keras.applications family -> smallest input size it accepts here (square, RGB)
APPLICATIONS = {
    "MobileNet": 32,
    "MobileNetV2": 32,
    "MobileNetV3Small": 32,
    "ResNet50": 32,
    "ResNet50V2": 32,
    "VGG16": 32,
    "DenseNet121": 32,
    "EfficientNetB0": 32,
    "EfficientNetV2B0": 32,
    "InceptionV3": 75,
    "Xception": 71,
    "NASNetMobile": 32,
    "ConvNeXtTiny": 32,
}
# The list also names RegNetX002; Keras 3 (3.x with TF 2.21) has no RegNet application.


def randomise_statistics(model, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for v in model.non_trainable_variables:
        if v.path.endswith("moving_mean"):
            v.assign(rng.normal(0, 0.1, v.shape).astype(v.dtype))
        elif v.path.endswith("moving_variance"):
            v.assign(rng.uniform(0.5, 1.5, v.shape).astype(v.dtype))


def application(name: str, seed: int = 0, size: int | None = None):
    """The family at its small input size (or ``size``) with a 5-class linear head, and a batch of 2 inputs."""
    import keras

    keras.utils.set_random_seed(seed)
    size = size or APPLICATIONS[name]
    model = getattr(keras.applications, name)(
        weights=None, classes=5, input_shape=(size, size, 3), classifier_activation=None
    )
    randomise_statistics(model, seed)
    x = np.random.default_rng(seed).normal(size=(2, size, size, 3)).astype(np.float32)
    return model, x


def float64_twin(name: str, model, size: int | None = None):
    """The family ``name`` built again under Keras's float64 dtype policy with ``model``'s weights: the float64
    truth that a float32 net's rounding is measured against."""
    import keras

    size = size or APPLICATIONS[name]
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        twin = getattr(keras.applications, name)(
            weights=None, classes=5, input_shape=(size, size, 3), classifier_activation=None
        )
    finally:
        keras.config.set_dtype_policy(before)
    assert all(v.dtype == "float64" for v in twin.variables)
    twin.set_weights([w.astype(np.float64) for w in model.get_weights()])
    return twin


def sequence_model(name: str, seed: int = 0):
    """LSTM, GRU, Bidirectional(LSTM) or a Transformer encoder block, on (batch 2, 6 steps, 4)."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    inp = keras.Input((6, 4), name="seq")
    if name == "LSTM":
        out = layers.Dense(3)(layers.LSTM(5)(inp))
    elif name == "GRU":
        out = layers.Dense(3)(layers.GRU(5)(inp))
    elif name == "Bidirectional":
        out = layers.Dense(3)(layers.Bidirectional(layers.LSTM(5, return_sequences=True))(inp))
    elif name == "TransformerEncoder":
        h = layers.Dense(8)(inp)
        att = layers.MultiHeadAttention(num_heads=2, key_dim=4)(h, h)
        h = layers.LayerNormalization()(h + att)
        ff = layers.Dense(8)(layers.Dense(16, activation="gelu")(h))
        out = layers.Dense(3)(layers.LayerNormalization()(h + ff))
    else:
        raise ValueError(name)
    model = keras.Model(inp, out)
    x = np.random.default_rng(seed).normal(size=(2, 6, 4)).astype(np.float32)
    return model, x


SEQUENCE_MODELS = ("LSTM", "GRU", "Bidirectional", "TransformerEncoder")
