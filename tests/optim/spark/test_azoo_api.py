"""What users coming from Analytics Zoo's TFPark write, over a real local[2] Spark: evaluate and
predict on distributed datasets, a TFDataset's own batch size, MaxIteration-style stopping,
resuming into a rebuilt Keras model, and feature_shapes as a list."""

import re

import keras
import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def _df(spark, x, y, partitions=3):
    return spark.createDataFrame([(x[i].ravel().tolist(), int(y[i])) for i in range(len(x))],
                                 "pixels array<float>, label long").repartition(partitions)


@pytest.mark.spark
def test_evaluate_and_predict_over_spark_equal_the_collected_data(spark):
    x, y = digits.load()
    x, y = x[:301], y[:301]
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.Adam(0.01), metrics=["accuracy"])
    opt.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    local = opt.evaluate((x, y))
    df = _df(spark, x, y)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes=[(8, 8, 1)])
    spread = opt.evaluate(data)
    assert spread["accuracy"] == local["accuracy"] and spread["loss"] == pytest.approx(local["loss"], rel=1e-6)  # float32 batch means
    rdd = spark.sparkContext.parallelize([(x[i], int(y[i])) for i in range(len(x))], 3)
    assert opt.evaluate(TFDataset.from_rdd(rdd))["accuracy"] == local["accuracy"]
    # predict: the DataFrame with the outputs, aligned row by row; an RDD of outputs
    rows = opt.predict(data).collect()
    got = np.array([r["output"] for r in rows])
    want = opt.net.forward(np.array([r["pixels"] for r in rows], np.float32).reshape(-1, 8, 8, 1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    outs = np.array(opt.predict(TFDataset.from_rdd(rdd)).collect())
    np.testing.assert_allclose(outs, opt.net.forward(x), rtol=1e-5, atol=1e-5)


@pytest.mark.spark
@pytest.mark.parallel
def test_a_tfdatasets_batch_size_is_used(spark):
    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05))
    opt.optimize(TFDataset.from_ndarrays((x[:64], y[:64]), batch_size=4), verbose=0)
    assert opt.global_step == 16, "64 rows in batches of 4"
    with pytest.raises(ValueError, match=r"made with batch_size=4, and batch_size=8 was given too"):
        opt.optimize(TFDataset.from_ndarrays((x[:64], y[:64]), batch_size=4), batch_size=8, verbose=0)
    df = _df(spark, x[:128], y[:128], 2)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)}, batch_size=16)
    opt.optimize(data, num_workers=2, verbose=0)
    assert opt.last_run["steps_per_epoch"] == 8, "16 a step over 2 ranks: 8 rows a rank, 64 rows a rank"


@pytest.mark.spark
def test_feature_shapes_as_a_list_and_bad_forms(spark):
    x, y = digits.load()
    df = _df(spark, x[:8], y[:8], 1)
    assert TFDataset.from_dataframe(df, ["pixels"], "label", feature_shapes=[(8, 8, 1)]).features[0].shape == (8, 8, 1)
    for bad in ([(8, 8, 1), (64,)], "8x8", [8, 8, 1]):
        with pytest.raises(TypeError, match=r"`feature_shapes` must be a dict \{column: per-row shape\} or a list"):
            TFDataset.from_dataframe(df, ["pixels"], "label", feature_shapes=bad)


def test_max_steps_stops_mid_epoch_and_a_resume_goes_on(tmp_path):
    x, y = digits.load()
    x, y = x[:256], y[:256]
    straight = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05, momentum=0.9))
    straight.optimize((x, y), epochs=2, batch_size=32, verbose=0)
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05, momentum=0.9),
                      model_dir=str(tmp_path))
    opt.optimize((x, y), batch_size=32, max_steps=11, verbose=0)
    assert opt.global_step == 11
    again = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=3)), SCE, optim.SGD(0.05, momentum=0.9),
                        model_dir=str(tmp_path))
    again.optimize((x, y), batch_size=32, max_steps=16, resume=True, verbose=0)
    assert again.last_run["start_step"] == 11 and again.global_step == 16
    for k, w in straight.net.get_weights().items():
        np.testing.assert_array_equal(again.net.get_weights()[k], w)
    with pytest.raises(ValueError, match=r"`max_steps` must be a positive integer or None. Received: max_steps=0"):
        opt.optimize((x, y), max_steps=0, verbose=0)


def test_resume_into_a_rebuilt_keras_model_matches_by_structure(tmp_path):
    """Keras names a model rebuilt in the same process sequential_5/... instead of sequential_4/...;
    the checkpoint still resumes (matched by order and shape, with a warning); another model does not."""
    x, y = digits.load()
    x, y = x[:128], y[:128]

    def build(width=16):
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(width, 3, activation="relu"),
                                  keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    first = TFOptimizer.from_keras(build(), model_dir=str(tmp_path))
    first.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    rebuilt = TFOptimizer.from_keras(build(), model_dir=str(tmp_path))
    assert rebuilt.net.weight_names != first.net.weight_names, "Keras gave the rebuilt model other names"
    with pytest.warns(optim.CheckpointWarning, match=r"matched by order and shape, as Keras's load_weights does"):
        rebuilt.optimize((x, y), epochs=1, batch_size=32, resume=True, verbose=0)
    for a, b in zip(rebuilt.net.get_weights().values(), first.net.get_weights().values()):
        np.testing.assert_array_equal(a, b)  # epochs=1 already done: the weights are the checkpoint's
    other = TFOptimizer.from_keras(build(width=8), model_dir=str(tmp_path))
    with pytest.raises(optim.CheckpointError, match=re.escape("and its structure differs too")):
        other.optimize((x, y), epochs=2, batch_size=32, resume=True, verbose=0)


@pytest.mark.spark
@pytest.mark.parallel
def test_spark_ml_vector_columns_train_evaluate_and_predict(spark):
    """What a Spark ML feature pipeline produces (VectorAssembler: dense and sparse vectors) trains,
    evaluates and predicts like an array column; the user's vector column stays a vector."""
    from pyspark.ml.feature import VectorAssembler

    x, y = digits.load()
    x, y = x[:256], y[:256]
    wide = spark.createDataFrame([tuple(float(v) for v in x[i].ravel()) + (int(y[i]),) for i in range(len(x))],
                                 [f"p{i}" for i in range(64)] + ["label"])
    df = VectorAssembler(inputCols=[f"p{i}" for i in range(64)], outputCol="features").transform(wide)
    df = df.select("features", "label").repartition(2)  # a mix of dense and sparse vectors (zeros are common)
    kinds = {type(r["features"]).__name__ for r in df.collect()}
    assert "SparseVector" in kinds, kinds
    data = TFDataset.from_dataframe(df, "features", "label", feature_shapes=[(8, 8, 1)])
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.Adam(0.01), metrics=["accuracy"])
    opt.optimize(data, epochs=2, batch_size=32, num_workers=2, verbose=0)
    assert opt.evaluate(data)["accuracy"] == opt.evaluate((x, y))["accuracy"]
    rows = opt.predict(data).collect()
    assert type(df.schema["features"].dataType).__name__ == "VectorUDT" and rows[0].__fields__ == ["features", "label",
                                                                                                    "output"]
    feats = np.array([r["features"].toArray() for r in rows], np.float32).reshape(-1, 8, 8, 1)
    np.testing.assert_allclose(np.array([r["output"] for r in rows]), opt.net.forward(feats), rtol=1e-5, atol=1e-5)


@pytest.mark.spark
def test_features_as_a_dict_by_input_name(spark):
    x, y = digits.load()
    x, y = x[:128], y[:128]
    by_list = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05))
    by_list.optimize((x, y), epochs=1, batch_size=32, verbose=0)
    by_dict = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05))
    name = by_dict.net.input_names[0].split(":")[0]
    by_dict.optimize(({name: x}, y), epochs=1, batch_size=32, verbose=0)
    for k, w in by_list.net.get_weights().items():
        np.testing.assert_array_equal(by_dict.net.get_weights()[k], w)
    np.testing.assert_array_equal(by_dict.predict({name: x[:5]}), by_dict.net.forward(x[:5]))
    with pytest.raises(optim.DataError, match=r"name input 'pixels', which the net does not have. Inputs: "):
        by_dict.optimize(({"pixels": x}, y), verbose=0)
    df = _df(spark, x, y, 2)
    data = TFDataset.from_dataframe(df, {name: "pixels"}, "label", feature_shapes={"pixels": (8, 8, 1)})
    assert by_dict.evaluate(data)["loss"] == pytest.approx(by_dict.evaluate((x, y))["loss"], rel=1e-6)


@pytest.mark.spark
@pytest.mark.parallel
def test_validation_runs_on_the_ranks_for_dataframes_and_tf_data(spark):
    """A validation DataFrame travels in the training stage (each rank validates its own rows; none
    is collected to the driver) and equals a local evaluation with the final weights; a tf.data
    validation input is built on each rank from its function."""
    import tensorflow as tf

    x, y = digits.load()
    xt, yt, xv, yv = x[:256], y[:256], x[1000:1301], y[1000:1301]
    train = TFDataset.from_dataframe(_df(spark, xt, yt, 2), "pixels", "label", feature_shapes=[(8, 8, 1)])
    val_df = spark.createDataFrame([(xv[i].ravel().tolist(), int(yv[i])) for i in range(len(xv))],
                                   "image_pixels array<float>, digit long")
    val = TFDataset.from_dataframe(val_df, "image_pixels", "digit", feature_shapes=[(8, 8, 1)])
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.Adam(0.01), metrics=["accuracy"])
    history = opt.optimize(train, epochs=2, batch_size=32, validation_data=val, num_workers=2, verbose=0)
    local = opt.evaluate((xv, yv))
    assert history["val_accuracy"][-1] == local["accuracy"]
    assert history["val_loss"][-1] == pytest.approx(local["loss"], rel=1e-6)
    assert sum(opt.last_run["rows"]) == 256, "the validation rows are not counted as training rows"

    def val_fn(rank, size, xv=xv, yv=yv):
        return tf.data.Dataset.from_tensor_slices((xv[rank::size], yv[rank::size])).batch(16)

    history = opt.optimize((xt, yt), epochs=1, batch_size=32, validation_data=TFDataset.from_tf_data(val_fn),
                           num_workers=2, verbose=0)
    assert history["val_accuracy"][-1] == opt.evaluate((xv, yv))["accuracy"]


@pytest.mark.spark
@pytest.mark.parallel
def test_keras_model_trains_a_dataframe_over_spark_with_kerass_calls(spark):
    """TFPark's ``KerasModel`` as Keras 3 code writes it: ``fit`` on a Spark DataFrame with its columns named (as BigDL
    Orca's ``Estimator.fit`` takes them, each shaped as the model's input) over two ranks writes the trained weights
    into the Keras model itself; ``evaluate`` of a ``TFDataset`` over Spark gives Keras's ``[loss, accuracy]``, equal
    to the collected data's; ``predict`` gives the DataFrame with the outputs."""
    x, y = digits.load()
    x, y = x[:128], y[:128]
    model = digits.cnn(classes=10, seed=0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    start = [v.numpy() for v in model.weights]
    df = _df(spark, x, y, 2)
    kmodel = optim.KerasModel(model)
    with pytest.raises(ValueError, match="needs feature_cols and label_cols"):
        kmodel.fit(df, epochs=1)
    history = kmodel.fit(df, batch_size=32, epochs=1, num_workers=2, verbose=0, feature_cols=["pixels"],
                         label_cols=["label"])
    assert history.epoch == [0] and kmodel.optimizer.last_run["steps_per_epoch"] == 4  # 128 rows, 32 a step
    trained = kmodel.optimizer.net.get_weights()
    assert all(np.array_equal(v.numpy(), trained[v.path]) for v in model.weights)
    assert any(not np.array_equal(a, v.numpy()) for a, v in zip(start, model.weights))
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes=[(8, 8, 1)])
    loss, accuracy = kmodel.evaluate(data, num_workers=2)
    local = kmodel.evaluate(x, y)
    assert accuracy == local[1] and loss == pytest.approx(local[0], rel=1e-6)
    rows = kmodel.predict(df, feature_cols="pixels").collect()
    np.testing.assert_allclose(np.array([r["output"] for r in rows]),
                               model.predict(np.array([r["pixels"] for r in rows], np.float32).reshape(-1, 8, 8, 1),
                                             verbose=0), rtol=1e-5, atol=1e-5)
