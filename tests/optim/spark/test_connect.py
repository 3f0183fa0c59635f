"""Training and inference from a Spark Connect client: a real Connect server (pyspark's own
SparkConnectServer, local[2], in a process of its own) and a client session to it, side by side
with the classic local[2] session of the suite. Nothing in tfnet may touch ``sparkContext`` here."""

import glob
import json
import os
import traceback
import warnings

import numpy as np
import pandas as pd
import pytest

import optim
from optim import TFDataset, TFOptimizer, TFPredictor
from optim.errors import DistributedTrainingError
from optim.predict.transformer import TFNetTransformer
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.connect_server import ConnectServer, close_session
from tests.spark_utils import kill_rank_after_checkpoints
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)
ROWS = 256


def cnn_net(seed=0):
    return TFNet.from_keras(digits.cnn(classes=10, seed=seed))


def train_numpy(net):
    x, y = digits.load()
    opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), metrics=["accuracy"])
    history = opt.optimize((x[:ROWS], y[:ROWS]), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    return opt, history


@pytest.fixture(scope="module")
def classic(spark):
    """The classic session's run, made before the Connect client exists (pyspark switches a whole
    process to Connect while a Connect session is open)."""
    net = cnn_net()
    opt, history = train_numpy(net)
    return {"weights": net.get_weights(), "history": history, "step": opt.global_step}


@pytest.fixture(scope="module")
def connect(classic):
    """``(client session, touches)``: every access to the client's ``sparkContext`` is recorded."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    server = ConnectServer(cores=2).start()
    session = server.session()
    touches: list[str] = []
    original = ConnectSession.__getattr__  # where a Connect session refuses sparkContext and the JVM handles

    def recorded(self, name):
        if name in ("sparkContext", "_jsc", "_jvm", "_jsparkSession", "_jconf"):
            touches.append(f"{name}:\n" + "".join(traceback.format_stack(limit=8)))
        return original(self, name)

    ConnectSession.__getattr__ = recorded
    try:
        yield session, touches
    finally:
        ConnectSession.__getattr__ = original
        close_session(session)
        server.stop()


def digits_df(session, x, y):
    frame = pd.DataFrame({"id": np.arange(len(x)), "image": list(x.reshape(len(x), -1).astype(np.float32)),
                          "label": y.astype(np.int64)})
    return session.createDataFrame(frame)


def test_numpy_training_from_connect_equals_classic(classic, connect):
    session, touches = connect
    from optim.spark.connect import is_connect

    assert is_connect(session)
    net = cnn_net()
    opt, history = train_numpy(net)
    assert opt.last_run["mode"] == "connect"
    assert opt.global_step == classic["step"] == 16
    np.testing.assert_allclose(history["loss"], classic["history"]["loss"], rtol=1e-5)
    for name, w in classic["weights"].items():
        np.testing.assert_allclose(net.get_weights()[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
    assert not touches, touches[0]


def test_dataframe_fine_tuning_with_model_dir_and_evaluation(connect, tmp_path, capsys, monkeypatch):
    """Also MLflow tracking from a Connect client (optim.callbacks.MLflowLogger): the epochs' metrics that came
    through model_dir, the tags and the model, in a local store."""
    import mlflow

    from optim.callbacks import MLflowLogger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracking = "file:" + str(tmp_path / "mlruns")
    session, touches = connect
    x, y = digits.load()
    train, held = digits_df(session, x[:1400], y[:1400]), digits_df(session, x[1400:], y[1400:])
    net = cnn_net(seed=1)
    opt = TFOptimizer(net, SCE, optim.Adam(0.01), metrics=["accuracy"], model_dir=str(tmp_path / "run"))
    before = opt.evaluate(TFDataset.from_dataframe(held, "image", "label", feature_shapes=[(8, 8, 1)]), batch_size=64)
    data = TFDataset.from_dataframe(train, "image", "label", feature_shapes=[(8, 8, 1)])
    val = TFDataset.from_dataframe(held, "image", "label", feature_shapes=[(8, 8, 1)])
    history = opt.optimize(data, validation_data=val, epochs=3, batch_size=64, num_workers=2, verbose=2,
                           checkpoint_every=10, callbacks=[MLflowLogger(tracking_uri=tracking)])
    after = opt.evaluate(TFDataset.from_dataframe(held, "image", "label", feature_shapes=[(8, 8, 1)]), batch_size=64)
    # the held-out accuracy a classic run of this net and data reaches: 0.917 to 0.935 over seeds 0 to 2 after
    # 3 epochs, streamed or in memory (the two paths shuffle differently; 0.927 here, streamed, with seed 0)
    assert before["accuracy"] < 0.3 and after["accuracy"] >= 0.9, (before, after)
    assert abs(history["val_accuracy"][-1] - after["accuracy"]) < 1e-6
    # progress came through model_dir while the stage ran: the per-epoch lines and the first step
    run = opt.last_run
    assert run["startup_s"] is not None and len(run["step_times"]) == opt.global_step
    err = capsys.readouterr().err
    assert f"epoch 3/3 (step {opt.global_step})" in err, err[-2000:]
    events = json.loads((tmp_path / "run" / "progress" / run["run_id"] / "attempt-0.json").read_text())
    assert [e["epoch"] for e in events if e["event"] == "epoch_end"] == [0, 1, 2]
    ckpts = sorted(glob.glob(str(tmp_path / "run" / "checkpoints" / run["run_id"] / "ckpt-*.npz")))
    assert CheckpointManager.load(ckpts[-1]).step == opt.global_step
    client = mlflow.tracking.MlflowClient(tracking_uri=tracking)
    logged = client.get_run(run["mlflow_run_id"])
    assert logged.data.tags["tfnet.mode"] == "connect" and logged.data.params["data"] == "DataFrameDataset"
    accuracy = sorted({(m.step, m.value) for m in client.get_metric_history(run["mlflow_run_id"], "val_accuracy")})
    assert [a[0] for a in accuracy] == [0, 1, 2] and [a[1] for a in accuracy] == pytest.approx(history["val_accuracy"])
    mlflow.set_tracking_uri(tracking)
    try:
        model = mlflow.pyfunc.load_model(f"runs:/{run['mlflow_run_id']}/model")
        rows = pd.DataFrame({"image": [r.ravel().tolist() for r in x[1400:1404]]})
        np.testing.assert_allclose(model.predict(rows), net.forward(x[1400:1404]), rtol=1e-5, atol=1e-6)
    finally:
        mlflow.set_tracking_uri("")
    assert not touches, touches[0]


def test_predictor_over_connect_equals_forward(connect):
    session, touches = connect
    x, y = digits.load()
    net = cnn_net(seed=2)
    df = digits_df(session, x[:300], y[:300]).repartition(3)
    out = TFPredictor(net, batch_per_thread=64).predict(df, feature_cols="image").toPandas().sort_values("id")
    assert out["id"].tolist() == list(range(300))
    np.testing.assert_allclose(np.stack(out["output"].to_numpy()), net.forward(x[:300]), rtol=1e-5, atol=1e-5)
    # the Spark ML stage, the way a pipeline runs it
    stage = TFNetTransformer(net, inputCols=["image"], outputCols=["logits"], batchPerThread=32)
    ml = stage.transform(df).select("id", "logits").toPandas().sort_values("id")
    np.testing.assert_allclose(np.stack(ml["logits"].to_numpy()), net.forward(x[:300]), rtol=1e-5, atol=1e-5)
    assert not touches, touches[0]


def test_parquet_files_predict_over_connect(connect, tmp_path):
    """TFPredictor over Parquet files (written by pyarrow) from a Connect client: the Connect session's executors read
    them, rows in the files' order, outputs equal to forward."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    session, touches = connect
    x, _ = digits.load()
    net = cnn_net(seed=2)
    path = tmp_path / "digits.parquet"
    pq.write_table(pa.table({"id": np.arange(120), "image": pa.array(x[:120].reshape(120, -1).astype(np.float32).tolist(),
                                                                      pa.list_(pa.float32()))}), path, row_group_size=25)
    data = TFDataset.from_parquet(str(path), "image", feature_shapes={"image": x.shape[1:]})
    out = TFPredictor(net, batch_per_thread=32).predict(data)
    from optim.spark.connect import is_connect

    assert is_connect(out) and out.columns == ["id", "image", "output"]
    rows = out.toPandas()
    assert rows["id"].tolist() == list(range(120))
    np.testing.assert_allclose(np.stack(rows["output"].to_numpy()), net.forward(x[:120]), rtol=1e-5, atol=1e-5)
    assert not touches, touches[0]


def test_spark_ml_estimator_fits_from_connect(connect):
    """TFNetEstimator.fit over a Connect DataFrame (a barrier stage from the client), its model's
    outputs equal to the fitted net's forward, and Spark ML's evaluator over its prediction column."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql import functions as F

    from optim import TFNetEstimator

    session, touches = connect
    x, y = digits.load()
    df = digits_df(session, x[:640], y[:640])
    est = TFNetEstimator(cnn_net(seed=3), featureCols=["image"], featureShapes=[[8, 8, 1]], method="adam",
                         learningRate=0.01, epochs=3, batchSize=64, numWorkers=2, outputCols=["logits"])
    model = est.fit(df)
    held = digits_df(session, x[1400:], y[1400:])
    out = model.transform(held).select("id", "logits", "prediction", "label").toPandas().sort_values("id")
    local = model._predictor().predict(x[1400:])  # the fitted model run here, on numpy
    np.testing.assert_allclose(np.stack(out["logits"].to_numpy()), local, rtol=1e-5, atol=1e-5)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(
        model.transform(held).withColumn("label", F.col("label").cast("double")))
    assert accuracy >= 0.85, accuracy
    assert not touches, touches[0]


def test_a_net_too_large_for_the_plan_fails_before_the_stage(connect):
    session, _ = connect
    x, y = digits.load()
    session.conf.set("spark.tfnet.connect.maxPlanBytes", "1k")
    try:
        opt = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05))
        with pytest.raises(DistributedTrainingError, match="Give TFOptimizer a model_dir"):
            opt.optimize(TFDataset.from_dataframe(digits_df(session, x[:64], y[:64]), "image", "label",
                                                  feature_shapes=[(8, 8, 1)]), batch_size=32, num_workers=2, verbose=0)
        assert opt.global_step == 0
    finally:
        session.conf.unset("spark.tfnet.connect.maxPlanBytes")


def test_a_rank_error_reaches_the_client_typed(connect):
    """A label outside the classes, found by the ranks in their partitions, fails the call with the
    same typed error as in a classic session, the rank's message intact, and is not retried."""
    from optim.errors import DataError

    session, _ = connect
    x, y = digits.load()
    y = y[:128].copy()
    y[70] = 12
    opt = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05))
    data = TFDataset.from_dataframe(digits_df(session, x[:128], y), "image", "label", feature_shapes=[(8, 8, 1)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DataError, match=r"holds class 12, outside"):
            opt.optimize(data, batch_size=32, num_workers=2, verbose=0, max_retries=2)
    assert not [w for w in caught if "retrying" in str(w.message)], "a data error is not retried"
    assert opt.global_step == 0


def test_killed_rank_is_retried_from_its_own_checkpoint(connect, tmp_path):
    session, touches = connect
    x, y = digits.load()
    x, y = x[:512], y[:512]
    model_dir = tmp_path / "run"
    opt = TFOptimizer(cnn_net(seed=5), SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(model_dir))
    killed = kill_rank_after_checkpoints(str(model_dir), checkpoints=3)  # rank 1's Python process, after step 12 of 64
    with pytest.warns(RuntimeWarning, match="Training stage attempt 1 failed.*retrying from this run's newest checkpoint"):
        opt.optimize((x, y), epochs=4, batch_size=32, num_workers=2, checkpoint_every=4, keep_checkpoints=100,
                     verbose=0, timeout=60, max_retries=2)
    killed["thread"].join(5)
    assert "pid" in killed
    run = opt.last_run
    assert run["attempts"] == 2 and opt.global_step == 4 * 16
    resumed = run["resumed_from"]
    assert resumed and os.path.dirname(resumed) == str(model_dir / "checkpoints" / run["run_id"])
    start = CheckpointManager.load(resumed).step
    assert run["attempt_log"][-1]["start_step"] == start >= 12, "resumed, not restarted from step 0"
    assert not touches, touches[0]


def test_lora_adapters_train_from_connect(connect):
    """A net with low-rank adapters shipped from a Connect client: the ranks rebuild its adapters, only
    they are averaged, the base comes back as it went, and the adapters equal a run in this process."""
    session, touches = connect
    x, y = digits.load()
    net = cnn_net(seed=3).with_lora(True, rank=4, seed=0)
    base = {n: v for n, v in net.get_weights().items() if n not in net.adapter_names}
    opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9))
    history = opt.optimize((x[:ROWS], y[:ROWS]), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    assert opt.last_run["mode"] == "connect"
    adapter_bytes = sum(net.weight_variables[n].numpy().nbytes for n in net.adapter_names)
    assert history["bytes_per_step"] == [adapter_bytes + 4] * 2
    local = cnn_net(seed=3).with_lora(True, rank=4, seed=0)
    TFOptimizer(local, SCE, optim.SGD(0.05, momentum=0.9)).optimize((x[:ROWS], y[:ROWS]), epochs=2, batch_size=32,
                                                                    shuffle=False, verbose=0)
    for name in net.adapter_names:
        np.testing.assert_allclose(net.get_weights()[name], local.get_weights()[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    for name, value in base.items():
        assert np.array_equal(net.get_weights()[name], value), name
    assert not touches, touches[0]


def test_a_model_of_several_outputs_from_connect(connect):
    """Keras's guide's ticket model from a Connect client: a DataFrame's label columns by output name, a Keras AUC and
    F1Score per output (their states merged over the tasks), each output's loss; evaluated over Spark as locally on
    the same rows, and trained on two ranks with every key of the history there."""
    import keras

    from tests.optim.test_keras_multi_output import X, Y, guide_model

    session, touches = connect
    metrics = {"priority": [keras.metrics.AUC(name="auc")],
               "department": [keras.metrics.F1Score(average="macro", name="f1")]}
    opt = TFOptimizer.from_keras(guide_model(metrics))
    rows = [(X["title"][i].tolist(), X["body"][i].tolist(), X["tags"][i].tolist(), float(Y["priority"][i, 0]),
             Y["department"][i].tolist()) for i in range(len(Y["priority"]))]
    df = session.createDataFrame(rows, "t array<float>, b array<float>, g array<float>, p double, d array<float>")
    data = TFDataset.from_dataframe(df.repartition(3), {"tags": "g", "title": "t", "body": "b"},
                                    label_cols={"priority": "p", "department": "d"})
    local = opt.evaluate((X, Y), batch_size=16)
    assert set(local) == {"loss", "priority_loss", "department_loss", "priority_auc", "department_f1"}
    remote = opt.evaluate(data, batch_size=16)
    for key, value in local.items():
        np.testing.assert_allclose(remote[key], value, rtol=1e-5, err_msg=key)
    history = opt.optimize(data, epochs=1, batch_size=16, num_workers=2, verbose=0)
    assert set(local) <= set(history) and opt.global_step > 0
    assert not touches, touches[0]
