"""How a Connect stage's ranks find rank 0's rendezvous store: on a port the job's key and attempt name,
passing by another service or an earlier attempt's store on it, else at the address Spark's allGather
brings. Real stores and sockets on 127.0.0.1; the allGather (BarrierTaskContext) is stood in for."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from optim.errors import RendezvousError
from optim.transport import store_address
from optim.transport.auth import derive_key
from optim.transport.store import SecureRendezvous
from optim.transport.store_address import AddressGather, find_store, preferred_ports, proof, start_store
from tests.clock import VirtualClock

KEY = derive_key(b"store address " * 3, "rendezvous")


class Gather:
    """Stands in for :class:`AddressGather`: done when ``value`` is given."""

    def __init__(self, value=None):
        self.value = value

    def done(self):
        return self.value is not None

    def result(self, timeout_s):
        return self.value


class Foreign(BaseHTTPRequestHandler):
    """Another service on the port: answers 200 and the same bytes to everything."""

    def do_GET(self):  # noqa: N802 (http.server names)
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args):
        pass


def listening(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_ports_are_named_by_key_and_attempt():
    a, b = preferred_ports(KEY, 0), preferred_ports(KEY, 1)
    assert a == preferred_ports(KEY, 0) and a != b and len(set(a)) == 3
    assert all(20000 <= p < 32000 for p in a + b)
    assert preferred_ports(derive_key(b"another job " * 3, "rendezvous"), 0) != a
    assert proof(KEY, 0) != proof(KEY, 1)


def test_a_rank_passes_a_foreign_service_and_an_earlier_attempts_store():
    """Attempt 1's first port is held by another HTTP service, its second by attempt 0's store (same
    key): rank 0 listens on the third, and another rank finds it there, before any allGather."""
    ports = preferred_ports(KEY, 1)
    foreign = HTTPServer(("127.0.0.1", ports[0]), Foreign)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    earlier = SecureRendezvous("127.0.0.1", 2, KEY, port=ports[1])
    earlier.put("tfnet_hello", "attempt0", proof(KEY, 0))
    try:
        with start_store("127.0.0.1", 2, KEY, 1) as store:
            assert store.address == ("127.0.0.1", ports[2])
            assert find_store("127.0.0.1", KEY, 1, Gather(), timeout_s=10) == ("127.0.0.1", ports[2])
    finally:
        earlier.stop()
        foreign.shutdown()
        foreign.server_close()


class PolledGather(Gather):
    """Done at its ``ready``-th poll, with ``value``; counts the polls."""

    def __init__(self, value, ready):
        super().__init__()
        self._value, self._ready, self.polls = value, ready, 0

    def done(self):
        self.polls += 1
        if self.polls >= self._ready:
            self.value = self._value
        return self.value is not None


def test_all_ports_taken_the_os_picks_and_the_gathered_address_is_used(monkeypatch):
    """No preferred port answers: the rank keeps trying them, backing off, until the allGather brings the
    address, and uses that. The clock is virtual: what is asserted is the order of events, not a speed."""
    clock = VirtualClock()
    held = [listening(p) for p in preferred_ports(KEY, 2)]
    try:
        with start_store("127.0.0.1", 2, KEY, 2) as store:
            assert store.address[1] not in preferred_ports(KEY, 2)
            gather = PolledGather(f"127.0.0.1:{store.address[1]}", ready=4)
            monkeypatch.setattr(store_address, "time", clock)
            assert find_store("127.0.0.1", KEY, 2, gather, timeout_s=10) == ("127.0.0.1", store.address[1])
            # three rounds over the held ports, a back-off between them, then the gathered address
            assert gather.polls == 4 and clock.sleeps == [0.005, 0.01, 0.02], clock.sleeps
    finally:
        for s in held:
            s.close()


def test_no_store_and_no_gather_is_a_typed_error_at_the_bound(monkeypatch):
    """Nothing answers and nothing is gathered: a RendezvousError once the (virtual) clock passes the bound,
    after backing off up to 0.1 s between rounds; never before the bound, never long after it."""
    clock = VirtualClock()
    monkeypatch.setattr(store_address, "time", clock)
    start = clock.now
    with pytest.raises(RendezvousError, match="did not come up within 5 s"):
        find_store("127.0.0.1", KEY, 3, Gather(), timeout_s=5.0)
    assert 5.0 < clock.now - start <= 5.0 + 0.1, clock.now - start
    assert clock.sleeps[:5] == [0.005, 0.01, 0.02, 0.04, 0.08] and set(clock.sleeps[5:]) == {0.1}, clock.sleeps


class Ctx:
    def __init__(self, error=None):
        self.error = error

    def allGather(self, value):  # noqa: N802 (pyspark's name)
        time.sleep(0.05)
        if self.error:
            raise self.error
        return ["10.0.0.5:2345", value]


def test_address_gather_hands_rank_0s_value_or_its_error_to_the_task():
    assert AddressGather(Ctx(), "").result(5) == "10.0.0.5:2345"
    with pytest.raises(ConnectionResetError, match="barrier"):
        AddressGather(Ctx(ConnectionResetError("barrier gone")), "").result(5)
