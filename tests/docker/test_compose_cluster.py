"""The compose cluster (docker/docker-compose.yml, with its shared /shared volume) on the image: a master
and 2 workers of 1 core. The digits main job trains on it, TFPredictor on it equals ``net.forward``, job
exit codes reach the host, and ``down -v`` leaves nothing behind. The tests run in file order on one
cluster; the last one removes it. (The run that survives a killed worker container is in
test_no_shared_disk_cluster.py, on a cluster that shares no disk.)"""

import json
import re
import time

import numpy as np
import pytest

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


def test_down_v_leaves_nothing_behind(cluster):
    assert cluster.leftovers()["containers"], "the cluster is up before down -v"
    cluster.down()
    left = cluster.leftovers()
    assert left == {"containers": [], "networks": [], "volumes": []}, left
