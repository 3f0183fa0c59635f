"""scikit-learn's digits (1,797 real 8x8 images that ship with the package) and a small CNN, for the
main job (`make run`) and the tests."""

from __future__ import annotations

import numpy as np


def load(classes=range(10)):
    from sklearn.datasets import load_digits

    d = load_digits()
    keep = np.isin(d.target, list(classes))
    x = (d.images[keep, :, :, None] / 16.0).astype("float32")
    return x, d.target[keep].astype("int64")


def split(x, y, test_fraction=0.3, seed=0):
    idx = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = idx[:n_test], idx[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def cnn(classes=5, seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 1), name="image"),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(64, activation="relu", name="features"),
        keras.layers.Dense(classes, name="logits"),
    ], name="digits")
