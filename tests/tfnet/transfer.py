"""The digits transfer-learning task, small and local: a CNN pretrained on digits 0-4, cut at its
features, a new head fine-tuned on digits 5-9 (as the main job does over Spark). Shared by the
precision tests (bf16 fine-tuning, INT8 inference)."""

from __future__ import annotations

import functools
import re

import numpy as np

import optim
from optim import TFOptimizer
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


@functools.lru_cache(maxsize=1)
def pretrained_graph():
    """The frozen graph of a CNN trained on digits 0-4 (serialized, so callers cannot change it)."""
    import keras

    x, y = digits.load(range(5))
    base = digits.cnn(classes=5)
    base.compile(optimizer=keras.optimizers.Adam(0.01),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pre = TFOptimizer.from_keras(base)
    pre.optimize((x, y), epochs=6, batch_size=32, verbose=0)
    return pre.net.frozen_graph_def().SerializeToString()


def data():
    """((x_train, y_train), (x_test, y_test)) of digits 5-9, labels 0-4."""
    (xtr, ytr), (xte, yte) = digits.split(*digits.load(range(5, 10)))
    return (xtr, ytr - 5), (xte, yte - 5)


def new_net() -> TFNet:
    import keras

    body = TFNet.from_frozen_graph(pretrained_graph(), "image", "logits").cut("features")
    keras.utils.set_random_seed(1)
    return body.add_head(keras.layers.Dense(5, name="digit"), name="head")


def fine_tune(epochs: int = 4, **optimize_kwargs) -> TFOptimizer:
    """A fresh net fine-tuned on digits 5-9 in this process; extra arguments go to ``optimize``."""
    (xtr, ytr), _ = data()
    opt = TFOptimizer(new_net(), SCE, {"head/": optim.Adam(0.01), re.compile("^(?!head/)"): optim.Adam(0.002)},
                      metrics=["accuracy"])
    opt.optimize((xtr, ytr), epochs=epochs, batch_size=32, verbose=0, **optimize_kwargs)
    return opt


def accuracy(logits, labels) -> float:
    return float(np.mean(np.asarray(logits).argmax(1) == labels))
