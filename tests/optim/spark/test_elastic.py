"""Elastic training (issue 31): a run goes on with fewer ranks when a worker is lost and not replaced,
grows back when one returns, and fails with a typed error, within its bound, when fewer than
``min_workers`` slots are left; from a classic session and from a Spark Connect client. A real Spark
standalone cluster (a master and two one-core workers,
started through docker/entrypoint.sh) and a user's driver script in a process of its own
(:mod:`tests.optim.spark.elastic_driver`)."""

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from optim.errors import DistributedTrainingError
from optim.spark.driver.elastic import ElasticPolicy, membership
from tests.cluster import ROOT, StandaloneCluster
from tests.connect_server import ConnectServer

STEPS_PER_EPOCH = 1024 // 32  # global batch 32, whatever the ranks


def test_the_rank_count_keeps_the_global_batch_whole():
    policy = ElasticPolicy(num_workers=4, min_workers=1)
    assert [policy.ranks_for(s, 32) for s in (4, 3, 2, 1, 9)] == [4, 2, 2, 1, 4]
    assert ElasticPolicy(4, 1).ranks_for(3, 48) == 3 and ElasticPolicy(4, 1).ranks_for(3, None) == 3
    assert policy.should_grow(running=2, slots=4) and not policy.should_grow(running=2, slots=3)
    with pytest.raises(DistributedTrainingError, match=r"offered 1 task slot\(s\) within 60 s \(elastic_wait\), "
                                                      r"fewer than min_workers=2"):
        ElasticPolicy(4, 2).ranks_for(1, 32)
    with pytest.raises(DistributedTrainingError, match=r"no rank count from min_workers=3 to 3 .* batch of 32"):
        ElasticPolicy(4, 3).ranks_for(3, 32)
    with pytest.raises(ValueError, match=r"`min_workers` must be an integer from 1 to num_workers=2. Received: "
                                         r"min_workers=3"):
        ElasticPolicy(2, 3)
    assert membership([(0, 2), (8, 2), (8, 1), (96, 2)]) == [{"step": 0, "ranks": 2}, {"step": 8, "ranks": 1},
                                                             {"step": 96, "ranks": 2}]


def start(cluster, model_dir, epochs, min_workers, wait, sleep, then=None, url=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests.optim.spark.elastic_driver", url or cluster.url, model_dir, str(epochs),
           str(min_workers), str(wait), str(sleep)] + ([then] if then else [])
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYSPARK_PYTHON=sys.executable))


def wait_for(what, ok, driver, timeout=420):
    deadline = time.time() + timeout
    while not ok():
        if driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver ended before {what}:\n{out[-2000:]}\n{err[-4000:]}")
        if time.time() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.3)


def checkpointed(model_dir):
    return lambda: bool(glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz")))


def running_on(model_dir, size):
    """Rank 0 of a later attempt reports ``size`` ranks."""
    def ok():
        for path in glob.glob(os.path.join(model_dir, "ranks", "*", "rank-0.json")):
            try:
                info = json.load(open(path))
            except (OSError, ValueError):
                return False
            if info.get("attempt", 0) >= 1 and info.get("size") == size:
                return True
        return False
    return ok


def finish(driver, timeout=900):
    try:
        out, err = driver.communicate(timeout=timeout)
    finally:
        if driver.poll() is None:
            driver.kill()
    lines = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
             if line.split(" ", 1)[0] in ("RESULT", "RESULT_ERROR", "THEN", "THEN_ERROR")}
    assert lines, out[-2000:] + err[-5000:]
    return lines, err


@pytest.mark.spark
@pytest.mark.parallel
@pytest.mark.slow
def test_a_lost_worker_that_does_not_come_back_shrinks_the_run_of_a_connect_client(tmp_path):
    """From a Spark Connect client of a server on the cluster (the grow test below covers a classic
    session): the client cannot count slots, so the launcher's probe measures the free ones."""
    model_dir = str(tmp_path / "elastic")
    with StandaloneCluster(workers=2, cores=1) as cluster:
        server = ConnectServer(master=cluster.url, conf={
            "spark.executor.memory": "1g", "spark.executor.cores": "1",
            "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2"}).start()
        try:
            driver = start(cluster, model_dir, epochs=12, min_workers=1, wait=5, sleep=0.0, url=server.url)
            wait_for("a checkpoint of the elastic run", checkpointed(model_dir), driver)
            cluster.kill_worker(1)  # its executor and its Python workers; no replacement
            lines, err = finish(driver)
        finally:
            server.stop()
    assert "RESULT" in lines, (lines, err[-4000:])
    res = lines["RESULT"]
    run = res["last_run"]
    assert [m["ranks"] for m in run["membership"]] == [2, 1], run["membership"]
    assert run["membership"][1]["step"] > 0, "the smaller run went on from a checkpoint, not from step 0"
    assert run["states"] == ["starting", "running", "retrying", "shrinking", "running", "finished"], run["states"]
    assert run["num_workers"] == 1 and res["step"] == 12 * STEPS_PER_EPOCH
    assert len(res["history"]["loss"]) == 12
    assert "goes on with 1 rank(s)" in err
    # the same arithmetic (the global batch whole), but one shard's order after the shrink instead of two,
    # as another seed gives: the same run without min_workers reached 0.928 to 0.959 on the 773 held-out
    # rows here, the shrunk ones 0.946 to 0.952; an unbroken run of this length reaches 0.9
    assert res["held_out"] >= 0.9, res["held_out"]


@pytest.mark.spark
@pytest.mark.parallel
@pytest.mark.slow
def test_the_run_grows_back_when_a_worker_returns_and_min_workers_out_of_reach_is_a_typed_error(tmp_path):
    """A classic session: the run shrinks to 1 rank when a worker is lost and grows back to 2 when one is
    added. Then, in the same application, a run with ``min_workers=2`` loses a worker: a typed error
    within ``elastic_wait`` (5 s), naming the slots seen. (Two tests once, one cluster now: the suite's
    time.)"""
    model_dir, then_dir = str(tmp_path / "elastic"), str(tmp_path / "then")
    with StandaloneCluster(workers=2, cores=1) as cluster:
        # 20 ms more per step: the smaller run lasts long enough for a worker to come back
        driver = start(cluster, model_dir, epochs=16, min_workers=1, wait=10, sleep=0.02, then=then_dir)
        wait_for("a checkpoint", checkpointed(model_dir), driver)
        cluster.kill_worker(1)
        wait_for("the run on 1 rank", running_on(model_dir, 1), driver)
        cluster.add_worker()  # what a cluster manager does, later
        wait_for("a checkpoint of the second run", checkpointed(then_dir), driver)
        cluster.kill_worker(2)  # the worker that came back
        lines, err = finish(driver)
    assert "RESULT" in lines, (lines, err[-4000:])
    res = lines["RESULT"]
    members = res["last_run"]["membership"]
    assert [m["ranks"] for m in members] == [2, 1, 2], members
    steps = [m["step"] for m in members]
    assert steps[0] == 0 < steps[1] < steps[2] and steps[2] % STEPS_PER_EPOCH == 0, members  # grew at an epoch end
    assert res["step"] == 16 * STEPS_PER_EPOCH and len(res["history"]["loss"]) == 16
    assert res["last_run"]["num_workers"] == 2 and res["last_run"]["attempts"] == 2, res["last_run"]
    # every path of the run, as the launcher's states went (optim.spark.driver.states)
    assert res["last_run"]["states"] == ["starting", "running", "retrying", "shrinking", "running", "growing",
                                         "running", "finished"], res["last_run"]["states"]
    assert "grows to 2 ranks at the next epoch boundary" in err
    assert "THEN_ERROR" in lines, (lines, err[-4000:])
    assert lines["THEN_ERROR"]["type"] == "DistributedTrainingError"
    assert "offered 1 task slot(s) within 5 s (elastic_wait), fewer than min_workers=2" in lines["THEN_ERROR"]["message"]
