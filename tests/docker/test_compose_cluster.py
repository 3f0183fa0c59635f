"""The compose cluster (docker/docker-compose.yml, with its shared /shared volume) on the image: a master
and 2 workers of 1 core. The digits main job trains on it, TFPredictor on it equals ``net.forward``, job
exit codes reach the host, a Spark Connect client on this host (outside the cluster) fine-tunes and
predicts on the workers through the `spark-connect` service, and ``down -v`` leaves nothing behind. The
tests run in file order on one cluster; the last one removes it. (The run that survives a killed worker container is in
test_no_shared_disk_cluster.py, on a cluster that shares no disk.)"""

import json
import re
import time

import numpy as np
import pandas as pd
import pytest

import optim
from optim import TFDataset, TFOptimizer, TFPredictor
from tests import digits
from tests.connect_server import close_session
from tests.docker.compose import sh
from tfnet import TFNet

# the first test of a fresh machine also installs Docker, makes the base image, the wheelhouse and the image
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]


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


# Run inside the Connect server's container: for the last job tfnet tagged as training, the tasks of
# its last stage (the barrier stage; a task's index is its rank) and the hosts they ran on, from the
# server's own REST API (the Spark UI, which listens on the container's address).
TRAINING_TASKS = """
import json, socket, urllib.request as u
get = lambda path: json.load(u.urlopen(f"http://{socket.gethostname()}:4040/api/v1/applications{path}", timeout=10))
app = get("")[0]["id"]
jobs = [j for j in get(f"/{app}/jobs") if any("_Tag_tfnet-train-" in t for t in j.get("jobTags", []))]
job = max(jobs, key=lambda j: j["jobId"])
stage = max(job["stageIds"])
attempt = get(f"/{app}/stages/{stage}")[-1]["attemptId"]
tasks = get(f"/{app}/stages/{stage}/{attempt}/taskList")
print(json.dumps({"job": job["status"], "ranks": {t["index"]: t["host"] for t in tasks if t["status"] == "SUCCESS"}}))
"""


@pytest.fixture
def connect_server(cluster):
    """The cluster's `spark-connect` service, healthy (it listens, and has an executor on each worker);
    yields ``(url for a client on this host, seconds it took to come up)``. Removed at the end."""
    t0 = time.time()
    try:
        cluster("up", "-d", "spark-connect", timeout=300)
        container = cluster.containers("spark-connect")[0]
        deadline = time.time() + 240
        while cluster.inspect(container)["State"].get("Health", {}).get("Status") != "healthy":
            if time.time() > deadline:
                raise TimeoutError(f"spark-connect was not healthy within 240 s:\n"
                                   f"{cluster('logs', '--tail', '40', 'spark-connect').stdout}")
            time.sleep(1)
        address = cluster("port", "spark-connect", "15002", timeout=60).stdout.strip()  # 127.0.0.1:PORT
        yield f"sc://{address}", time.time() - t0
    finally:
        cluster("rm", "-s", "-f", "spark-connect", timeout=120, check=False)


def digits_df(session, x, y):
    frame = pd.DataFrame({"id": np.arange(len(x)), "image": list(x.reshape(len(x), -1)), "label": y})
    return session.createDataFrame(frame)


def test_a_host_client_fine_tunes_and_predicts_on_the_workers(cluster, connect_server):
    from pyspark.sql import SparkSession

    url, up_seconds = connect_server
    x, y = digits.load()
    (x_train, y_train), (x_held, y_held) = digits.split(x, y)
    session = SparkSession.builder.remote(url).create()
    try:
        net = TFNet.from_keras(digits.cnn(classes=10, seed=1))
        opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.Adam(0.01),
                          metrics=["accuracy"])
        data = TFDataset.from_dataframe(digits_df(session, x_train, y_train), "image", "label",
                                        feature_shapes=[(8, 8, 1)])
        t0 = time.time()
        history = opt.optimize(data, epochs=2, batch_size=64, num_workers=2, verbose=0)
        train_seconds = time.time() - t0

        t0 = time.time()
        out = (TFPredictor(net, batch_per_thread=64)
               .predict(digits_df(session, x_held, y_held).repartition(2), feature_cols="image")
               .toPandas().sort_values("id"))
        predict_seconds = time.time() - t0
    finally:
        close_session(session)
    print(f"\nConnect server up (healthy, executors on both workers): {up_seconds:.0f} s; fine-tuning from the "
          f"host client: {train_seconds:.0f} s; TFPredictor over {len(x_held)} rows: {predict_seconds:.0f} s")

    run = opt.last_run
    assert run["mode"] == "connect" and run["num_workers"] == 2 and run["attempts"] == 1, run
    assert opt.global_step == run["end_step"] == 2 * run["steps_per_epoch"], run
    assert len(history["loss"]) == 2 and history["loss"][1] < history["loss"][0], history
    # the returned weights, evaluated here on the held-out digits
    accuracy = float(np.mean(np.argmax(net.forward(x_held), axis=1) == y_held))
    print(f"held-out accuracy after 2 epochs on 2 ranks: {accuracy:.3f}")
    assert accuracy >= 0.9, (accuracy, history)

    assert out["id"].tolist() == list(range(len(x_held)))
    np.testing.assert_allclose(np.stack(out["output"].to_numpy()), net.forward(x_held), rtol=1e-5, atol=1e-5)

    # rank 0 and rank 1 ran in the two worker containers, one each
    workers = {next(iter(cluster.inspect(c)["NetworkSettings"]["Networks"].values()))["IPAddress"]
               for c in cluster.containers("spark-worker")}
    container = cluster.containers("spark-connect")[0]
    stage = json.loads(sh(["docker", "exec", container, "python", "-c", TRAINING_TASKS], timeout=60).stdout)
    assert stage["job"] == "SUCCEEDED", stage
    assert sorted(stage["ranks"]) == ["0", "1"] and set(stage["ranks"].values()) == workers, (stage, workers)

    # every JVM of the cluster maps the image's class-data archive of Spark's classes (docker/class_archive.py): the
    # master, the workers, the Connect server (a driver) and its executors, one on each worker; and each runs with the
    # tier's JIT options (tests/docker/jvm-options.yml), which reach each kind of JVM by another road
    jvms = {c: cluster.jvms(c) for c in cluster.containers("spark-master") + cluster.containers("spark-worker")
            + [container]}
    assert sorted(main for found in jvms.values() for main, _, _ in found) == sorted(
        ["Master", "Worker", "Worker", "SparkSubmit", "CoarseGrainedExecutorBackend", "CoarseGrainedExecutorBackend"]), jvms
    assert all(mapped for found in jvms.values() for _, mapped, _ in found), jvms
    assert all(c1 for found in jvms.values() for _, _, c1 in found), jvms


def _seconds(stamp: str) -> float:
    """A Docker timestamp ("2026-12-03T16:48:27.797313624Z": nanoseconds) as seconds since the epoch."""
    from datetime import datetime, timezone

    return datetime.strptime(stamp[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def test_a_healthy_cluster_is_checked_about_every_22_s_not_every_interval(cluster):
    """docker/health.py: a check that follows a healthy one sleeps 20 s before it looks, so the master and the
    workers, healthy since the first test, ran one check every 2 s plus 20 (not every 2 s: 9.4 CPU-seconds a minute
    on an idle cluster, docs/benchmarks.md). Docker keeps each container's last 5 checks."""
    containers = cluster.containers("spark-master") + cluster.containers("spark-worker")
    assert len(containers) == 3
    deadline = time.time() + 150  # run alone, the cluster is new: 4 healthy checks take about 70 s
    for container in containers:
        while True:
            log = cluster.inspect(container)["State"]["Health"]["Log"]
            if len(log) >= 4 and all(e["ExitCode"] == 0 for e in log[-4:]):
                break
            assert time.time() < deadline, (container, log)
            time.sleep(2)
        # each of the last 3 followed a healthy check: it slept 20 s, then looked (the next starts 2 s after its end)
        took = [_seconds(e["End"]) - _seconds(e["Start"]) for e in log[-3:]]
        assert all(t >= 20 for t in took), (container, took, log)


def test_down_v_leaves_nothing_behind(cluster):
    assert cluster.leftovers()["containers"], "the cluster is up before down -v"
    cluster.down()
    left = cluster.leftovers()
    assert left == {"containers": [], "networks": [], "volumes": []}, left
