"""MLflow tracking built in (``optim.callbacks.MLflowLogger``), against a local file store and a real ``mlflow server``
the test starts (SQLite backend, a free port): the parameters, the training data as the run's dataset input, one
metric series per training and validation metric with the epoch as the step (each point once), the tags, and the
fine-tuned net as an MLflow model that, loaded in a fresh process, predicts what ``net.forward`` gives from a
DataFrame of flat cells, of nested cells and from an array. MLflow's "View run" lines print once. A server that is
down costs one warning and ``mlflow_run_id`` None; the training goes on. A Delta table's dataset input names the
table and the version read, Parquet files their path."""

import json
import subprocess
import sys
import textwrap

import mlflow
import numpy as np
import pandas as pd
import pytest

import optim
from optim import TFOptimizer
from optim.callbacks import MLflowLogger
from tests import digits
from tests.mlflow_server import MLflowServer
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)

PREDICT = textwrap.dedent("""
    import json, sys
    import numpy as np, pandas as pd
    import mlflow
    mlflow.set_tracking_uri(sys.argv[1])
    model = mlflow.pyfunc.load_model(f"runs:/{sys.argv[2]}/model")
    rows = np.load(sys.argv[3])
    inputs = {"flat": pd.DataFrame({"image": [r.ravel().tolist() for r in rows]}),
              "nested": pd.DataFrame({"image": list(rows)}), "array": rows}
    print("OUT " + json.dumps({k: np.asarray(model.predict(v)).tolist() for k, v in inputs.items()}))
""")


def run(tracking_uri, epochs=2, **logger):
    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.Adam(0.01), metrics=["accuracy"])
    history = opt.optimize((x[:128], y[:128]), epochs=epochs, batch_size=32, validation_data=(x[128:192], y[128:192]),
                           verbose=0, callbacks=[MLflowLogger(tracking_uri=tracking_uri, experiment="tfnet-test",
                                                              **logger)])
    return opt, history, x[192:196]


def check_run(uri: str, opt, history, rows, tmp_path):
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run_id = opt.last_run["mlflow_run_id"]
    logged = client.get_run(run_id)
    params = logged.data.params
    assert params["optimizer"] == "Adam" and params["optimizer.learning_rate"] == "0.01"
    assert params["batch_size"] == "32" and params["epochs"] == "2" and params["data"] == "ArrayDataset"
    assert params["data_rows"] == "128" and params["precision"] == "fp32"
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        series = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert [m[0] for m in series] == [0, 1], (key, series)  # each point once
        np.testing.assert_allclose([m[1] for m in series], history[key], rtol=1e-6)
    # the training data as the run's dataset input: the arrays, with MLflow's own digest of them
    x, y = digits.load()
    (used,) = logged.inputs.dataset_inputs
    assert {t.key: t.value for t in used.tags} == {"mlflow.data.context": "training"}
    assert used.dataset.name == "arrays" and used.dataset.source_type == "code"
    assert used.dataset.digest == mlflow.data.from_numpy(x[:128], targets=y[:128]).digest
    tags = logged.data.tags
    assert tags["tfnet.run_id"] == opt.last_run["run_id"] and tags["tfnet.attempts"] == "1"
    assert logged.info.status == "FINISHED"
    # the model, loaded in a fresh process, predicts what net.forward gives, from each kind of input
    path = tmp_path / "rows.npy"
    np.save(path, rows)
    done = subprocess.run([sys.executable, "-c", PREDICT, uri, run_id, str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    outs = json.loads([line for line in done.stdout.splitlines() if line.startswith("OUT ")][0][4:])
    assert sorted(outs) == ["array", "flat", "nested"]
    for kind, out in outs.items():
        np.testing.assert_allclose(np.array(out), opt.net.forward(rows), rtol=1e-5, atol=1e-6, err_msg=kind)


def test_a_run_in_a_file_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 keeps its file store only on request
    uri = "file:" + str(tmp_path / "mlruns")
    opt, history, rows = run(uri)
    check_run(uri, opt, history, rows, tmp_path)


def test_a_run_on_a_tracking_server_and_a_server_that_is_down(tmp_path, capsys):
    with MLflowServer(tmp_path) as server:
        serving = server.processes()  # the server and its workers; not MLflow's job runner (tests/mlflow_server.py)
        assert any("mlflow" in c for c in serving) and not any("huey" in c for c in serving), serving
        capsys.readouterr()
        opt, history, rows = run(server.uri)
        printed = capsys.readouterr().out
        run_id = opt.last_run["mlflow_run_id"]
        assert printed.count("View run") == 1 and printed.count("View experiment") == 1, printed
        assert f"/runs/{run_id}" in printed, printed
        check_run(server.uri, opt, history, rows, tmp_path)
        # inside the user's own active run: the logger logs into it and leaves it open
        mlflow.set_tracking_uri(server.uri)
        with mlflow.start_run() as mine:
            opt, _, _ = run(server.uri, epochs=1, log_model=False)
            assert opt.last_run["mlflow_run_id"] == mine.info.run_id
            assert mlflow.active_run().info.run_id == mine.info.run_id
        mlflow.set_tracking_uri("")
    down = server.uri  # stopped now: nothing listens there
    with pytest.warns(RuntimeWarning, match=r"MLflow tracking stopped .*; the training goes on without it"):
        opt, history, _ = run(down, epochs=2)
    assert len(history["loss"]) == 2 and opt.global_step == 8 and opt.last_run["mlflow_run_id"] is None


def log_data(uri: str, data) -> mlflow.entities.Run:
    """``MLflowLogger``'s run for an ``optimize()`` call on ``data`` (its RunInfo as ``optimize`` makes it), begun
    and ended around no training."""
    from types import SimpleNamespace

    from optim.callbacks import run_info

    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.Adam(0.01))
    config = SimpleNamespace(batch_size=32, epochs=1, max_steps=None, sync="sync", precision="fp32", seed=0)
    info = run_info(opt, data, config, 2, {})
    logger = MLflowLogger(tracking_uri=uri, experiment="tfnet-data", log_model=False)
    logger.on_run_begin(info)
    last = logger.on_run_end(info, {"loss": [0.5]}, {"run_id": "r"})
    return mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(last["mlflow_run_id"])


def test_delta_and_parquet_data_are_the_runs_dataset_input(tmp_path, monkeypatch):
    import deltalake

    from optim import TFDataset

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = "file:" + str(tmp_path / "mlruns")
    x, y = digits.load()

    def frame(first, end):
        return pd.DataFrame({"pixels": [x[i].reshape(64) for i in range(first, end)], "label": y[first:end]})

    table = str(tmp_path / "table")
    deltalake.write_deltalake(table, frame(0, 100))
    deltalake.write_deltalake(table, frame(100, 150), mode="append")
    for version, read, rows in ((0, 0, 100), (None, 1, 150)):
        data = TFDataset.from_delta(table, ["pixels"], "label", feature_shapes=[(8, 8, 1)], version=version)
        logged = log_data(uri, data)
        params = logged.data.params
        assert params["data"] == "DeltaDataset" and params["data_path"] == table
        assert params["data_version"] == str(read) and params["data_rows"] == str(rows)
        (used,) = logged.inputs.dataset_inputs
        assert {t.key: t.value for t in used.tags} == {"mlflow.data.context": "training"}
        assert used.dataset.source_type == "delta_table" and used.dataset.name == "table"
        assert json.loads(used.dataset.source) == {"path": table, "delta_table_version": read}

    folder = tmp_path / "parquet"
    folder.mkdir()
    frame(0, 60).to_parquet(folder / "part-0.parquet")
    frame(60, 100).to_parquet(folder / "part-1.parquet")
    logged = log_data(uri, TFDataset.from_parquet(str(folder), ["pixels"], "label", feature_shapes=[(8, 8, 1)]))
    params = logged.data.params
    assert params["data"] == "ParquetDataset" and params["data_path"] == str(folder) and params["data_rows"] == "100"
    assert "data_version" not in params
    (used,) = logged.inputs.dataset_inputs
    assert used.dataset.source_type == "local" and json.loads(used.dataset.source) == {"uri": str(folder)}
    assert used.dataset.name == "parquet"
    # the digest follows the files and their rows
    frame(100, 110).to_parquet(folder / "part-2.parquet")
    grown = log_data(uri, TFDataset.from_parquet(str(folder), ["pixels"], "label", feature_shapes=[(8, 8, 1)]))
    assert grown.inputs.dataset_inputs[0].dataset.digest != used.dataset.digest


@pytest.mark.spark
def test_a_dataframe_is_the_runs_dataset_input_by_its_plan(tmp_path, monkeypatch, spark):
    from optim import TFDataset

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = "file:" + str(tmp_path / "mlruns")
    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i])) for i in range(64)], "pixels array<float>, label long")

    def logged(frame):
        data = TFDataset.from_dataframe(frame, "pixels", "label", feature_shapes=[(8, 8, 1)])
        (used,) = log_data(uri, data).inputs.dataset_inputs
        return used.dataset

    first, again, fewer = logged(df), logged(df), logged(df.limit(10))
    assert first.source_type == "code" and first.name == "dataframe"
    assert first.digest == again.digest != fewer.digest  # the plan's semantic hash: the same plan, the same digest
