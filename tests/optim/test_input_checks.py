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
    with pytest.raises(optim.DataError, match=r"label column 'labels' holds string values, and SparseCategoricalCrossentropy "
                                              r".* np.unique\(labels, return_inverse=True\)"):
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
    from tests.spark_utils import jobs_since, spark_jobs
    from tfnet.errors import InputSpecError

    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i]), b"\x89PNG") for i in range(16)],
                               "pixels array<float>, label long, png binary")
    opt = opt_()
    before = spark_jobs(spark)
    with pytest.raises(InputSpecError, match=r"Column 'pixels' holds flat arrays, and input 'image:0' takes rows of "
                                             r"shape \(8, 8, 1\): pass feature_shapes=\{'pixels': \(8, 8, 1\)\}"):
        opt.optimize(optim.TFDataset.from_dataframe(df, "pixels", "label"), batch_size=16, num_workers=2, verbose=0)
    with pytest.raises(InputSpecError, match=r"Column 'png' holds encoded images"):
        opt.evaluate(optim.TFDataset.from_dataframe(df, "png", "label"))
    assert jobs_since(spark, before) == [], "no Spark job ran"


# ---- tf.data input: checked batch by batch as it is read, locally and on each rank

def _nan_batches(x, y, batch=16, bad=(5, 20)):
    """``(x, y)`` batched, with NaN in the rows ``bad`` (rows 5 and 20: batch 1 row 5, batch 2 row 4)."""
    import tensorflow as tf

    x = x.copy()
    for i in bad:
        x[i, 1, 2, 0] = np.nan
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def test_tf_data_nan_features_raise_naming_the_batch_and_row():
    x, y = digits.load()
    opt = opt_()
    before = opt.net.get_weights()
    data = optim.TFDataset.from_tf_data(_nan_batches(x[:64], y[:64]))
    with pytest.raises(optim.NonFiniteInputError, match=r"the training data: batch 1 of epoch 1: row 5 of the batch "
                                                         r"has NaN or Inf in input 0 \(1 of its 16 row\(s\)\).*"
                                                         r"on_nonfinite='skip'"):
        opt.optimize(data, verbose=0)
    assert all(np.array_equal(before[k], v) for k, v in opt.net.get_weights().items()), "no step was taken"
    inf = x[:64].copy()
    inf[40, 0, 0, 0] = -np.inf
    import tensorflow as tf

    with pytest.raises(optim.NonFiniteInputError, match=r"batch 3 of epoch 1: row 8 of the batch"):
        opt.optimize(tf.data.Dataset.from_tensor_slices((inf, y[:64])).batch(16), verbose=0)  # a plain tf.data too
    with pytest.raises(optim.NonFiniteInputError, match=r"the validation data: batch 1: row 5 of the batch"):
        opt.optimize((x[:32], y[:32]), batch_size=16, validation_data=_nan_batches(x[:64], y[:64]), verbose=0)


def test_tf_data_skip_trains_as_the_data_without_those_rows():
    """on_nonfinite='skip' drops the bad rows from their batch: the same weights, bit for bit, as
    training on the same batches without those rows."""
    import tensorflow as tf

    x, y = digits.load()
    x, y = x[:64], y[:64]
    skipped = opt_()
    skipped.optimize(optim.TFDataset.from_tf_data(_nan_batches(x, y)), epochs=2, on_nonfinite="skip", verbose=0)
    keep = np.setdiff1d(np.arange(64), [5, 20])
    batches = [keep[(keep >= s) & (keep < s + 16)] for s in range(0, 64, 16)]  # 15, 15, 16, 16 rows
    clean = tf.data.Dataset.from_generator(lambda: ((x[b], y[b]) for b in batches), output_signature=(
        tf.TensorSpec((None, 8, 8, 1), tf.float32), tf.TensorSpec((None,), y.dtype)))
    reference = opt_()
    reference.optimize(optim.TFDataset.from_tf_data(clean), epochs=2, verbose=0)
    assert skipped.global_step == reference.global_step == 8
    for name, w in reference.net.get_weights().items():
        np.testing.assert_array_equal(skipped.net.get_weights()[name], w, err_msg=name)
    assert not np.array_equal(reference.net.get_weights()[name], opt_().net.get_weights()[name]), "it trained"


def test_a_tf_data_batch_with_no_finite_row_is_replaced_by_the_next():
    """Equal steps on every rank: with a fixed step count, a batch left with no rows is replaced by
    the next batch of the rank's repeated input, never dropped from the count."""
    import tensorflow as tf

    x, y = digits.load()
    x = x[:48].copy()
    x[16:32] = np.inf  # batch 2: every row
    data = optim.TFDataset.from_tf_data(tf.data.Dataset.from_tensor_slices((x, y[:48])).batch(16))
    checked = data.checked(None, None, "skip", "the training data")
    got = [labels.numpy() for _, labels in checked.batches(16, steps=4)]
    assert [list(g) for g in got] == [list(y[b:b + 16]) for b in (0, 32, 0, 32)]
    assert len(list(checked.batches(16))) == 2, "without a step count, one pass less the empty batch"
    assert data.on_nonfinite is None, "the user's dataset is left as it was"
    with pytest.raises(optim.NonFiniteInputError, match=r"1000 batches in a row have NaN or Inf in every row"):
        bad = optim.TFDataset.from_tf_data(tf.data.Dataset.from_tensor_slices((x[16:32], y[:16])).batch(8))
        list(bad.checked(None, None, "skip", "the training data").batches(8, steps=2))


@pytest.mark.spark
@pytest.mark.parallel
def test_tf_data_is_checked_on_each_rank(spark):
    """Two ranks of from_tf_data, 4 batches of 8 each; rank 1's second batch is NaN in every row.
    With 'skip' both ranks still take the 4 steps they agreed on (rank 1 reads one batch more from
    its repeated input: no allreduce waits for a step that never comes); with 'raise' the rank's
    typed error names the batch, the row and the rank."""
    import tensorflow as tf

    x, y = digits.load()
    x = x[:64].copy()
    x[1::2][8:16] = np.nan  # rank 1's rows 8..15: its batch 2

    def per_rank(rank, size, x=x, y=y[:64]):
        return tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).batch(8)

    opt = opt_()
    opt.optimize(optim.TFDataset.from_tf_data(per_rank), epochs=1, num_workers=2, on_nonfinite="skip", verbose=0)
    assert opt.global_step == 4 and all(np.isfinite(v).all() for v in opt.net.get_weights().values())
    with pytest.raises(optim.NonFiniteInputError, match=r"the training data: batch 2 of epoch 1 on rank 1: row 0 of "
                                                         r"the batch has NaN or Inf in input 0 \(8 of its 8 row"):
        opt_().optimize(optim.TFDataset.from_tf_data(per_rank), num_workers=2, verbose=0)
