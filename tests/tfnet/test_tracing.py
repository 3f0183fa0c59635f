"""``net.forward`` over batch sizes, on several nets, as a user calls it: each net compiles its function
once (the batch dimension is ``None`` in its signature), and TensorFlow's "N out of the last M calls
... triggered tf.function retracing" warning never comes (TensorFlow counted every net's one trace
against one shared Python function before)."""

import logging

import keras
import numpy as np
import tensorflow as tf

from tests import digits
from tfnet import TFNet


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_forward_over_batch_sizes_and_nets_never_warns_of_retracing():
    caught = Warnings()
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(caught)
    try:
        x, _ = digits.load()
        net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        for n in (1, 2, 3, 5, 7, 11, 13, 32):
            assert net.forward(x[:n]).shape == (n, 10)
        for i in range(6):  # transfer learning as the README does it: a new head on the features, six times
            keras.utils.set_random_seed(i)
            head = net.cut("features").add_head([keras.layers.Dense(3)], name=f"head{i}")
            for n in (4, 9):
                assert head.forward(x[:n]).shape == (n, 3)
            head.trainable = f"head{i}/"
            step = head.train_step(lambda y_true, out: tf.reduce_mean(tf.square(out - y_true[:, None])), 0.01)
            assert np.isfinite(float(step(x[:8], np.zeros(8, np.float32), step.init_state()).loss))
    finally:
        tf_logger.removeHandler(caught)
    assert not [m for m in caught.messages if "retracing" in m], caught.messages
