"""``optimize(..., validation_split=f)`` on numpy arrays: the run equals one given the rows the hold-out picks as
``validation_data`` and trained on the others, bit for bit; the seed picks the rows; a ``tf.data`` input has none to
split (as in Keras)."""

import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from optim.data.holdout import HoldOut
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def opt_():
    return TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05), metrics=["accuracy"])


def test_a_split_equals_the_held_rows_given_as_validation_data():
    x, y = digits.load()
    x, y = x[:160], y[:160]
    held = HoldOut(0.2, seed=7).mask([x, y])
    assert not np.array_equal(held, HoldOut(0.2, seed=8).mask([x, y])), "the seed picks the rows"
    split, given = opt_(), opt_()
    h1 = split.optimize((x, y), epochs=2, batch_size=16, seed=7, validation_split=0.2, verbose=0)
    h2 = given.optimize((x[~held], y[~held]), epochs=2, batch_size=16, seed=7, validation_data=(x[held], y[held]),
                        verbose=0)
    assert h1 == h2
    for name, value in split.net.get_weights().items():
        np.testing.assert_array_equal(value, given.net.get_weights()[name])


def test_a_tf_data_input_has_no_rows_to_split():
    x, y = digits.load()
    data = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(16)
    with pytest.raises(ValueError, match=r"`validation_split` holds out rows of numpy arrays, a DataFrame, an RDD or "
                                         r"Parquet files; TFDataDataset has no rows to split: pass validation_data"):
        opt_().optimize(data, validation_split=0.2, verbose=0)
