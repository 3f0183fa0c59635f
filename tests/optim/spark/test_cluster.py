"""Distributed fine-tuning on a real Spark standalone cluster: a master and two workers of one core each, started
through docker/entrypoint.sh, with decommission on (the session's, shared with test_elastic.py:
:mod:`tests.cluster_fixture`; each test starts from two free workers). A worker is killed mid-training; the run
retries from the newest checkpoint on a replacement worker and finishes. Both training tests run with dynamic
allocation on, as EMR and Dataproc run it (Spark refuses a barrier stage then: SPARK-24942): with ``minExecutors=2``
(executors there from the start) and ``minExecutors=0`` (none until the stage's tasks are pending). Last, a worker is
decommissioned (SIGPWR, as a spot reclaim or a scale-down sends it): the ranks checkpoint at the next step and the run
goes on with the rank that stays, from that step: no retry, no step done twice, though the run checkpoints only at
epoch ends."""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests import digits
from tests.cluster import ROOT
from tests.console_checks import assert_each_action_printed_its_own_output
from tests.elastic_checks import checkpoint_digest, data_fingerprint, epoch_infos, stitched_epochs

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

# the driver's session on the cluster and the digits CNN over 1,024 rows in 2 partitions (no shuffle: the same rows in
# the same order in any session), the launcher checking for lost slots and decommission notices every 0.5 s;
# <SETTINGS>: the test's own session settings (lines of ``.config(...)``)
SESSION_AND_DATA = """
    import json, os, sys
    sys.path.insert(0, {root!r})
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master({url!r}).appName("tfnet-cluster-test")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "1g").config("spark.executor.cores", "1")
             .config("spark.tfnet.slotCheckInterval", "0.5s").config("spark.tfnet.elastic.growCheckInterval", "0.5s")
<SETTINGS>
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2").getOrCreate())
    import optim
    from optim import TFDataset, TFOptimizer
    from tests import digits
    from tfnet import TFNet
    x, y = digits.load()
    df = digits.frame(spark, x, y)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={{"pixels": (8, 8, 1)}})
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.Adam(0.005), metrics=["accuracy"], model_dir={model_dir!r})
"""


def driver_script(settings: str, body: str) -> str:
    """The driver's source: :data:`SESSION_AND_DATA` with ``settings``, then ``body`` (indented as it is)."""
    return textwrap.dedent(SESSION_AND_DATA.replace("<SETTINGS>", settings.strip("\n")) + body)


DRIVER = driver_script("""
             .config("spark.dynamicAllocation.enabled", "true")
             .config("spark.dynamicAllocation.shuffleTracking.enabled", "true")
             .config("spark.dynamicAllocation.minExecutors", {min_executors!r})
             .config("spark.dynamicAllocation.executorIdleTimeout", "600s")
""", """
    assert spark.sparkContext.getConf().get("spark.dynamicAllocation.enabled") == "true"
    executors_before = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # less the driver
    history = opt.optimize(data, epochs={epochs}, batch_size=32, num_workers=2, checkpoint_every=8, verbose=2,
                           timeout=60, max_retries=2)
    import numpy as np
    np.savez({model_dir!r} + "-weights.npz", **opt.net.get_weights())
    # TFPredictor in the same application, on the executors the allocation gives it
    from optim import TFPredictor
    scored = TFPredictor(opt.net, batch_per_thread=32).predict(df.limit(40), feature_cols="pixels").collect()
    want = opt.net.forward(np.stack([np.asarray(r["pixels"], np.float32).reshape(8, 8, 1) for r in scored]))
    got = np.stack([np.asarray(r["output"], np.float32) for r in scored])
    print("RESULT " + json.dumps({{"step": opt.global_step, "last_run": opt.last_run, "history": history,
                                  "executors_before": executors_before,
                                  "predict_max_diff": float(np.max(np.abs(got - want))), "scored": len(scored)}}),
          flush=True)
    if {actions}:  # every action a user runs on what TFPredictor returns, then spark.stop() (issue 56)
        pred = TFPredictor(opt.net, batch_per_thread=32).predict(df, feature_cols="pixels")
        out_dir = {model_dir!r} + "-scored"
        actions = {{"first": lambda d: d.first() is not None, "take": lambda d: len(d.take(3)),
                   "head": lambda d: len(d.head(2)), "show": lambda d: d.select("label").show(2),
                   "limit.collect": lambda d: len(d.limit(4).collect()), "toPandas": lambda d: len(d.toPandas()),
                   "count": lambda d: d.count(), "write": lambda d: d.write.parquet(out_dir) or "written"}}
        for name, action in actions.items():
            print(f"<<ACTION {{name}}>>", flush=True)
            print(f"{{name}} ->", action(pred), flush=True)
        print("<<ACTIONS END>>", flush=True)
        spark.stop()
        print("<<STOPPED>>", flush=True)
""")


def run_driver(cluster, model_dir, min_executors, epochs, actions=False):
    """The driver; with ``actions``, its stderr (the JVM's console included) goes with its stdout, in order."""
    script = DRIVER.format(root=ROOT, url=cluster.url, model_dir=model_dir, min_executors=str(min_executors),
                           epochs=epochs, actions=actions)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if actions else subprocess.PIPE, text=True, cwd=ROOT)


def result_of(out, err):
    result = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert result, err[-4000:]
    return json.loads(result[0][len("RESULT "):])


def test_entrypoint_submit_runs_the_resnet50_job(cluster, tmp_path):
    """The cluster image's three roles, outside Docker: master, 2 workers, and `submit`, which runs
    the ResNet-50 job (tiny synthetic images) against them, with a small frozen CNN as its ``--frozen-graph``: the
    roles and the job's road are what this test checks (the job's own ResNet-50 trains in
    tests/examples/test_resnet50_example.py; its first step costs about 15 CPU-s on Zen 3, benchmarks/bench_first_step.py)."""
    from tests.models import small_cnn
    from tfnet import TFNet

    net = TFNet.from_keras(small_cnn((32, 32, 3), classes=10))
    pb = tmp_path / "cnn.pb"
    pb.write_bytes(net.frozen_graph_def().SerializeToString())
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "docker", "entrypoint.sh"), "submit", "--mode", "train", "--synthetic",
         "--frozen-graph", str(pb), "--input-name", net.input_names[0], "--output-name", net.output_names[0],
         "--from-logits", "--image-size", "32", "--classes", "10", "--num-workers", "2", "--batch-size", "4",
         "--steps-per-epoch", "2", "--epochs", "1", "--model-dir", str(tmp_path / "model"),
         "--output", str(out), "--verbose", "0"],
        env=cluster._env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["num_workers"] == 2 and results["train"]["steps"] == 2
    assert results["train"]["img_per_sec"] > 0
    assert "img/s" in proc.stdout or "throughput" in proc.stdout
    assert os.path.exists(tmp_path / "model" / "export" / "frozen_inference_graph.pb")


def test_with_dynamic_allocation_from_no_executors_the_run_trains_and_predicts(cluster, spark, tmp_path):
    """``minExecutors=0``: no executor until the training stage's tasks are pending; the stage runs without barrier
    mode, its two ranks meet in the driver's store, and the run trains in one attempt, to the weights of the same run
    with dynamic allocation off (a barrier stage on ``local[2]``: same ranks, rows and seed); TFPredictor follows, and
    each action on its result prints its own output only."""
    driver = run_driver(cluster, str(tmp_path / "run"), 0, 3, actions=True)
    try:
        out, _ = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    err = out  # one stream
    res = result_of(out, err)
    assert res["executors_before"] == 0, res["executors_before"]
    run = res["last_run"]
    assert run["states"] == ["starting", "running", "finished"] and run["attempts"] == 1, run
    assert res["step"] == 3 * 32 and run["rows"] == [512, 512], run
    assert res["history"]["accuracy"][-1] > 0.9, res["history"]
    assert res["scored"] == 40 and res["predict_max_diff"] < 1e-5, res
    assert "SPARK-24942" not in err and "Traceback" not in err, err[-3000:]
    assert_each_action_printed_its_own_output(out, 8)
    # the same run with dynamic allocation off: the barrier stage, in this process's local[2] session
    import numpy as np

    import optim
    from optim import TFDataset, TFOptimizer
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    df = digits.frame(spark, x, y)
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.Adam(0.005), metrics=["accuracy"], model_dir=str(tmp_path / "off"))
    opt.optimize(TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)}), epochs=3,
                 batch_size=32, num_workers=2, checkpoint_every=8, verbose=0)
    assert opt.last_run["barrier"] is True and opt.global_step == res["step"]
    on = np.load(tmp_path / "run-weights.npz")
    for name, w in opt.net.get_weights().items():
        np.testing.assert_array_equal(on[name], w, err_msg=name)


def test_standalone_cluster_survives_a_killed_worker(cluster, tmp_path):
    """With dynamic allocation on (``minExecutors=2``): the lost rank's task is one Spark would run again alone;
    the driver ends the stage instead and retries it whole, from the newest checkpoint."""
    model_dir = str(tmp_path / "run")
    kept = tmp_path / "kept"  # a hard link to each checkpoint as it lands (the run keeps only its newest 3)
    kept.mkdir()
    done = threading.Event()

    def keep():
        while not done.wait(0.02):
            for path in glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz")):
                try:
                    os.link(path, kept / os.path.basename(path))
                except OSError:  # linked already, or pruned in between
                    pass

    keeper = threading.Thread(target=keep, daemon=True)
    keeper.start()
    driver = run_driver(cluster, model_dir, 2, 6)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz")):
            assert driver.poll() is None, driver.communicate()[1][-3000:]
            time.sleep(0.2)
        assert glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz")), "training started"
        cluster.kill_worker(cluster.newest())  # the worker JVM, its executor and its Python workers
        cluster.add_worker()  # what a cluster manager would do
        out, err = driver.communicate(timeout=600)
    finally:
        done.set()
        if driver.poll() is None:
            driver.kill()
    keeper.join(5)
    res = result_of(out, err)
    assert res["last_run"]["attempts"] == 2, res
    assert res["last_run"]["states"] == ["starting", "running", "retrying", "running", "finished"], res["last_run"]
    assert res["step"] == 6 * 32  # 1024 rows, 16 per rank per step: 32 steps per epoch
    # the retry resumed from a checkpoint of this run (a restart from step 0 would start at 0)
    assert res["last_run"]["attempt_log"][-1]["start_step"] >= 8, res["last_run"]["attempt_log"]
    assert res["last_run"]["run_id"] in res["last_run"]["resumed_from"]
    # ... from exactly what that checkpoint holds: the weights and optimiser state the retry started with (its rank 0's
    # digest) are the file's, bit for bit
    retry = res["last_run"]["attempt_log"][-1]
    assert retry["start_sha256"] == checkpoint_digest(str(kept / os.path.basename(retry["resumed_from"]))), retry
    assert len(res["history"]["loss"]) == 6
    assert res["history"]["accuracy"][-1] > 0.8
    assert res["scored"] == 40 and res["predict_max_diff"] < 1e-5, res


DECOMMISSION_DRIVER = driver_script("""
             .config("spark.decommission.enabled", "true").config("spark.tfnet.noticeCheckInterval", "1ms")
""", """
    import keras

    class HoldAtStep(keras.callbacks.Callback):
        # rank 0, after step 40 (batch 8 of the second epoch): says so in a file, then waits for the driver's notice,
        # so that the ranks stop inside an epoch (asked after every step: spark.tfnet.noticeCheckInterval)
        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch, logs=None):
            import glob, time
            self.steps += 1
            marker = os.path.join({model_dir!r}, "at-step-40")
            if self.steps == 40 and not os.path.exists(marker):  # the first attempt's step 40 only
                open(marker, "w").close()
                deadline = time.time() + 120
                while time.time() < deadline and not glob.glob(os.path.join({model_dir!r}, "control", "*", "notice")):
                    time.sleep(0.05)

    history = opt.optimize(data, epochs={epochs}, batch_size=32, num_workers=2, min_workers=1, elastic_wait=1,
                           checkpoint_every=100000, verbose=0, timeout=60, max_retries=0, callbacks=[HoldAtStep()])
    print("RESULT " + json.dumps({{"step": opt.global_step, "last_run": opt.last_run, "history": history}}), flush=True)
""")


def test_a_decommissioned_worker_is_a_planned_shrink_from_the_step_of_the_notice(cluster, tmp_path):
    """The newest of the two workers is decommissioned while rank 0 holds after step 40, inside the second epoch."""
    model_dir = str(tmp_path / "run")
    epochs = 12  # 1024 rows, 16 per rank per step: 32 steps per epoch
    script = DECOMMISSION_DRIVER.format(root=ROOT, url=cluster.url, model_dir=model_dir, epochs=epochs)
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not os.path.exists(os.path.join(model_dir, "at-step-40")):
            assert driver.poll() is None, driver.communicate()[1][-3000:]
            time.sleep(0.2)
        assert glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz")), "the first epoch's checkpoint"
        os.kill(cluster.workers[cluster.newest()].pid, signal.SIGPWR)  # the worker's JVM (entrypoint.sh execs it)
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
    # each row of every epoch once, the interrupted one included: its batches before the notice's checkpoint on two
    # ranks, the rest on one rank that took both ranks' shards (optim.data.virtual_shards)
    x, y = digits.load()
    want = data_fingerprint(x[:1024], y[:1024])
    assert second["start_step"] == 40, second  # batch 8 of the second epoch: the rank held there until the notice
    stitched = stitched_epochs(epoch_infos(model_dir), 32)
    assert sorted(e for _, e in stitched) == list(range(epochs)), sorted(stitched)
    assert (1, 1) in stitched, sorted(stitched)  # the interrupted epoch, stitched: 8 batches on 2 ranks, 24 on 1
    for key, got in stitched.items():
        assert got == want, (key, got, want)

