"""Keras callbacks over two ranks of a real Spark local[2]: ``EarlyStopping`` decided on rank 0 stops both ranks
at the same epoch, and the run equals one planned for that many epochs, bit for bit; ``ReduceLROnPlateau``'s rate
reaches both ranks (both take the same steps); a callback that cannot be pickled is refused before the stage."""

import threading

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests import digits
from tests.spark_utils import BIT_FOR_BIT, own_python_workers
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def opt_(lr=0.05):
    return TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(lr))


def test_early_stopping_stops_every_rank_at_the_same_epoch(spark):
    x, y = digits.load()
    x, y = x[:128], y[:128]
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)  # stops after epoch 1
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e9)
    with own_python_workers(spark, BIT_FOR_BIT):
        early = opt_()
        history = early.optimize((x, y), epochs=5, batch_size=32, shuffle=False, num_workers=2, verbose=0,
                                 callbacks=[stop])
        planned = opt_()
        planned.optimize((x, y), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    assert len(history["loss"]) == 2 and early.global_step == planned.global_step == 2 * 4
    for name, value in early.net.get_weights().items():
        np.testing.assert_array_equal(value, planned.net.get_weights()[name])
    # ReduceLROnPlateau on rank 0: the rate halves after epoch 1, on both ranks alike (their weights stay equal,
    # else rank 0's result would not match a run halved by hand)
    reduced = opt_(0.1)
    reduced.optimize((x, y), epochs=3, batch_size=32, shuffle=False, num_workers=2, verbose=0, callbacks=[plateau])
    by_hand = opt_(0.1)
    by_hand.optimize((x, y), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    by_hand.method = optim.SGD(0.05)
    by_hand.optimize((x, y), epochs=1, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    for value, want in zip(reduced.net.get_weights().values(), by_hand.net.get_weights().values()):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"cannot be sent to the Spark workers \(a distributed run calls its callbacks "
                                        r"on rank 0\)"):
        opt_().optimize((x, y), batch_size=32, num_workers=2, verbose=0,
                        callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: lock.acquire())])
