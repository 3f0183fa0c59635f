"""Multi-output and sample-weighted training over Spark from a DataFrame: several label columns
(one per output) and a column of sample weights named with ``weight_col``, on two ranks of a real
local[2] Spark, equal to the local run on the same rows; the weights also reach distributed
validation and evaluation."""

import keras
import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from optim.data.dataframe import SPLIT_COLUMN, WEIGHT_COLUMN, with_validation
from optim.errors import BadRowError, ColumnError
from tests import digits
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def two_output_net(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Dense(16, activation="tanh", name="hidden")(keras.layers.Flatten()(inp))
    return TFNet.from_keras(keras.Model(inp, [keras.layers.Dense(10, name="digit")(h),
                                              keras.layers.Dense(2, name="parity")(h)]))


def data(n=256, offset=0):
    x, y = digits.load()
    x, y = x[offset:offset + n], y[offset:offset + n]
    w = np.random.default_rng(offset).uniform(0.0, 3.0, n).astype(np.float32)
    w[:20] = 0.0  # some examples count for nothing
    return x, y, w


def frame(spark, x, y, w, ranks=2):
    """A DataFrame of ``ranks`` partitions, partition r holding rows r, r + ranks, ... in order: the
    rows each rank of a run takes from numpy data, so each step's global batch is the local run's."""
    rows = [(x[i].ravel().tolist(), int(y[i]), int(y[i] % 2), float(w[i]))
            for r in range(ranks) for i in range(r, len(x), ranks)]
    rdd = spark.sparkContext.parallelize(rows, ranks)  # contiguous slices: partition r is shard r
    return spark.createDataFrame(rdd, "pixels array<float>, digit long, parity long, w double")


def _opt(net):
    return TFOptimizer(net, SCE, optim.SGD(0.1), metrics=["accuracy"], loss_weights=[1.0, 0.5],
                       weighted_metrics=[optim.metrics.Accuracy(name="w_accuracy")])


def _max_diff(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a.get_weights().values(), b.get_weights().values()))


def test_weighted_two_output_training_from_a_dataframe_equals_the_local_run(spark):
    x, y, w = data()
    local = two_output_net()
    h_local = _opt(local).optimize((x, [y, y % 2], w), epochs=2, batch_size=32, shuffle=False, verbose=0)
    df = frame(spark, x, y, w)
    assert [len(p) for p in df.rdd.glom().collect()] == [128, 128]
    ranks = two_output_net()
    opt = _opt(ranks)
    dataset = TFDataset.from_dataframe(df, "pixels", ["digit", "parity"], feature_shapes={"pixels": (8, 8, 1)},
                                       weight_col="w")
    h_ranks = opt.optimize(dataset, epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    assert opt.global_step == 16
    assert _max_diff(local, ranks) < 1e-5
    for key in ("loss", "accuracy", "w_accuracy"):
        np.testing.assert_allclose(h_ranks[key], h_local[key], rtol=1e-5, err_msg=key)
    # the weights and the second output matter: other runs land elsewhere
    unweighted = two_output_net()
    _opt(unweighted).optimize((x, [y, y % 2]), epochs=2, batch_size=32, shuffle=False, verbose=0)
    assert _max_diff(unweighted, ranks) > 1e-3
    # distributed evaluation reads the weight column too: the same sums as here
    here = opt.evaluate((x, [y, y % 2], w))
    there = opt.evaluate(dataset)
    assert there["loss"] == pytest.approx(here["loss"], rel=1e-5)
    assert there["w_accuracy"] == pytest.approx(here["w_accuracy"], rel=1e-6)
    assert here["w_accuracy"] != pytest.approx(here["accuracy"], rel=1e-3)


def test_weighted_validation_dataframe_on_the_ranks(spark):
    """Validation rows travel in the training stage (unioned, round robin): each side keeps its own
    weight column, and the last epoch's val_loss is the local weighted evaluation with the final
    weights."""
    x, y, w = data()
    xv, yv, wv = data(96, offset=1000)
    opt = _opt(two_output_net())
    train = TFDataset.from_dataframe(frame(spark, x, y, w), "pixels", ["digit", "parity"],
                                     feature_shapes={"pixels": (8, 8, 1)}, weight_col="w")
    val = TFDataset.from_dataframe(frame(spark, xv, yv, wv).withColumnRenamed("w", "val_w"), "pixels",
                                   ["digit", "parity"], feature_shapes={"pixels": (8, 8, 1)}, weight_col="val_w")
    history = opt.optimize(train, epochs=1, batch_size=32, num_workers=2, verbose=0, validation_data=val)
    want = opt.evaluate((xv, [yv, yv % 2], wv))
    assert history["val_loss"][-1] == pytest.approx(want["loss"], rel=1e-5)
    assert history["val_w_accuracy"][-1] == pytest.approx(want["w_accuracy"], rel=1e-6)
    assert want["loss"] != pytest.approx(opt.evaluate((xv, [yv, yv % 2]))["loss"], rel=1e-3)


def test_the_weight_column_of_either_side_in_the_union(spark):
    """Only the validation data weighted: the union fills the training side with 1.0 under a
    column of tfnet's own, which the training reader leaves alone."""
    x, y, w = data(8)
    df = frame(spark, x, y, w)
    val = TFDataset.from_dataframe(df, "pixels", ["digit", "parity"], feature_shapes={"pixels": (8, 8, 1)},
                                   weight_col="w")
    streamed = TFDataset.from_dataframe(df, "pixels", ["digit", "parity"], feature_shapes={"pixels": (8, 8, 1)})
    _, reader = with_validation(streamed, val, 2)
    assert reader.reader.weight is None and reader.val_weight.columns == (WEIGHT_COLUMN,)
    train = TFDataset.from_dataframe(df, "pixels", ["digit", "parity"], feature_shapes={"pixels": (8, 8, 1)},
                                     streaming=False)
    union, reader = with_validation(train, val, 2)
    assert union.columns == ["pixels", "digit", "parity", WEIGHT_COLUMN, SPLIT_COLUMN]
    assert reader.reader.weight is None and reader.val_reader.weight.columns == (WEIGHT_COLUMN,)
    table = union.toArrow()
    shard, val_shard = reader(table.to_batches(), 0, presharded=True)
    assert shard.weights is None and len(shard) == len(val_shard) == 8
    np.testing.assert_array_equal(np.sort(val_shard.weights), np.sort(w))


def test_bad_weight_columns(spark):
    x, y, w = data(8)
    df = frame(spark, x, y, w)
    with pytest.raises(ColumnError, match=r"Column 'weight' is not among the data's columns \['pixels', 'digit', "
                                          r"'parity', 'w'\]"):
        TFDataset.from_dataframe(df, "pixels", "digit", weight_col="weight")
    with pytest.raises(ColumnError, match=r"The weight column 'digit' is also a feature or label column"):
        TFDataset.from_dataframe(df, "pixels", "digit", weight_col="digit")
    with pytest.raises(TypeError, match=r"`weight_col` must be the name of one column of numbers. Received: "
                                        r"weight_col=\['w'\]"):
        TFDataset.from_dataframe(df, "pixels", "digit", weight_col=["w"])
    with pytest.raises(ValueError, match=r"`weight_col` weights the loss of each row; it needs `label_cols`"):
        TFDataset.from_dataframe(df, "pixels", weight_col="w")
    negative = df.withColumn("w", df.w - 10.0)
    in_memory = TFDataset.from_dataframe(negative, "pixels", "digit", weight_col="w", streaming=False).shard_reader()
    with pytest.raises(BadRowError, match=r"Weight column 'w' row 0 of partition 3 holds -10\.0; a sample weight must "
                                          r"be a finite, non-negative number \(\d+ such row"):
        in_memory(negative.toArrow().to_batches(), 3)
    streamed = TFDataset.from_dataframe(negative, "pixels", "digit", weight_col="w").shard_reader()
    with pytest.raises(BadRowError, match=r"Weight column 'w' row 0 of partition 3 holds -10\.0; a sample weight must "
                                          r"be a finite, non-negative number \(\d+ such row"):
        list(streamed(negative.toArrow().to_batches(), 3).batches(4))
    with pytest.raises(TypeError, match=r"for a DataFrame, name its column: TFDataset.from_dataframe\(\.\.\., "
                                        r"weight_col=\.\.\.\)"):
        _opt(two_output_net()).optimize(TFDataset.from_dataframe(df, "pixels", ["digit", "parity"]), sample_weight=w)
