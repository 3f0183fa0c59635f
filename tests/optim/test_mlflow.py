"""MLflow tracking built in (``optim.callbacks.MLflowLogger``), against a local file store and a real ``mlflow server``
the test starts (SQLite backend, a free port): the parameters, one metric series per training and validation metric
with the epoch as the step, the tags, and the fine-tuned net as an MLflow model that, loaded in a fresh process,
predicts what ``net.forward`` gives. A server that is down costs one warning; the training goes on."""

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
    frame = pd.read_json(sys.argv[3], orient="split")
    out = model.predict(frame)
    print("OUT " + json.dumps(np.asarray(out).tolist()))
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
        # (MLflow 3.17's file store lists the first entry twice once a model is logged: the same step, time and value)
        series = sorted({(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)})
        assert [m[0] for m in series] == [0, 1], key
        np.testing.assert_allclose([m[2] for m in series], history[key], rtol=1e-6)
    tags = logged.data.tags
    assert tags["tfnet.run_id"] == opt.last_run["run_id"] and tags["tfnet.attempts"] == "1"
    assert logged.info.status == "FINISHED"
    # the model, loaded in a fresh process, predicts what net.forward gives
    frame = pd.DataFrame({"image": [r.ravel().tolist() for r in rows]})
    path = tmp_path / "rows.json"
    frame.to_json(path, orient="split")
    done = subprocess.run([sys.executable, "-c", PREDICT, uri, run_id, str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = np.array(json.loads([line for line in done.stdout.splitlines() if line.startswith("OUT ")][0][4:]))
    np.testing.assert_allclose(out, opt.net.forward(rows), rtol=1e-5, atol=1e-6)


def test_a_run_in_a_file_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 keeps its file store only on request
    uri = "file:" + str(tmp_path / "mlruns")
    opt, history, rows = run(uri)
    check_run(uri, opt, history, rows, tmp_path)


def test_a_run_on_a_tracking_server_and_a_server_that_is_down(tmp_path):
    with MLflowServer(tmp_path) as server:
        opt, history, rows = run(server.uri)
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
    assert len(history["loss"]) == 2 and opt.global_step == 8 and "mlflow_run_id" not in opt.last_run
