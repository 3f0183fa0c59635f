"""A decommission notice on a real standalone cluster (``spark.decommission.enabled`` on the workers and the
application; SIGPWR to a worker's JVM, as a spot reclaim or a scale-down sends it): the ranks checkpoint at the next
step and the run goes on with the rank that stays, from that step. No retry, no step done twice, though the run
checkpoints only at epoch ends."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cluster import ROOT, StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

DRIVER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master({url!r}).appName("tfnet-decommission-test")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "1g").config("spark.executor.cores", "1")
             .config("spark.decommission.enabled", "true")
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2").getOrCreate())
    import optim
    from optim import TFDataset, TFOptimizer
    from tests import digits
    from tfnet import TFNet
    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i])) for i in range(1024)],
                               "pixels array<float>, label long").repartition(2)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={{"pixels": (8, 8, 1)}})
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.Adam(0.005), metrics=["accuracy"], model_dir={model_dir!r})
    history = opt.optimize(data, epochs={epochs}, batch_size=32, num_workers=2, min_workers=1, elastic_wait=5,
                           checkpoint_every=100000, verbose=0, timeout=60, max_retries=0)
    print("RESULT " + json.dumps({{"step": opt.global_step, "last_run": opt.last_run, "history": history}}), flush=True)
""")


class DecommissioningCluster(StandaloneCluster):
    """Workers that take decommission notices (SIGPWR), as managed clusters run them."""

    def _env(self, **extra) -> dict:
        return super()._env(SPARK_WORKER_OPTS="-Dspark.decommission.enabled=true", **extra)


def test_a_decommissioned_worker_is_a_planned_shrink_from_the_step_of_the_notice(tmp_path):
    model_dir = str(tmp_path / "run")
    epochs = 12  # 1024 rows, 16 per rank per step: 32 steps per epoch
    with DecommissioningCluster(workers=2, cores=1) as cluster:
        script = DRIVER.format(root=ROOT, url=cluster.url, model_dir=model_dir, epochs=epochs)
        driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT)
        try:
            first_epoch = os.path.join(model_dir, "checkpoints")
            deadline = time.time() + 300
            while time.time() < deadline and not _checkpoints(first_epoch):
                assert driver.poll() is None, driver.communicate()[1][-3000:]
                time.sleep(0.2)
            assert _checkpoints(first_epoch), "training started"
            os.kill(cluster.workers[1].pid, signal.SIGPWR)  # the worker's JVM (entrypoint.sh execs it)
            out, err = driver.communicate(timeout=600)
        finally:
            if driver.poll() is None:
                driver.kill()
    result = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert result, err[-4000:]
    res = json.loads(result[0][len("RESULT "):])
    run = res["last_run"]
    told = re.search(r"An executor running 1 of the 2 rank\(s\) is being decommissioned \(at step (\d+)\)", err)
    assert told, err[-3000:]
    assert run["states"] == ["starting", "running", "shrinking", "running", "finished"], run["states"]
    first, second = run["attempt_log"]
    assert first["ok"] and first["stopped"] and first["ranks"] == 2 and second["ranks"] == 1, run["attempt_log"]
    # no step done twice: the second attempt starts where the first stopped, at or after the step of the notice
    assert second["start_step"] == first["end_step"] >= int(told.group(1)), run["attempt_log"]
    # from the checkpoint the notice asked for (the run's own checkpoints are at epoch ends only)
    assert second["resumed_from"].endswith(os.path.join(run["run_id"], f"ckpt-{second['start_step']:09d}.npz")), second
    assert run["membership"] == [{"step": 0, "ranks": 2}, {"step": second["start_step"], "ranks": 1}], run
    assert res["step"] == epochs * 32 and len(res["history"]["loss"]) == epochs, res
    assert res["history"]["accuracy"][-1] > 0.9, res["history"]
    assert "Traceback" not in err and "retrying" not in err, err[-3000:]


def _checkpoints(folder: str) -> list[str]:
    import glob

    return glob.glob(os.path.join(folder, "*", "ckpt-*.npz"))
