"""Hosts that are not one machine (issues 31 and 42): a Spark standalone cluster whose two workers each run in
a network namespace of their own (own address, loopback and /tmp; a veth to a bridge; links of
1 Gbit/s with 0.2 ms of delay: :mod:`tests.netns`), the master and an S3 server (moto) on a services
host of their own, the driver on the network's root host (this machine's namespace). The ranks reach ``model_dir``
on S3 and the driver's rendezvous over the shaped links, and Gloo connects the ranks over their namespaces'
addresses. One network and cluster for the module (the order matters: the partition is last):

* a lossy, then slow link (5% of what one host sends dropped for an epoch, then 200 ms added to it until a step's
  exchange has crossed it): the run finishes, slower, in one attempt;
* a partition (one host cut off with iptables DROP both ways, mid-run): the run goes on with one rank from its
  checkpoint on S3 within the step timeout + Spark's executor-loss detection + ``elastic_wait`` + a start-up, not a
  whole ``startup_timeout``, and loses nothing: every planned step, every row once per epoch, every checkpoint
  loadable, the shrunk attempt starting from its checkpoint bit for bit."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.cluster import ROOT
from tests.elastic_checks import checkpoint_digest, data_fingerprint, full_epochs
from tests.elastic_checks import epoch_done as trained_whole
from tests.netns import Network
from tests.netns_cluster import NetnsCluster

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

BUCKET = "tfnet"
STEPS_PER_EPOCH = 1024 // 32
#: The rank's step timeout, Spark's worker timeout (executor-loss detection) and elastic_wait of the partition run.
TIMEOUT_S, WORKER_TIMEOUT_S, ELASTIC_WAIT_S = 10, 10, 5
OPTIONS = {"key": "testing", "secret": "testing"}


@pytest.fixture(scope="module")
def cluster():
    import boto3

    with Network(hosts=2, rate="1gbit", delay_ms=0.2, services=True) as net:
        assert net.shaping in ("netem", "tbf+queue")
        for host in net.hosts:  # the hosts reach the subnet and nothing else
            assert net.routes(host) == [r for r in net.routes(host) if r.startswith(str(net.subnet))], net.routes(host)
        net.count_traffic()
        t0 = time.time()
        with NetnsCluster(net, cores=1, worker_timeout_s=WORKER_TIMEOUT_S) as spark_cluster:
            endpoint = spark_cluster.start_s3(BUCKET)
            print(f"\nthe cluster and S3 came up in {time.time() - t0:.0f} s")
            client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                                  aws_secret_access_key="testing", region_name="us-east-1")
            yield net, spark_cluster, endpoint, client


def keys(client, prefix):
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))
    except Exception:  # noqa: BLE001 - the server is busy; ask again
        return []


def infos(client, prefix, pattern):
    """The JSON files under ``prefix`` whose names match ``pattern``."""
    out = []
    for key in keys(client, prefix):
        if re.search(pattern, key):
            try:
                out.append(json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read()))
            except Exception:  # noqa: BLE001 - being rewritten; ask again
                pass
    return out


def rank_infos(client, prefix):
    """``{(attempt, rank): info}`` of every rank file in the store (each rank rewrites its own)."""
    return {(i["attempt"], i["rank"]): i for i in infos(client, prefix + "ranks/", r"/rank-\d+\.json$")}


def epoch_tallies(client, prefix):
    return infos(client, prefix + "ranks/", r"/epochs-a\d+-r\d+\.json$")


def start(spark_cluster, net, endpoint, prefix, epochs, sleep, timeout=60):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.optim.spark.hosts_driver", spark_cluster.url, net.root.address,
         f"s3://{BUCKET}/{prefix[:-1]}", endpoint, str(epochs), "1", str(ELASTIC_WAIT_S), str(sleep), str(timeout)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP=net.root.address))


def wait_until(what, ok, driver, timeout=240):
    deadline = time.time() + timeout
    while not ok():
        assert driver.poll() is None, driver.communicate()[1][-4000:]
        assert time.time() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.3)


def epoch_done(client, prefix, attempt, epoch):
    """Both ranks of ``attempt`` have trained ``epoch`` whole (each writes its tally as the next epoch starts)."""
    return lambda: sum(1 for i in epoch_tallies(client, prefix)
                       if i["attempt"] == attempt and trained_whole(i, epoch, STEPS_PER_EPOCH)) >= 2


def result(driver, timeout):
    try:
        out, err = driver.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        out, err = driver.communicate()
        pytest.fail(f"the run did not end within {timeout} s:\n{err[-5000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, out[-2000:] + err[-5000:]
    return json.loads(lines[0][len("RESULT "):]), err


def nothing_lost(client, endpoint, prefix, res, epochs):
    """Every planned step, every checkpoint on S3 loads, every epoch an attempt trained whole took each row once,
    and every attempt that resumed started from its checkpoint bit for bit."""
    run = res["last_run"]
    assert res["step"] == epochs * STEPS_PER_EPOCH and len(res["history"]["loss"]) == epochs
    options = {**OPTIONS, "endpoint_url": endpoint}
    ckpts = [k for k in keys(client, prefix + "checkpoints/") if k.endswith(".npz")]
    assert len(ckpts) == epochs * STEPS_PER_EPOCH // 8, ckpts
    for key in ckpts:
        CheckpointManager.load(f"s3://{BUCKET}/{key}", options)
    x, y = digits.load()
    whole = full_epochs(epoch_tallies(client, prefix), STEPS_PER_EPOCH)
    assert (0, 0) in whole and all(v == data_fingerprint(x[:1024], y[:1024]) for v in whole.values()), whole
    for a in run["attempt_log"]:
        if a.get("ok") and a.get("resumed_from"):
            assert a["start_sha256"] == checkpoint_digest(a["resumed_from"], options), a
    return whole


def test_a_lossy_then_slow_link_finishes_in_one_attempt(cluster):
    """5% of what one host sends is dropped during the first epoch, then 200 ms is added to all it sends until a step's
    exchange is in it (at most 12 s): Gloo's TCP retransmits and waits, and the run takes no retry. (A step over
    the slow link took about 11 s here: each of Horovod's negotiations and each half of the ring crosses it, and TCP's
    window, reset after every idle moment longer than its retransmission timeout, grows again from ten segments, one
    400 ms round trip at a time. Far under the step timeout, 60 s.)"""
    net, spark_cluster, endpoint, client = cluster
    prefix = "lossy/run/"
    host = net.hosts[1]
    net.impair(host, loss=0.05)
    driver = start(spark_cluster, net, endpoint, prefix, epochs=2, sleep=0.0)
    try:
        wait_until("the first epoch over a lossy link", epoch_done(client, prefix, 0, 0), driver)
        dropped = net.dropped(host)
        net.impair(host, delay_ms=200)
        # slow until a step's exchange is in it: 16 KB of the ~320 KB the host sends the other per step (nothing but
        # the ranks' collectives goes from one worker host to the other), held 200 ms, which that step waits for; at
        # most 12 s (the spell's length before: a step held up by retransmissions may take all of it)
        other = next(h for h in net.hosts if h is not host)
        crossed = net.watch_sent(host, other)
        try:
            deadline = time.monotonic() + 12
            while crossed() < 16 << 10 and time.monotonic() < deadline and driver.poll() is None:
                time.sleep(0.2)
        finally:
            net.unwatch_sent(host, other)
        net.unimpair(host)
        res, err = result(driver, timeout=420)
    finally:
        net.unimpair(host)
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
    run = res["last_run"]
    assert run["states"] == ["starting", "running", "finished"] and run["attempts"] == 1, (run["states"], err[-3000:])
    assert [m["ranks"] for m in run["membership"]] == [2], run["membership"]
    nothing_lost(client, endpoint, prefix, res, epochs=2)
    # the faults were there: packets dropped in the lossy epoch, and steps of the second that crossed the 200 ms
    lossy, second = run["step_times"][:STEPS_PER_EPOCH], run["step_times"][STEPS_PER_EPOCH:]
    slow = [t for t in second if t > 0.2]
    print(f"\n{dropped} packets dropped; median step {1e3 * np.median(lossy):.0f} ms over the lossy link; "
          f"{len(slow)} steps over the slow one, {np.median(slow) if slow else 0:.1f} s each (median), the rest "
          f"{1e3 * np.median([t for t in second if t <= 0.2] or [0]):.0f} ms")
    assert dropped > 0 and slow, (dropped, second)  # one step may take the whole slow spell (20.3 s of 20 once)


def test_a_partitioned_host_is_left_within_the_bounds_and_nothing_is_lost(cluster):
    """Rank 1's host cut off (iptables DROP both ways) after the first epoch. Rank 0's allreduce waits; its watchdog
    ends the attempt after the step timeout (10 s). Spark counts the cut executor's slot until the master declares
    the worker lost (``spark.worker.timeout``, 10 s here, checked as often), so a retry may launch two ranks: the
    launcher's watch ends that stage as soon as the slot is gone (before issue 42 it waited the whole
    ``startup_timeout``: 717 s from the cut), and after ``elastic_wait`` the run goes on with one rank."""
    net, spark_cluster, endpoint, client = cluster
    prefix = "partition/run/"
    driver = start(spark_cluster, net, endpoint, prefix, epochs=4, sleep=0.03, timeout=TIMEOUT_S)
    try:
        wait_until("the first epoch on two connected ranks", lambda: epoch_done(client, prefix, 0, 0)() and all(
            "gloo_iface" in rank_infos(client, prefix).get((0, r), {}) for r in (0, 1)), driver)
        before = rank_infos(client, prefix)
        cut = next(h for h in net.hosts if h.address == before[(0, 1)]["address"])
        net.partition(cut)
        t_cut = time.time()
        res, err = result(driver, timeout=480)
        print(f"\nthe driver printed its result {res['time'] - t_cut:.0f} s after the cut and ended "
              f"{time.time() - res['time']:.0f} s later")
        after = rank_infos(client, prefix)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
    run = res["last_run"]
    # the run went on with one rank from its checkpoint on S3, and finished the planned steps
    assert [m["ranks"] for m in run["membership"]] == [2, 1], (run["membership"], err[-4000:])
    assert run["membership"][1]["step"] >= STEPS_PER_EPOCH
    assert run["resumed_from"].startswith(f"s3://{BUCKET}/{prefix}checkpoints/{run['run_id']}/ckpt-")
    assert run["states"][:3] == ["starting", "running", "retrying"], run["states"]
    assert run["states"][-3:] == ["shrinking", "running", "finished"], run["states"]
    whole = nothing_lost(client, endpoint, prefix, res, epochs=4)
    assert any(a == run["attempt_log"][-1]["attempt"] for a, _ in whole), sorted(whole)  # whole epochs on one rank
    # a sanity bound, not a figure: 4 epochs of the digits CNN reach 0.907-0.943 held out over 8 row orders in one
    # process, and this run (deterministic here) 0.884 since an elastic run stages its rows in an order of their
    # values (0.9 and more with the rows as they came); a run that trains wrongly stays far below
    assert res["held_out"] >= 0.85, res["held_out"]

    # how long: the shrunk attempt launched, and its first step arrived, within the sum of the bounds
    last = run["attempt_log"][-1]
    launched, stepped = run["started_at"] + last["started_s"] - t_cut, run["started_at"] + last["first_step_s"] - t_cut
    bound = TIMEOUT_S + 2 * WORKER_TIMEOUT_S + ELASTIC_WAIT_S + 30  # the master checks every worker timeout; 30 s slack
    print(f"\nafter the cut: the shrunk attempt launched in {launched:.0f} s (bound {bound} s), its first step in "
          f"{stepped:.0f} s (bound {bound + 60} s with one start-up); attempts: "
          + "; ".join(f"{a['ranks']} rank(s) {a['started_s']:.0f}-{a['ended_s']:.0f} s" for a in run["attempt_log"]))
    assert launched < bound and stepped < bound + 60 < 600, (launched, stepped, run["attempt_log"])

    # every rank met the driver's rendezvous at the root host, and Gloo listened on its own host's
    # address (eth0 of its namespace), not on a loopback or an address the hosts share
    hosts = {h.address for h in net.hosts}
    first = [before[(0, r)] for r in (0, 1)]
    assert {i["address"] for i in first} == hosts, first
    for info in [*first, *after.values()]:
        if "gloo_iface" in info:
            assert info["gloo_iface"] == "eth0" and info["gloo_address"] == info["address"] in hosts, info
            assert info["rendezvous"].startswith(f"{net.root.address}:"), info
            assert set(info["hosts"]) <= hosts and len(info["hosts"]) == info["size"], info
    survivor = after[(max(a for a, _ in after), 0)]
    assert survivor["address"] != cut.address and survivor["size"] == 1, survivor

    # the averages crossed the shaped links between the two hosts: each sent the other at least its
    # gradients for every 2-rank step before the checkpoint it resumed from (a ring of 2 sends all of them)
    gradients = 4 * res["trainable"]
    a, b = net.hosts
    sent_ab, sent_ba = net.sent_bytes(a)[b.address], net.sent_bytes(b)[a.address]
    assert min(sent_ab, sent_ba) >= gradients * run["membership"][1]["step"], (sent_ab, sent_ba, gradients)
    # and model_dir's traffic (the net, checkpoints, the result) went over the links to the services host
    assert max(net.sent_bytes(h)[net.services.address] for h in net.hosts) > 1 << 20
