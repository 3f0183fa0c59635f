"""The compose cluster with no shared disk (docker/docker-compose.yml with docker/docker-compose.s3.yml:
each container its own /shared), as on separate hosts: a distributed fine-tuning run on digits keeps its
model_dir on an S3 server (moto, on this host, reached from the containers as host.docker.internal),
loses a `docker kill`ed worker container that does not come back, goes on with one rank from the checkpoint
in the store (``min_workers=1``: elastic training on the compose cluster), and finishes: from that checkpoint bit
for bit, and taking each row once in every epoch it trains whole (issue 42)."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from tests.docker.compose import NO_SHARED_DISK_FILE, Compose, host_address_for_containers, sh

# the first test of a fresh machine also installs Docker, makes the base image, the wheelhouse and the image
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

BUCKET = "tfnet"
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

# A driver of our own, run in a container of the image: only tfnet's public API, digits from scikit-learn.
# No storage_options: the driver and the executors find the endpoint and the keys in their environment.
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
                      optim.Adam(0.005), metrics=["accuracy"], model_dir="MODEL_DIR")
    history = opt.optimize(data, epochs=EPOCHS, batch_size=32, num_workers=2, min_workers=1, elastic_wait=5,
                           checkpoint_every=8, keep_checkpoints=100, verbose=2, timeout=60,
                           max_retries=2)
    print("RESULT " + json.dumps({"step": opt.global_step, "last_run": opt.last_run, "history": history}), flush=True)
""")
EPOCHS = 6
STEPS_PER_EPOCH = 1024 // 32


@pytest.fixture(scope="module")
def s3_server(docker_engine, tmp_path_factory):
    """A moto S3 server on this host's Docker bridge address (what ``host-gateway`` names in the
    containers), on a port the OS picks (read from its banner), with a bucket; yields
    ``(endpoint on the host, endpoint in the containers)``."""
    bridge = host_address_for_containers()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", bridge, "-p", "0"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        endpoint = None
        deadline = time.time() + 60
        while endpoint is None and time.time() < deadline:
            banner = log.read_text(errors="replace")
            assert proc.poll() is None, f"moto_server on {bridge} (the bridge's host address) exited:\n{banner}"
            m = re.search(r"Running on (http://[0-9.]+:(\d+))", banner)
            endpoint = m and (m.group(1), m.group(2))
            time.sleep(0.1)
        assert endpoint, (f"moto_server on {bridge} (the bridge's host address) printed no address within 60 s:\n"
                          f"{log.read_text(errors='replace')}")
        s3_client(endpoint[0]).create_bucket(Bucket=BUCKET)
        yield endpoint[0], f"http://host.docker.internal:{endpoint[1]}"
    finally:
        proc.terminate()
        proc.wait(10)


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"], region_name=KEYS["AWS_DEFAULT_REGION"])


def checkpoint_keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", [])
                  if re.search(r"/ckpt-\d+\.npz$", o["Key"]))


@pytest.fixture(scope="module")
def cluster_without_shared_disk(image_build, s3_server):
    """A master and 2 workers (1 core, 3 GB each) sharing no volume, with the S3 endpoint and dummy
    keys in every container's environment; removed with ``down -v`` at the end of the module."""
    compose = Compose(image_build["image"], worker_cores=1, worker_memory="3g", overrides=(NO_SHARED_DISK_FILE,),
                      env={"AWS_ENDPOINT_URL": s3_server[1], **KEYS})
    try:
        compose.up()
        yield compose
    finally:
        compose.down()


def test_fine_tuning_on_s3_goes_on_with_one_rank_after_a_killed_worker_container(cluster_without_shared_disk,
                                                                                 s3_server, tmp_path):
    from optim.training.checkpoint import CheckpointManager

    cluster, client = cluster_without_shared_disk, s3_client(s3_server[0])
    workers = cluster.containers("spark-worker")
    assert len(workers) == 2
    script = FINE_TUNE.replace("EPOCHS", str(EPOCHS)).replace("MODEL_DIR", f"s3://{BUCKET}/kill/run")
    t0 = time.time()
    driver = cluster.start("submit", "python", "-c", script)
    try:
        deadline = time.time() + 420
        while time.time() < deadline:
            assert driver.poll() is None, driver.communicate()[1][-4000:]
            if checkpoint_keys(client, "kill/run/checkpoints/"):
                break
            time.sleep(1)
        else:
            pytest.fail("no checkpoint in the store within 420 s")
        # the master, both workers and the driver: no volume (or host folder) mounted in two of them
        mounts = {c: [m.get("Name") or m["Source"] for m in cluster.inspect(c)["Mounts"]] for c in cluster.containers()}
        assert len(mounts) == 4, mounts
        sources = [s for ms in mounts.values() for s in ms]
        assert len(sources) == len(set(sources)), mounts
        killed = workers[1]
        sh(["docker", "kill", killed], timeout=60)  # the worker JVM, its executor and its Python workers; no restart
        t_kill = time.time()
        out, err = driver.communicate(timeout=900)
    finally:
        if driver.poll() is None:
            driver.kill()
    seconds = time.time() - t0
    assert driver.returncode == 0, out[-3000:] + err[-4000:]
    result = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert result, err[-4000:]
    res = json.loads(result[0][len("RESULT "):])
    print(f"\nfine-tuning on S3 with a killed worker container: {seconds:.0f} s in all, {time.time() - t_kill:.0f} s "
          f"from the kill to the end; attempts {res['last_run']['attempts']}")
    # the stage lost a task; no slot came back within elastic_wait, so the run went on with one rank from the
    # newest checkpoint in the store
    assert [m["ranks"] for m in res["last_run"]["membership"]] == [2, 1], res["last_run"]
    assert "goes on with 1 rank(s)" in err, err[-3000:]
    assert res["last_run"]["attempt_log"][-1]["start_step"] > 0, "the smaller run resumed, not restarted from step 0"
    assert res["step"] == EPOCHS * STEPS_PER_EPOCH
    assert len(res["history"]["loss"]) == EPOCHS
    assert res["history"]["accuracy"][-1] > 0.8, res["history"]

    # every checkpoint of the run left in the store loads (after a download) and passes its SHA-256 check
    keys = checkpoint_keys(client, f"kill/run/checkpoints/{res['last_run']['run_id']}/")
    assert keys
    steps = []
    for key in keys:
        path = tmp_path / key.rsplit("/", 1)[1]
        client.download_file(BUCKET, key, str(path))
        steps.append(CheckpointManager.load(str(path)).step)
    assert max(steps) == EPOCHS * STEPS_PER_EPOCH, steps
    # the one-rank attempt started from the checkpoint it names, bit for bit (weights and Adam's moments) ...
    from tests import digits
    from tests.elastic_checks import checkpoint_digest, data_fingerprint, full_epochs

    shrunk = res["last_run"]["attempt_log"][-1]
    resumed = tmp_path / "resumed.npz"
    client.download_file(BUCKET, shrunk["resumed_from"][len(f"s3://{BUCKET}/"):], str(resumed))
    assert shrunk["start_sha256"] == checkpoint_digest(str(resumed)), shrunk
    # ... and each epoch it trained whole took each of the 1,024 rows once
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="kill/run/ranks/")
    tallies = [json.loads(client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
               for page in pages for o in page.get("Contents", []) if re.search(r"/epochs-a\d+-r\d+\.json$", o["Key"])]
    whole = full_epochs(tallies, STEPS_PER_EPOCH)
    x, y = digits.load()
    assert any(a == shrunk["attempt"] for a, _ in whole), sorted(whole)
    assert all(v == data_fingerprint(x[:1024], y[:1024]) for v in whole.values()), whole
