"""Bad training data caught before the first step, with typed errors that name the row: string or
out-of-range class labels, NaN features (which oneDNN can hide from the loss), on the driver for
numpy data and on the ranks for a DataFrame."""

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def opt_(**kw):
    return TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05), **kw)


def test_labels_are_checked_against_the_loss():
    x, y = digits.load()
    x, y = x[:64], y[:64]
    opt = opt_()
    before = opt.net.get_weights()
    with pytest.raises(optim.DataError, match=r"are strings \(e.g. '0'\); SparseCategoricalCrossentropy needs integer "
                                              r"class ids .* np.unique\(labels, return_inverse=True\)"):
        opt.optimize((x, y.astype(str)), batch_size=32, verbose=0)
    bad = y.copy()
    bad[37] = 12
    with pytest.raises(optim.DataError, match=r"row 37 holds class 12, outside 0..9 \(the output has 10 classes\)"):
        opt.optimize((x, bad), batch_size=32, verbose=0)
    with pytest.raises(optim.DataError, match=r"row 3 holds 0.5, not a class id"):
        opt.optimize((x, np.where(np.arange(64) == 3, 0.5, y)), batch_size=32, verbose=0)
    assert all(np.array_equal(before[k], v) for k, v in opt.net.get_weights().items()), "nothing trained"


def test_nan_features_raise_or_are_left_out():
    x, y = digits.load()
    x, y = x[:64].copy(), y[:64]
    x[41, 2, 3, 0] = np.nan
    opt = opt_()
    with pytest.raises(optim.NonFiniteInputError, match=r"the training data: row 41 has NaN or Inf in input 0 "
                                                         r"\(1 row\(s\) in all\).*on_nonfinite='skip'"):
        opt.optimize((x, y), batch_size=32, verbose=0)
    opt.optimize((x, y), batch_size=21, shuffle=False, on_nonfinite="skip", verbose=0)
    assert opt.global_step == 3, "63 rows left, in batches of 21"
    assert all(np.isfinite(v).all() for v in opt.net.get_weights().values())


@pytest.mark.spark
@pytest.mark.parallel
def test_a_partition_is_checked_on_its_rank(spark):
    x, y = digits.load()
    rows = [(x[i].ravel().tolist(), int(y[i]) if i != 5 else 11) for i in range(64)]
    df = spark.createDataFrame(rows, "pixels array<float>, label long").repartition(2)
    data = optim.TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    with pytest.raises(optim.DataError, match=r"the labels of partition \d for output .*: row \d+ holds class 11, "
                                              r"outside 0..9"):
        opt_().optimize(data, batch_size=16, num_workers=2, verbose=0)


def test_a_probability_loss_on_logits_warns_once_and_names_the_fix():
    import warnings

    import keras

    logits = TFNet.from_keras(digits.cnn(classes=10, seed=0))  # a linear head: logits
    with pytest.warns(UserWarning, match=r"'sparse_categorical_crossentropy' expects probabilities .* comes from a "
                                         r"\w+ op, not a softmax or sigmoid.*SparseCategoricalCrossentropy\(from_logits=True\)"):
        TFOptimizer(logits, "sparse_categorical_crossentropy", optim.SGD(0.1))
    keras.utils.set_random_seed(0)
    probs = TFNet.from_keras(keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                               keras.layers.Dense(10, activation="softmax")]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TFOptimizer(probs, "sparse_categorical_crossentropy", optim.SGD(0.1))  # softmax output: no warning
        TFOptimizer(logits, SCE, optim.SGD(0.1))  # from_logits given: no warning


@pytest.mark.spark
def test_a_missing_feature_shape_is_caught_on_the_driver(spark):
    import time

    from tfnet.errors import InputSpecError

    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i]), b"\x89PNG") for i in range(16)],
                               "pixels array<float>, label long, png binary")
    opt = opt_()
    t0 = time.monotonic()
    with pytest.raises(InputSpecError, match=r"Column 'pixels' holds flat arrays, and input 'image:0' takes rows of "
                                             r"shape \(8, 8, 1\): pass feature_shapes=\{'pixels': \(8, 8, 1\)\}"):
        opt.optimize(optim.TFDataset.from_dataframe(df, "pixels", "label"), batch_size=16, num_workers=2, verbose=0)
    with pytest.raises(InputSpecError, match=r"Column 'png' holds encoded images"):
        opt.evaluate(optim.TFDataset.from_dataframe(df, "png", "label"))
    assert time.monotonic() - t0 < 5, "no Spark job ran"
