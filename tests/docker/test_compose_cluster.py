"""The compose cluster (docker/docker-compose.yml) on the image: a master and 2 workers of 1 core.
The digits main job trains on it, a distributed fine-tuning run survives a `docker kill`ed worker
container, TFPredictor on it equals ``net.forward``, job exit codes reach the host, and
``down -v`` leaves nothing behind. The tests run in file order on one cluster; the last one removes it."""

import glob
import json
import re
import textwrap
import time

import numpy as np
import pytest

from tests.docker.compose import sh

# the first test of a fresh machine also installs Docker, makes the base image, the wheelhouse and the image
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

# A driver of our own, run in a container of the image: only tfnet's public API, digits from scikit-learn.
FINE_TUNE = textwrap.dedent("""
    import json, os
    import keras, numpy as np
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits
    import optim
    from optim import TFDataset, TFOptimizer
    from tfnet import TFNet

    spark = (SparkSession.builder.master(os.environ["SPARK_MASTER_URL"]).appName("tfnet-docker-kill-test")
             .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"]).config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "1g").config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
             .getOrCreate())
    d = load_digits()
    x, y = (d.images[:1024, :, :, None] / 16.0).astype("float32"), d.target[:1024].astype("int64")
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i])) for i in range(len(x))],
                               "pixels array<float>, label long").repartition(2)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"),
                              keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
                              keras.layers.Flatten(name="flat"), keras.layers.Dense(64, activation="relu", name="features"),
                              keras.layers.Dense(10, name="logits")])
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    opt = TFOptimizer(TFNet.from_keras(model), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.Adam(0.005), metrics=["accuracy"], model_dir="/shared/kill/run")
    history = opt.optimize(data, epochs=EPOCHS, batch_size=32, num_workers=2, checkpoint_every=8, verbose=2,
                           timeout=60, max_retries=2)
    print("RESULT " + json.dumps({"step": opt.global_step, "last_run": opt.last_run, "history": history}), flush=True)
""")
EPOCHS = 6
STEPS_PER_EPOCH = 1024 // 32


def test_main_job_reaches_095_on_two_workers(cluster):
    t0 = time.time()
    proc = cluster.run("main", timeout=900)
    seconds = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"\nmain job on the compose cluster: {seconds:.0f} s (docker-compose run, start to exit)")
    summary = proc.stdout[proc.stdout.rindex("Summary"):]
    print(summary)
    assert re.search(r"ranks\s+2\b", summary), summary
    accuracy = float(re.search(r"accuracy after fine-tuning\s+([0-9.]+)", summary).group(1))
    assert accuracy >= 0.95, summary
    # the fine-tuned graph landed on the shared volume
    assert "frozen_inference_graph.pb" in cluster.exec_master("ls", "/shared/main/fine_tuned").stdout


def test_fine_tuning_survives_a_killed_worker_container(cluster, tmp_path):
    from optim.training.checkpoint import CheckpointManager

    workers = cluster.containers("spark-worker")
    assert len(workers) == 2
    script = FINE_TUNE.replace("EPOCHS", str(EPOCHS))
    t0 = time.time()
    driver = cluster.start("submit", "python", "-c", script)
    try:
        deadline = time.time() + 420
        while time.time() < deadline:
            assert driver.poll() is None, driver.communicate()[1][-4000:]
            ls = cluster.exec_master("sh", "-c", "ls /shared/kill/run/checkpoints/*/ 2>/dev/null", check=False).stdout
            if re.search(r"ckpt-\d+\.npz", ls):
                break
            time.sleep(1)
        else:
            pytest.fail("no checkpoint within 420 s")
        killed = workers[1]
        sh(["docker", "kill", killed], timeout=60)  # the worker JVM, its executor and its Python workers
        t_kill = time.time()
        sh(["docker", "start", killed], timeout=60)  # what a restart policy or a cluster manager does
        out, err = driver.communicate(timeout=900)
    finally:
        if driver.poll() is None:
            driver.kill()
    seconds = time.time() - t0
    assert driver.returncode == 0, out[-3000:] + err[-4000:]
    result = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert result, err[-4000:]
    res = json.loads(result[0][len("RESULT "):])
    print(f"\nfine-tuning with a killed worker container: {seconds:.0f} s in all, {time.time() - t_kill:.0f} s "
          f"from the kill to the end; attempts {res['last_run']['attempts']}")
    # the stage lost a task, and the launcher retried it from the newest checkpoint
    assert res["last_run"]["attempts"] >= 2, res["last_run"]
    assert "retrying from this run's newest checkpoint" in err, err[-3000:]
    assert res["last_run"]["attempt_log"][-1]["start_step"] > 0, "the retry resumed, not restarted from step 0"
    assert res["step"] == EPOCHS * STEPS_PER_EPOCH
    assert len(res["history"]["loss"]) == EPOCHS
    assert res["history"]["accuracy"][-1] > 0.8, res["history"]

    # every checkpoint left on the shared volume loads and passes its SHA-256 check
    cluster.copy_out("/shared/kill/run/checkpoints", str(tmp_path))
    paths = sorted(glob.glob(str(tmp_path / "checkpoints" / res["last_run"]["run_id"] / "ckpt-*.npz")))
    assert paths
    steps = [CheckpointManager.load(p).step for p in paths]
    assert max(steps) == EPOCHS * STEPS_PER_EPOCH, steps


def test_predictor_on_the_cluster_equals_net_forward(cluster, tmp_path):
    import keras
    from sklearn.datasets import load_digits

    from tfnet import TFNet

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"),
                              keras.layers.Conv2D(8, 3, activation="relu", name="conv"),
                              keras.layers.Flatten(name="flat"), keras.layers.Dense(10, name="logits")])
    net = TFNet.from_keras(model)
    net.save(str(tmp_path / "model"))
    cluster.copy_in(str(tmp_path / "model"), "/shared/predict-model")

    t0 = time.time()
    proc = cluster.run("predict", "--model", "/shared/predict-model", "--rows", "600", "--partitions", "4",
                       "--output", "/shared/predict-test", timeout=600)
    seconds = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"\npredict job on the compose cluster: {seconds:.0f} s; {proc.stdout.strip().splitlines()[-1]}")
    cluster.copy_out("/shared/predict-test", str(tmp_path / "out"))
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["rows"] == 600
    assert len(result["hosts"]) == 2, result  # both worker containers ran the model

    # oracles here on the host: this net's forward, and the Keras model it came from
    pred = np.load(tmp_path / "out" / "predictions.npz")
    x = (load_digits().images[:600, :, :, None] / 16.0).astype(np.float32)
    assert np.array_equal(pred["id"], np.arange(600))
    np.testing.assert_allclose(pred["outputs"], net.forward(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pred["outputs"], model.predict(x, verbose=0), rtol=1e-4, atol=1e-4)


def test_job_exit_codes_reach_the_host(cluster):
    proc = cluster.run("predict", "--rows", "0", timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--rows must be between 1 and 1797" in proc.stderr
    proc = cluster.run("submit", "sh", "-c", "exit 7", timeout=300)
    assert proc.returncode == 7


def test_down_v_leaves_nothing_behind(cluster):
    assert cluster.leftovers()["containers"], "the cluster is up before down -v"
    cluster.down()
    left = cluster.leftovers()
    assert left == {"containers": [], "networks": [], "volumes": []}, left
