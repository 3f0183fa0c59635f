"""model_dir on an object store: a real S3 server (moto in server mode, a separate process on
loopback, port chosen by the OS and read back) and a real local[2] Spark with two Horovod ranks.
Checkpoints, resume after a killed rank, TensorBoard events, the export and Parquet read by the ranks all go
to s3://, through a proxy that injects the store's faults (issue 42: 503 SlowDown, reset connections, answers
stalled past the client's read timeout; :mod:`tests.fault_proxy`): the stack's retries (s3fs's and botocore's,
with back-off, bounded) absorb them, and the run takes no retry for them."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import optim
from optim import TFOptimizer, TFPredictor
from optim.errors import StorageError
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.elastic_checks import checkpoint_digest
from tests.fault_proxy import FaultProxy
from tests.spark_utils import jobs_since, spark_jobs
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 (port 0, read from its banner) with a bucket ``tfnet``;
    yields ``(endpoint, storage_options)`` and sets the driver's AWS_* variables."""
    moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    out = open(log, "wb")
    proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", "0"], stdout=out, stderr=subprocess.STDOUT)
    endpoint = None
    deadline = time.time() + 60
    while time.time() < deadline and endpoint is None:
        m = re.search(r"Running on (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        endpoint = m.group(1) if m else None
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    assert endpoint, log.read_text()
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1")
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="tfnet")
    # the ranks run in Spark's Python workers, started before these variables were set: they get the
    # endpoint and the (dummy) keys through storage_options
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    yield endpoint, options
    proc.terminate()
    proc.wait(10)
    out.close()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def faulty(s3):
    """The S3 server behind :class:`~tests.fault_proxy.FaultProxy`: 5% of requests answered 503 SlowDown, 3% reset,
    1% stalled 2 s; yields the proxy."""
    with FaultProxy(s3[0], slowdown=0.05, reset=0.03, stall=0.01, stall_s=2.0, seed=42) as proxy:
        yield proxy


def _fs(options):
    import s3fs

    return s3fs.S3FileSystem(client_kwargs={"endpoint_url": options["endpoint_url"]}, key="testing", secret="testing",
                             skip_instance_cache=True)


def test_a_run_on_s3_checkpoints_resumes_after_a_kill_and_exports(spark, s3, faulty):
    endpoint, direct = s3
    fs = _fs(direct)
    model_dir = "s3://tfnet/run"
    x, y = digits.load()
    x, y = x[:512], y[:512]
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    # every request of the ranks and the driver through the faults; a stall (2 s) outlasts the read timeout (1 s)
    options = {**direct, "endpoint_url": faulty.endpoint, "config_kwargs": {"read_timeout": 1, "connect_timeout": 1}}
    opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), metrics=["accuracy"], model_dir=model_dir,
                      storage_options=options)
    killed: dict = {}

    def killer():
        deadline = time.time() + 240
        while time.time() < deadline and "pid" not in killed:
            try:
                ckpts = fs.glob("tfnet/run/checkpoints/*/ckpt-*.npz", refresh=True)
                infos = fs.glob("tfnet/run/ranks/*/rank-1.json", refresh=True)
            except OSError:
                ckpts, infos = [], []
            if len(ckpts) >= 2 and infos:
                killed["pid"] = json.loads(fs.cat_file(infos[0]))["pid"]
                os.kill(killed["pid"], signal.SIGKILL)
            time.sleep(0.1)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    with pytest.warns(RuntimeWarning, match="retrying from this run's newest checkpoint"):
        history = opt.optimize((x, y), epochs=3, batch_size=32, num_workers=2, checkpoint_every=4,
                               keep_checkpoints=50, verbose=0, timeout=60)
    thread.join(5)
    assert "pid" in killed, "rank 1 was killed"
    run = opt.last_run
    # one retry, the kill's: none for the store's faults
    assert run["attempts"] == 2 and opt.global_step == 3 * 16 and len(history["loss"]) == 3, run["failures"]
    # resumed from this run's checkpoint in the bucket, not from step 0
    assert run["resumed_from"].startswith(f"s3://tfnet/run/checkpoints/{run['run_id']}/ckpt-")
    assert run["attempt_log"][-1]["start_step"] >= 8
    # ... and from exactly what it holds: the weights and optimiser state the retry started with (its rank 0's digest)
    # are the checkpoint's, bit for bit (not fresh weights, nor the newest checkpoint's by name only)
    assert run["attempt_log"][-1]["start_sha256"] == checkpoint_digest(run["resumed_from"], direct), run["attempt_log"]
    fs.invalidate_cache()
    steps = sorted(int(p[-13:-4]) for p in fs.glob(f"tfnet/run/checkpoints/{run['run_id']}/ckpt-*.npz"))
    assert steps[-1] == 48
    for step in steps:  # whole: a write either lands under its name whole or not at all
        CheckpointManager.load(f"s3://tfnet/run/checkpoints/{run['run_id']}/ckpt-{step:09d}.npz", direct)
    # TensorBoard events in the bucket, readable
    events = fs.glob(f"tfnet/run/tensorboard/{run['run_id']}/train/events.out.tfevents.*")
    assert events
    import tensorflow as tf

    local = os.path.join(str(opt.model_dir).replace("s3://", "/tmp/tfnet-test-"), "ev")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    fs.get(events[-1], local)
    tags = {v.tag for e in tf.compat.v1.train.summary_iterator(local) for v in e.summary.value}
    assert {"loss", "accuracy", "epoch_loss"} <= tags
    assert not fs.glob("tfnet/run/.exchange/*") and not fs.glob("tfnet/run/.tfnet-probe-*")
    # the export (through the faults), and reading it back
    net.save("s3://tfnet/run/export", storage_options=options)
    back = TFNet.load("s3://tfnet/run/export")  # credentials and endpoint from the environment
    for k, w in net.get_weights().items():
        np.testing.assert_array_equal(back.get_weights()[k], w)
    expected = net.forward(x[:64])
    np.testing.assert_allclose(TFPredictor("s3://tfnet/run/export").predict(x[:64]), expected, rtol=1e-6, atol=1e-6)
    df = spark.createDataFrame([(x[i].ravel().tolist(),) for i in range(64)], "pixels array<float>")
    scored = TFPredictor(back).predict(df, feature_cols="pixels").collect()
    np.testing.assert_allclose(np.array([r["output"] for r in scored]), expected, rtol=1e-5, atol=1e-5)
    # Parquet read by the ranks through the faults: the same evaluation as the same rows in memory
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"pixels": pa.array(list(x[:128].reshape(128, -1)), pa.list_(pa.float32())),
                      "label": pa.array(y[:128])})
    pq.write_table(table, "tfnet/parquet/part-0.parquet", row_group_size=32, filesystem=fs)
    parquet = optim.TFDataset.from_parquet("s3://tfnet/parquet", "pixels", "label", feature_shapes={"pixels": (8, 8, 1)},
                                           storage_options=options)
    read = opt.evaluate(parquet, num_workers=2)
    assert read["accuracy"] == opt.evaluate((x[:128], y[:128]))["accuracy"]
    faults = faulty.counts
    print(f"\nthe proxy saw {faults['requests']} requests: {faults['slowdown']} answered 503 SlowDown, {faults['reset']} "
          f"reset, {faults['stall']} stalled past the read timeout")
    assert faults["slowdown"] and faults["reset"] and faults["stall"], faults


def test_a_store_that_keeps_failing_ends_in_a_typed_error_naming_the_file_after_the_retry_bound(s3):
    """Every write answered 503 SlowDown: the run ends in CheckpointError naming the checkpoint, after exactly the
    retries docs/reliability.md bounds them by (s3fs's 5 calls, each botocore's ``total_max_attempts`` requests: 2 here,
    through ``storage_options``), counted at the store's proxy; not a hang."""
    from optim.errors import CheckpointError

    x, y = digits.load()
    with FaultProxy(s3[0], slowdown=1.0, only={"PUT"}) as proxy:
        options = {**s3[1], "endpoint_url": proxy.endpoint,
                   "config_kwargs": {"retries": {"mode": "legacy", "total_max_attempts": 2}}}
        opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.SGD(0.05),
                          model_dir="s3://tfnet/failing", storage_options=options)
        with pytest.raises(CheckpointError, match=r"Cannot write the checkpoint s3://tfnet/failing/checkpoints/"
                                                  r"[^/ ]+/ckpt-000000002\.npz \(") as raised:
            opt.optimize((x[:64], y[:64]), epochs=1, batch_size=32, verbose=0)
    assert "SlowDown" in str(raised.value) or "reduce your request rate" in str(raised.value), raised.value
    import s3fs

    assert s3fs.S3FileSystem.retries == 5  # s3fs's bound (a class attribute: not one of its storage options)
    assert proxy.counts["slowdown"] == 5 * 2, proxy.counts  # the first write, given up after 5 x 2 PUTs


def test_a_model_dir_that_cannot_be_written_fails_before_the_stage(spark, s3, tmp_path):
    endpoint, options = s3
    x, y = digits.load()
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    for model_dir in ("s3://no-such-bucket/run", str(tmp_path / "file" / "run")):
        (tmp_path / "file").write_text("a file, not a folder")
        opt = TFOptimizer(net, SCE, optim.SGD(0.05), model_dir=model_dir, storage_options=options
                          if model_dir.startswith("s3") else None)
        before = spark_jobs(spark)
        with pytest.raises(StorageError, match=rf"model_dir '{re.escape(model_dir)}' cannot be written"):
            opt.optimize((x[:64], y[:64]), batch_size=32, num_workers=2, verbose=0)
        started = jobs_since(spark, before)
        assert not [g for g in started if g.startswith("tfnet-train-")], ("checked before the stage", started)
    assert isinstance(StorageError("x"), OSError) and not StorageError.retryable


def test_driver_memory_is_checked_when_the_model_moves_through_spark(spark):
    from optim.errors import DistributedTrainingError
    from optim.launch.backends.classic import check_driver_memory
    from optim.spark.conf import size_setting

    assert size_setting("1g") == 1 << 30 and size_setting("512m") == 512 << 20 and size_setting("0") is None
    sc = spark.sparkContext
    check_driver_memory(sc, 50 << 20, 100 << 20)  # 150 MB fits a 3 GB driver and a 1 GB result limit
    with pytest.raises(DistributedTrainingError, match=r"rank 0's result \(2048 MiB\) move through the driver.*model_dir"):
        check_driver_memory(sc, 50 << 20, 2 << 30)
