"""Elastic training (issue 31): a run goes on with fewer ranks when a worker is lost and not replaced,
grows back when one returns, and fails with a typed error, within its bound, when fewer than
``min_workers`` slots are left; from a classic session and from a Spark Connect client. A real Spark
standalone cluster (a master and two one-core workers, started through docker/entrypoint.sh: the session's, shared
with test_cluster.py, :mod:`tests.cluster_fixture`; each test starts from two free workers) and a user's driver script
in a process of its own (:mod:`tests.optim.spark.elastic_driver`)."""

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from optim.errors import DistributedTrainingError
from optim.launch.elastic import ElasticPolicy, membership
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.cluster import ROOT
from tests.connect_server import ConnectServer
from tests.elastic_checks import (
    checkpoint_digest,
    data_fingerprint,
    epoch_done,
    epoch_infos,
    same_checkpoints,
    stitched_epochs,
)

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


def start(cluster, model_dir, epochs, min_workers, wait, sleep, *options, url=None, stderr=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests.optim.spark.elastic_driver", url or cluster.url, model_dir, str(epochs),
           str(min_workers), str(wait), str(sleep), *options]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr or subprocess.PIPE, text=True,
                            env=dict(os.environ, PYSPARK_PYTHON=sys.executable))


def wait_for(what, ok, driver, timeout=420):
    deadline = time.time() + timeout
    while not ok():
        if driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver ended before {what}:\n{out[-2000:]}\n{(err or '')[-4000:]}")
        if time.time() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.3)


def checkpointed(model_dir):
    return lambda: bool(glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz")))


def epoch_written(model_dir, attempt, epoch, ranks):
    """Every rank of ``attempt`` has written its tally of the whole ``epoch`` (it does so as the next epoch starts,
    after the epoch's checkpoint; a tally written at a checkpoint inside it holds part of it): the run is past an epoch
    boundary."""
    def ok():
        infos = epoch_infos(model_dir)
        return sum(1 for i in infos if i["attempt"] == attempt and epoch_done(i, epoch, STEPS_PER_EPOCH)) >= ranks
    return ok


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
    err = err or ""
    lines = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
             if line.split(" ", 1)[0] in ("RESULT", "RESULT_ERROR", "THEN", "THEN_ERROR", "RESUMED", "REFERENCE")}
    assert lines, out[-2000:] + err[-5000:]
    return lines, err


def checkpoints(model_dir, run_id):
    """``{step: path}`` of a run's checkpoints."""
    return {int(os.path.basename(p)[5:14]): p for p in glob.glob(os.path.join(model_dir, "checkpoints", run_id,
                                                                              "ckpt-*.npz"))}


def every_checkpoint_loads(model_dir):
    paths = glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz"))
    assert paths
    for path in paths:
        CheckpointManager.load(path)  # raises CheckpointError on a torn or corrupt file
    return len(paths)


def assert_resumed_bit_for_bit(run):
    """Every attempt that resumed from a checkpoint (a shrink, a growth, a retry) started from exactly what that
    checkpoint holds: its weights and optimiser state, bit for bit (the digest of what the attempt held, recorded by
    its rank 0, against the digest of the file computed here)."""
    resumed = [a for a in run["attempt_log"] if a.get("ok") and a.get("resumed_from")]
    assert resumed, run["attempt_log"]
    for a in resumed:
        assert a["start_sha256"] == checkpoint_digest(a["resumed_from"]), a
    return resumed


def assert_every_row_once_per_epoch(model_dir, last_attempt, epochs, shrink_step):
    """Each epoch took each of the 1,024 rows exactly once: before the shrink on two ranks (epoch 0 at least), and
    after it on one, the epoch it resumed in included (stitched: its batches before the checkpoint on two ranks, the
    rest on one rank that took both ranks' shards: optim.data.virtual_shards)."""
    x, y = digits.load()
    want = data_fingerprint(x[:1024], y[:1024])
    stitched = stitched_epochs(epoch_infos(model_dir), STEPS_PER_EPOCH)
    assert (0, 0) in stitched, sorted(stitched)
    after = sorted(e for a, e in stitched if a == last_attempt)
    assert after == list(range(shrink_step // STEPS_PER_EPOCH, epochs)), (shrink_step, sorted(stitched))
    for key, got in stitched.items():
        assert got == want, (key, got, want)


@pytest.mark.spark
@pytest.mark.parallel
@pytest.mark.slow
def test_a_lost_worker_that_does_not_come_back_shrinks_the_run_of_a_connect_client(tmp_path, cluster):
    """From a Spark Connect client of a server on the cluster (the grow test below covers a classic
    session): the client cannot count slots, so the launcher's probe measures the free ones. The shrunk run starts
    from its checkpoint bit for bit, takes every row once per epoch on two ranks and then on one, and equals, step
    for step, an uninterrupted one-rank run from the same checkpoint."""
    model_dir = str(tmp_path / "elastic")
    server = ConnectServer(master=cluster.url, conf={
        "spark.executor.memory": "1g", "spark.executor.cores": "1",
        "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2"}).start()
    try:
        # elastic_wait 2 s: the probe of the slots left (one wave of two 1 s tasks on the one slot) sees 1
        driver = start(cluster, model_dir, 12, 1, 2, 0.0, "--reference", url=server.url)
        wait_for("the first epoch on both ranks", epoch_written(model_dir, 0, 0, 2), driver)
        cluster.kill_worker(cluster.newest())  # its executor and its Python workers; no replacement
        lines, err = finish(driver)
    finally:
        server.stop()
    assert "RESULT" in lines, (lines, err[-4000:])
    res = lines["RESULT"]
    run = res["last_run"]
    assert [m["ranks"] for m in run["membership"]] == [2, 1], run["membership"]
    shrink = run["membership"][1]["step"]
    assert shrink >= STEPS_PER_EPOCH, "the smaller run went on from a checkpoint after the first epoch, not from step 0"
    assert run["states"] == ["starting", "running", "retrying", "shrinking", "running", "finished"], run["states"]
    assert run["num_workers"] == 1 and res["step"] == 12 * STEPS_PER_EPOCH
    assert len(res["history"]["loss"]) == 12
    assert "goes on with 1 rank(s)" in err
    # the shrunk attempt started from its checkpoint, weights and Adam's moments, bit for bit
    (shrunk,) = assert_resumed_bit_for_bit(run)
    assert shrunk["start_step"] == shrink and run["rows"] == [1024], run["rows"]
    assert_every_row_once_per_epoch(model_dir, shrunk["attempt"], 12, shrink)
    # and it equals, checkpoint by checkpoint, an uninterrupted one-rank run from that checkpoint
    ref = lines["REFERENCE"]
    assert ref["last_run"]["attempts"] == 1 and ref["last_run"]["resumed_from"] == shrunk["resumed_from"]
    steps = same_checkpoints(checkpoints(model_dir, run["run_id"]),
                             checkpoints(model_dir + "-reference", ref["last_run"]["run_id"]), shrink)
    assert steps == list(range(shrink + 8, 12 * STEPS_PER_EPOCH + 1, 8)), steps
    assert ref["history"] == res["history"]
    # an unbroken run of this length reaches 0.9 (the run without min_workers reached 0.928 to 0.959 on the 773
    # held-out rows here, the shrunk ones 0.946 to 0.952)
    assert res["held_out"] >= 0.9, res["held_out"]
    assert every_checkpoint_loads(model_dir) == 12 * STEPS_PER_EPOCH // 8


@pytest.mark.spark
@pytest.mark.parallel
@pytest.mark.slow
def test_the_run_grows_back_when_a_worker_returns_and_min_workers_out_of_reach_is_a_typed_error(tmp_path, cluster):
    """A classic session: the run shrinks to 1 rank when a worker is lost and grows back to 2 when one is
    added; each change starts from its checkpoint bit for bit, and every epoch takes every row once. Then, in the
    same application, a run with ``min_workers=2`` loses a worker: a typed error after ``elastic_wait`` (5 s, measured
    from the loss), naming the slots seen, and a resume of that run finishes it on the slot left. Last, a driver is
    killed while its run waits to shrink: a new driver with ``resume=True`` finishes the run. (One cluster, the
    session's: the suite's time.)"""
    model_dir, then_dir, killed_dir = str(tmp_path / "elastic"), str(tmp_path / "then"), str(tmp_path / "killed")
    epochs = 10
    # 100 ms more per step until the run has grown back: the smaller run lasts long enough for a worker to come back
    # (with 20 ms a step it trained its 15 epochs in 16 s, before the new worker's executor had registered); after
    # that, the run's last epochs at full speed
    driver = start(cluster, model_dir, epochs, 1, 5, 0.1, "--then", then_dir)
    wait_for("the first epoch on both ranks", epoch_written(model_dir, 0, 0, 2), driver)
    cluster.kill_worker(cluster.newest())
    wait_for("the run on 1 rank", running_on(model_dir, 1), driver)
    cluster.add_worker()  # what a cluster manager does, later
    wait_for("the run on 2 ranks again", running_on(model_dir, 2), driver)
    os.remove(model_dir + ".pace")
    wait_for("a checkpoint of the second run", checkpointed(then_dir), driver)
    cluster.kill_worker(cluster.newest())  # the worker that came back
    t_lost = time.time()
    lines, err = finish(driver)

    # the driver killed while its run waits for the lost slot (elastic_wait 60 s): a new driver resumes the run
    cluster.free_workers(2)
    log = tmp_path / "killed-driver.log"
    with open(log, "w") as stderr:
        first = start(cluster, killed_dir, 2, 1, 60, 0.0, stderr=stderr)
        wait_for("the first epoch of the run", epoch_written(killed_dir, 0, 0, 2), first)
        cluster.kill_worker(cluster.newest())
        wait_for("the retry", lambda: "retrying from this run's newest checkpoint" in log.read_text(), first)
        first.kill()
        first.wait(30)
    cluster.add_worker()  # a replacement: the new driver's run need not wait out slot_wait for the lost slot
    second = start(cluster, killed_dir, 2, 1, 5, 0.0, "--resume")
    again, again_err = finish(second)
    assert "RESULT" in lines, (lines, err[-4000:])
    res = lines["RESULT"]
    run = res["last_run"]
    members = run["membership"]
    assert [m["ranks"] for m in members] == [2, 1, 2], (members, run["attempt_log"], err[-6000:])
    steps = [m["step"] for m in members]
    assert STEPS_PER_EPOCH <= steps[1] < steps[2] and steps[2] % STEPS_PER_EPOCH == 0, members  # grew at an epoch end
    assert res["step"] == epochs * STEPS_PER_EPOCH and len(res["history"]["loss"]) == epochs
    assert run["num_workers"] == 2 and run["attempts"] == 2, run
    # every path of the run, as the launcher's states went (optim.launch.states)
    assert run["states"] == ["starting", "running", "retrying", "shrinking", "running", "growing", "running",
                             "finished"], run["states"]
    assert "grows to 2 ranks at the next epoch boundary" in err
    # the shrink waited elastic_wait (5 s) from the failure for the lost slot, on the driver's clock
    log_ = run["attempt_log"]
    assert log_[1]["started_s"] - log_[0]["ended_s"] >= 5, log_
    # the shrink and the growth each started from their checkpoint, bit for bit; every whole epoch took every row once
    shrunk, grown = assert_resumed_bit_for_bit(run)
    assert (shrunk["ranks"], grown["ranks"]) == (1, 2) and grown["start_step"] == steps[2]
    x, y = digits.load()
    want = data_fingerprint(x[:1024], y[:1024])
    # every epoch, the one the shrink interrupted included, each row once (stitched across the resume)
    whole = stitched_epochs(epoch_infos(model_dir), STEPS_PER_EPOCH)
    assert sorted({e for _, e in whole}) == list(range(epochs)), sorted(whole)
    assert all(got == want for got in whole.values()), whole
    assert every_checkpoint_loads(model_dir) >= epochs * STEPS_PER_EPOCH // 8

    # min_workers out of reach: the typed error, after elastic_wait measured from the loss (not read from a message)
    assert "THEN_ERROR" in lines, (lines, err[-4000:])
    assert lines["THEN_ERROR"]["type"] == "DistributedTrainingError"
    assert "offered 1 task slot(s) within 5 s (elastic_wait), fewer than min_workers=2" in lines["THEN_ERROR"]["message"]
    waited = lines["THEN_ERROR"]["time"] - t_lost
    assert 5 <= waited < 5 + 60, waited  # elastic_wait, plus Spark noticing a killed worker (seconds)
    # ... and its last good checkpoint resumes: the run finishes its 6 epochs on the slot left
    resumed = lines["RESUMED"]
    assert resumed["step"] == 6 * STEPS_PER_EPOCH and resumed["last_run"]["num_workers"] == 1
    assert os.path.dirname(os.path.dirname(resumed["last_run"]["resumed_from"])) == os.path.join(then_dir, "checkpoints")
    assert_resumed_bit_for_bit(resumed["last_run"])

    # the killed driver's run, finished by a new driver from its newest checkpoint
    assert "RESULT" in again, (again, again_err[-4000:])
    after = again["RESULT"]
    assert after["step"] == 2 * STEPS_PER_EPOCH and after["last_run"]["resumed_from"], after["last_run"]
    first_run = [r for r in os.listdir(os.path.join(killed_dir, "checkpoints")) if r != after["last_run"]["run_id"]]
    assert len(first_run) == 1 and f"/checkpoints/{first_run[0]}/" in after["last_run"]["resumed_from"]
    assert_resumed_bit_for_bit(after["last_run"])
    every_checkpoint_loads(killed_dir)
