"""Horovod's ranks on hosts that share no loopback (issue 31): each rank in a network namespace of its
own (:class:`tests.netns.Network`, whose host names resolve to 127.0.0.1 as this machine's does), the
rendezvous store on the root host, links of 1 Gbit/s with 0.2 ms of delay. Where Gloo listens, and
the typed error for a Horovod that would listen on the loopback."""

import json
import os
import subprocess
import sys

import pytest

from optim.errors import SparkSetupError
from optim.rank import network as rank_network
from tests.cluster import ROOT
from tests.netns import Network

RANK = """
import json, sys
rank, root, port, key = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])
import numpy as np, tensorflow as tf
from optim.transport.client import GlooProxy
from optim.rank.network import check_process_sets, gloo_iface, iface_address
from optim.training.horovod import HorovodSession, horovod_env

own = sys.argv[5]
iface = gloo_iface(own, root)
cases = {"loopback name": ("127.0.1.1", root), "loopback": ("127.0.0.1", root), "all loopback": ("127.0.0.1", "127.0.0.1")}
others = {k: gloo_iface(*v) for k, v in cases.items()}
check_process_sets(iface_address(iface), sys.argv[5:7])
proxy = GlooProxy((root, port), key, timeout_s=60)
with HorovodSession(horovod_env(rank, 2, *proxy.address, iface, 60), on_close=proxy.stop) as session:
    x = tf.fill([1 << 20], float(rank + 1))  # 4 MiB
    total = session.collective.average([x])[0].numpy()
print("RESULT " + json.dumps({"iface": iface, "address": iface_address(iface), "mean": float(total.mean()),
                              "others": others}))
"""


@pytest.fixture
def network():
    with Network(hosts=2, rate="1gbit", delay_ms=0.2) as net:
        yield net


@pytest.mark.parallel
def test_two_ranks_on_two_hosts_average_over_the_interfaces_that_reach_each_other(network):
    from optim.transport.store import SecureRendezvous

    net = network
    net.count_traffic()
    key = os.urandom(32)
    hosts = [h.address for h in net.hosts]
    with SecureRendezvous(net.root.address, 2, key) as rendezvous:
        procs = [subprocess.Popen(net.command(h, [sys.executable, "-c", RANK, str(r), net.root.address,
                                                  str(rendezvous.address[1]), key.hex(), h.address,
                                                  *[a for a in hosts if a != h.address]]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env=dict(os.environ, PYTHONPATH=ROOT)) for r, h in enumerate(net.hosts)]
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=180))
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    results = []
    for p, (stdout, stderr) in zip(procs, outs):
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        assert p.returncode == 0 and lines, stderr[-3000:]
        results.append(json.loads(lines[0][7:]))
    assert [r["mean"] for r in results] == [1.5, 1.5]
    assert [(r["iface"], r["address"]) for r in results] == [("eth0", a) for a in hosts]
    # a host name that resolves to a loopback address, or a loopback executor address, while the
    # rendezvous is on another host: Gloo listens on the interface on the route there
    assert results[0]["others"] == {"loopback name": "eth0", "loopback": "eth0", "all loopback": "lo"}
    a, b = net.hosts
    # each rank sent the other its half of the 4 MiB at least once over the shaped link
    assert min(net.sent_bytes(a)[b.address], net.sent_bytes(b)[a.address]) >= 2 << 20


def test_a_horovod_that_would_listen_on_the_loopback_is_a_typed_error(monkeypatch):
    monkeypatch.setattr(rank_network, "horovod_patches", lambda: ())
    monkeypatch.setattr(rank_network, "_name_addresses", lambda: ["127.0.1.1", "10.1.2.3"])
    with pytest.raises(SparkSetupError, match=r"would listen on 127\.0\.1\.1, the address of this host's name .* the "
                                              r"ranks meet over 10\.1\.2\.3\. .*rebuild it with tfnet's "
                                              r"scripts/build_horovod\.sh"):
        rank_network.check_process_sets("10.1.2.3", ["10.1.2.3", "10.1.2.4"])
    rank_network.check_process_sets("10.1.2.3", ["10.1.2.3"])  # one host: its ranks share the loopback
    rank_network.check_process_sets("127.0.0.1", ["127.0.0.1", "127.0.0.2"])  # they meet over the loopback anyway
    monkeypatch.setattr(rank_network, "horovod_patches", lambda: (rank_network.PROCESS_SET_IFACE_PATCH,))
    rank_network.check_process_sets("10.1.2.3", ["10.1.2.3", "10.1.2.4"])  # tfnet's build: Gloo listens on 10.1.2.3
