"""``TFNetEstimator`` under MLflow's own Spark ML autologging (``mlflow.pyspark.ml.autolog()``), as a user turns it on:
the estimator's params are logged, and with ``optim.ml.model.TFNetModel`` in the allowlist file named by
``spark.mlflow.pysparkml.autolog.logModelAllowlistFile`` (set when the session is built) the fitted model is logged
too, and loads back with ``mlflow.spark.load_model`` to score as it did. A Spark of its own, in a subprocess."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

JOB = textwrap.dedent("""
    import json, sys
    import numpy as np
    from pyspark.sql import SparkSession
    allowlist, tracking = sys.argv[1], sys.argv[2]
    spark = (SparkSession.builder.master("local[2]").appName("autolog").config("spark.ui.enabled", "false")
             .config("spark.mlflow.pysparkml.autolog.logModelAllowlistFile", allowlist).getOrCreate())
    import mlflow
    import mlflow.pyspark.ml
    from optim import TFNetEstimator
    from tests import digits
    from tfnet import TFNet
    mlflow.set_tracking_uri(tracking)
    mlflow.pyspark.ml.autolog(log_post_training_metrics=False)
    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), float(y[i])) for i in range(128)],
                               "pixels array<float>, label double").repartition(2)
    est = TFNetEstimator(TFNet.from_keras(digits.cnn(10)), featureCols=["pixels"], featureShapes=[[8, 8, 1]],
                         learningRate=0.01, epochs=1, batchSize=32, numWorkers=2, outputCols=["logits"])
    with mlflow.start_run() as run:
        model = est.fit(df)
    params = mlflow.tracking.MlflowClient().get_run(run.info.run_id).data.params
    loaded = mlflow.spark.load_model(f"runs:/{run.info.run_id}/model")
    a = np.array([r.logits for r in model.transform(df.limit(8)).collect()])
    b = np.array([r.logits for r in loaded.transform(df.limit(8)).collect()])
    print("RESULT " + json.dumps({"params": params, "same": bool(np.allclose(a, b, rtol=1e-6)),
                                  "loaded": type(loaded).__name__}), flush=True)
    spark.stop()
""")


def test_an_estimator_under_spark_ml_autolog_logs_its_params_and_an_allowlisted_model(tmp_path):
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text("optim.ml.model.TFNetModel\npyspark.ml.classification.*\n")
    env = dict(os.environ, MLFLOW_ALLOW_FILE_STORE="true", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", JOB, str(allowlist), "file:" + str(tmp_path / "mlruns")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("RESULT ")][0][len("RESULT "):])
    params = result["params"]
    assert params["learningRate"] == "0.01" and params["epochs"] == "1" and params["numWorkers"] == "2", params
    assert result["loaded"] == "PipelineModel" or result["loaded"] == "TFNetModel", result
    assert result["same"], result
