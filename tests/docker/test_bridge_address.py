"""How the Docker tier finds this host's address on the containers' network (issue 37): Debian's engine
20.10 on a fresh machine reports the default bridge's subnet without a gateway, so the gateway field
alone gave an empty address. Pure functions over ``docker network inspect``'s JSON; no engine needed.
The docker tier itself (test_no_shared_disk_cluster.py) runs them against the real engine."""

import pytest

from tests.docker.compose import bindable, bridge_candidates, first_bindable, interface_ipv4


def test_the_gateway_comes_first_when_the_engine_reports_one():
    network = {"IPAM": {"Config": [{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]},
               "Options": {"com.docker.network.bridge.name": "tfnet-no-such0"}}
    assert bridge_candidates(network) == [("172.17.0.1", "IPAM gateway")]


def test_a_subnet_without_a_gateway_falls_back_to_the_interface_then_the_subnet():
    # the engine of issue 37: only the subnet; here the bridge's interface is the loopback, whose address is known
    network = {"IPAM": {"Config": [{"Subnet": "172.17.0.0/16"}]}, "Options": {"com.docker.network.bridge.name": "lo"}}
    assert bridge_candidates(network) == [("127.0.0.1", "address of interface lo"),
                                          ("172.17.0.1", "first host of subnet 172.17.0.0/16")]
    # no interface of that name: the first host of the subnet
    network["Options"]["com.docker.network.bridge.name"] = "tfnet-no-such0"
    assert bridge_candidates(network) == [("172.17.0.1", "first host of subnet 172.17.0.0/16")]
    # an engine that names no bridge option uses docker0, whatever address it has here
    assert interface_ipv4("tfnet-no-such0") is None


def test_an_address_that_cannot_be_bound_is_skipped_and_every_refusal_is_named():
    assert bindable("127.0.0.1") is None
    assert "OSError" in bindable("192.0.2.1")  # TEST-NET-1: never an address of this host
    assert first_bindable([("192.0.2.1", "IPAM gateway"), ("127.0.0.1", "address of interface lo")], "") == "127.0.0.1"
    with pytest.raises(RuntimeError, match=r"Tried: 192\.0\.2\.1 \(IPAM gateway\): OSError.*inspect says: \[\]"):
        first_bindable([("192.0.2.1", "IPAM gateway")], "inspect says: []")
    with pytest.raises(RuntimeError, match=r"Tried: nothing \(no gateway"):
        first_bindable([], "")
