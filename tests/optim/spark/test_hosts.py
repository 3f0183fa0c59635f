"""Hosts that are not one machine (issue 31): a Spark standalone cluster whose two workers each run in
a network namespace of their own (own address, loopback and /tmp; a veth to a bridge; links of
1 Gbit/s with 0.2 ms of delay: :mod:`tests.netns`), the master and an S3 server (moto) on a services
host of their own, the driver on the network's root host (this machine's namespace). The ranks reach ``model_dir`` on S3 and the driver's rendezvous over the
shaped links, Gloo connects the ranks over their namespaces' addresses, and the run survives a lost
host by going on with one rank."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.cluster import ROOT
from tests.netns import Network
from tests.netns_cluster import NetnsCluster

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

BUCKET = "tfnet"
EPOCHS = 4
STEPS_PER_EPOCH = 1024 // 32


@pytest.fixture
def network():
    with Network(hosts=2, rate="1gbit", delay_ms=0.2, services=True) as net:
        yield net


def keys(client, prefix):
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))
    except Exception:  # noqa: BLE001 - the server is busy; ask again
        return []


def rank_infos(client, prefix):
    """``{(attempt, rank): info}`` of every rank file in the store (each rank rewrites its own)."""
    out = {}
    for key in keys(client, prefix + "ranks/"):
        if re.search(r"/rank-\d+\.json$", key):
            info = json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
            out[(info["attempt"], info["rank"])] = info
    return out


def test_a_cluster_of_namespaced_hosts_trains_on_s3_and_survives_a_lost_host(network):
    import boto3

    net = network
    assert net.shaping in ("netem", "tbf+queue")
    for host in net.hosts:  # the hosts reach the subnet and nothing else
        assert net.routes(host) == [r for r in net.routes(host) if r.startswith(str(net.subnet))], net.routes(host)
    net.count_traffic()
    prefix = "hosts/run/"
    t0 = time.time()
    with NetnsCluster(net, cores=1) as cluster:
        t_up = time.time()
        endpoint = cluster.start_s3(BUCKET)
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                              region_name="us-east-1")
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.optim.spark.hosts_driver", cluster.url, net.root.address,
             f"s3://{BUCKET}/{prefix[:-1]}", endpoint, str(EPOCHS), "1", "5", "0.03"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP=net.root.address))
        try:
            deadline = time.time() + 240
            while True:  # the first checkpoint, and both ranks connected: then rank 1's host is lost
                assert driver.poll() is None, driver.communicate()[1][-4000:]
                assert time.time() < deadline, "no checkpoint and no connected ranks within 240 s"
                before = rank_infos(client, prefix)
                if any(k.endswith(".npz") for k in keys(client, prefix + "checkpoints/")) and \
                        all("gloo_iface" in before.get((0, r), {}) for r in (0, 1)):
                    break
                time.sleep(0.3)
            lost = cluster.worker_on(before[(0, 1)]["address"])
            cluster.kill_worker(lost)
            t_kill = time.time()
            out, err = driver.communicate(timeout=300)
            after = rank_infos(client, prefix)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(10)
    print(f"\nthe cluster came up in {t_up - t0:.0f} s, the first checkpoint {t_kill - t_up:.0f} s later, the run ended "
          f"{time.time() - t_kill:.0f} s after the kill")
    result = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert driver.returncode == 0 and result, out[-2000:] + err[-5000:]
    res = json.loads(result[0][len("RESULT "):])
    run = res["last_run"]

    # the run went on with one rank from its checkpoint on S3, and finished the planned steps
    assert [m["ranks"] for m in run["membership"]] == [2, 1], run["membership"]
    assert run["membership"][1]["step"] > 0 and res["step"] == EPOCHS * STEPS_PER_EPOCH
    assert run["resumed_from"].startswith(f"s3://{BUCKET}/{prefix}checkpoints/{run['run_id']}/ckpt-")
    assert res["held_out"] >= 0.9, res["held_out"]

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
    assert survivor["address"] != first[1]["address"] and survivor["size"] == 1, survivor

    # the averages crossed the shaped links between the two hosts: each sent the other at least its
    # gradients for every 2-rank step before the checkpoint it resumed from (a ring of 2 sends all of them)
    gradients = 4 * res["trainable"]
    a, b = net.hosts
    sent_ab, sent_ba = net.sent_bytes(a)[b.address], net.sent_bytes(b)[a.address]
    assert min(sent_ab, sent_ba) >= gradients * run["membership"][1]["step"], (sent_ab, sent_ba, gradients)
    # and model_dir's traffic (the net, checkpoints, the result) went over the links to the services host
    assert max(net.sent_bytes(h)[net.services.address] for h in net.hosts) > 1 << 20
