"""The driver's channels accept only clients that hold the job's keys: the rendezvous store
(requests signed with its key; Gloo's through each rank's proxy, which forwards Gloo's paths only)
and the progress channel (its own key)."""

import socket
import time
from http.client import HTTPException
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest

from optim.errors import RendezvousError
from optim.training.reporting import Reporter
from optim.transport import client as kv
from optim.transport.auth import derive_key, sign_request, verify_request
from optim.transport.client import GlooProxy
from optim.transport.progress import ProgressServer, RemoteReporter
from optim.transport.store import SecureRendezvous


class Steps(Reporter):
    def __init__(self):
        self.steps = []

    def step(self, step, epoch, logs):
        self.steps.append(step)


KEY = derive_key(b"job secret " * 3, "rendezvous")
OTHER = derive_key(b"job secret " * 3, "progress")
REPORT = (b'{"cls": "ValueError", "message": "m", "retryable": false, "traceback": "t", "rank": 1, "time": 1.0}')


def test_keys_are_derived_per_purpose_and_requests_are_signed_not_keyed():
    secret = b"x" * 32
    keys = {p: derive_key(secret, p) for p in ("rendezvous", "progress")}
    assert len(set(keys.values())) == 2 and secret not in keys.values()
    sig = sign_request(keys["rendezvous"], "PUT", "/global/rank0", b"addr")
    assert verify_request(keys["rendezvous"], sig, "PUT", "/global/rank0", b"addr")
    assert not verify_request(keys["rendezvous"], sig, "PUT", "/global/rank1", b"addr"), "the path is signed"
    assert not verify_request(keys["rendezvous"], sig, "PUT", "/global/rank0", b"other"), "the body is signed"
    assert not verify_request(keys["progress"], sig, "PUT", "/global/rank0", b"addr"), "one key per purpose"
    assert keys["rendezvous"].hex() not in sig
    with pytest.raises(ValueError, match=r"Unknown key purpose 'gloo'"):
        derive_key(secret, "gloo")


def test_rendezvous_refuses_requests_not_signed_with_the_key():
    with SecureRendezvous("127.0.0.1", 2, KEY) as server:
        addr = server.address
        with pytest.raises(RendezvousError, match=r"refused this rank: its request was not signed with the job's key \(403\)"):
            kv.put(addr, "tfnet_claims", "rank0", b"1")
        with pytest.raises(RendezvousError, match=r"refused this rank"):
            kv.get(addr, "tfnet_claims", "rank0", token=OTHER)
        with pytest.raises(HTTPError, match="403"):  # a Gloo-style request straight to the store
            urlopen(Request(f"http://{addr[0]}:{addr[1]}/global/rank0", data=b"x", method="PUT"), timeout=5)
        kv.put(addr, "tfnet_claims", "rank0", b"1", token=KEY)
        assert kv.get(addr, "tfnet_claims", "rank0", token=KEY) == b"1"
        assert server.refused == 3


def test_a_signature_replayed_on_another_body_is_refused():
    """A signed request's signature covers its body: replayed with a stolen signature on another body, the
    request is refused; with the key, it is recorded."""
    with SecureRendezvous("127.0.0.1", 2, KEY) as server:
        addr = server.address
        forged = Request(f"http://{addr[0]}:{addr[1]}/tfnet_claims/rank1", data=b"forged", method="PUT")
        forged.add_header("X-Tfnet-Auth", sign_request(KEY, "PUT", "/tfnet_claims/rank1", b"1"))
        with pytest.raises(HTTPError, match="403"):
            urlopen(forged, timeout=5)
        assert kv.get(addr, "tfnet_claims", "rank1", token=KEY) is None
        kv.put(addr, "tfnet_claims", "rank1", b"1", token=KEY)
        assert kv.get(addr, "tfnet_claims", "rank1", token=KEY) == b"1"


def test_a_peers_failure_rides_in_the_error_of_the_rank_whose_collective_broke():
    """Failures reach the driver one way, in a task's error, and Spark reports whichever task failed first. Rank 1
    fails on a bad row and leaves its failure in the store; rank 0's collective then breaks (a retryable error),
    and rank 0 carries rank 1's failure in its own error: from rank 0's text alone the driver finds the cause,
    which no retry mends. A failure left without the key is refused."""
    from optim.errors import BadRowError
    from optim.transport.failures import failure_text, failures_in, from_exception, pick_root

    def failed(exc):
        try:
            raise exc
        except Exception as caught:  # noqa: BLE001 - what a rank does with any error
            return caught

    with SecureRendezvous("127.0.0.1", 2, KEY) as server:
        addr = server.address
        root = from_exception(failed(BadRowError("Column 'x' is null at row 3 of partition 1")), rank=1)
        assert not root.retryable
        assert not kv.post_failure(addr, 1, root.to_json(), OTHER)  # refused without the key
        assert kv.peer_failures(addr, 0, 2, KEY, wait_s=0.2) == []
        assert kv.post_failure(addr, 1, root.to_json(), KEY)
        peer = from_exception(failed(ConnectionResetError("Connection reset by peer")), rank=0)
        assert peer.retryable
        carried = [type(root).from_json(d) for d in kv.peer_failures(addr, 0, 2, KEY, wait_s=5)]
        text = " ".join(failure_text(f) for f in [peer, *carried]) + " rank 0: ConnectionResetError"
    found = failures_in(f"org.apache.spark.api.python.PythonException: ... WorkerError: {text} ...")
    assert [(f.cls, f.rank) for f in found] == [("ConnectionResetError", 0), ("BadRowError", 1)]
    assert pick_root(found).cls == "BadRowError"
    assert pick_root(failures_in(failure_text(peer))).cls == "ConnectionResetError", "without the peer's: retryable"


def test_gloo_proxy_forwards_gloo_requests_only():
    """The rank's proxy signs what Gloo's rendezvous sends and refuses the rest: tfnet's own
    scopes (a local process cannot post a failure report or a claim through it), other paths and
    other methods."""
    with SecureRendezvous("127.0.0.1", 2, KEY) as server:
        addr = server.address
        proxy = GlooProxy(addr, KEY)
        base = f"http://{proxy.address[0]}:{proxy.address[1]}"
        try:
            for path in ("/global/rank0", "/local_rank1/1", "/cross_0/0", "/global_process_set_hash_ab12/rank0", "/cross_0_process_set_hash_7d48/rank_0"):
                urlopen(Request(base + path, data=b"x", method="PUT"), timeout=5).read()
                assert kv.get(addr, *path[1:].split("/"), token=KEY) == b"x"
            for method, path in [("PUT", "/tfnet_failures/rank1"), ("PUT", "/tfnet_claims/rank0"),
                                 ("GET", "/tfnet_counts/rank0"), ("PUT", "/global/../tfnet_claims/rank0"),
                                 ("PUT", "/anything/else"), ("POST", "/global/rank0"), ("GET", "/global")]:
                with pytest.raises(HTTPError, match="403"):
                    urlopen(Request(base + path, data=REPORT if method != "GET" else None, method=method), timeout=5)
            assert proxy.refused == 7
        finally:
            proxy.stop()
        assert kv.get(addr, "tfnet_claims", "rank0", token=KEY) is None


def test_rendezvous_listens_on_the_given_address_and_a_pinned_port():
    with SecureRendezvous("127.0.0.1", 1, KEY) as server:
        assert server.address[0] == "127.0.0.1" and server.address[1] > 0
        port = server.address[1]
    with SecureRendezvous("127.0.0.1", 1, KEY, port=port) as again:  # pinned: the same port, rebound at once
        assert again.address == ("127.0.0.1", port)
        with pytest.raises(OSError, match=r"cannot listen on 127.0.0.1:\d+ .*spark.tfnet.rendezvous.port"):
            SecureRendezvous("127.0.0.1", 1, KEY, port=port)


def test_progress_channel_refuses_clients_without_the_secret():
    rec = Steps()
    server = ProgressServer(rec, host="127.0.0.1", authkey=b"right" * 4)
    try:
        assert server.address[0] == "127.0.0.1"
        intruder = RemoteReporter("127.0.0.1", server.port, authkey=b"wrong" * 4)
        intruder.step(99, 0, {})
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        raw.sendall(b'{"event": "step", "step": 98, "epoch": 0, "logs": {}}\n')
        good = RemoteReporter("127.0.0.1", server.port, authkey=b"right" * 4)
        good.step(1, 0, {"loss": 1.0})
        good.end()
        deadline = time.time() + 15
        while (server.refused < 2 or not rec.steps) and time.time() < deadline:
            time.sleep(0.05)
        raw.close()
    finally:
        server.close()
    assert rec.steps == [1], "only the client with the secret got through"
    assert server.refused == 2


@pytest.mark.spark
@pytest.mark.parallel
@pytest.mark.slow
def test_job_finishes_while_a_client_without_the_secret_attacks(spark):
    """The measured attack on the old driver: PUT tfnet_claims/rank0 and rank1 to the rendezvous
    port during a 2-rank run. Now refused (403), and the job finishes on its first attempt."""
    import threading

    import psutil

    import optim
    from optim import TFOptimizer
    from tests import digits
    from tfnet import TFNet

    me = psutil.Process()

    def listening() -> set[int]:
        for _ in range(20):  # /proc/net can change under psutil while it reads: read again
            try:
                return {c.laddr.port for c in me.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
            except (OSError, psutil.Error):
                time.sleep(0.01)
        return set()

    before = listening()
    answers: dict[int, object] = {}
    stop = threading.Event()

    def attacker():
        while not stop.is_set():
            for port in listening() - before - set(answers):
                for key in ("rank0", "rank1"):
                    try:
                        urlopen(Request(f"http://127.0.0.1:{port}/tfnet_claims/{key}", data=b"1", method="PUT"),
                                timeout=3).read()
                        answers[port] = 200
                    except HTTPError as exc:
                        answers[port] = exc.code
                    except (OSError, HTTPException) as exc:  # a port that does not speak HTTP (Gloo, progress)
                        answers[port] = type(exc).__name__
            time.sleep(0.05)

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)),
                      optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05))
    try:
        history = opt.optimize((x[:256], y[:256]), epochs=2, batch_size=32, num_workers=2, verbose=0, timeout=120)
    finally:
        stop.set()
        thread.join(10)
    assert 403 in answers.values(), answers  # the rendezvous store refused the claims
    assert 200 not in answers.values(), answers
    assert opt.last_run["attempts"] == 1 and opt.global_step == 16 and len(history["loss"]) == 2
    assert opt.last_run["refused_progress_clients"] >= 1


def test_progress_reporter_reconnects_after_a_lost_connection(monkeypatch):
    from optim.transport import progress

    monkeypatch.setattr(progress, "RECONNECT_S", 0.0)
    rec = Steps()
    server = ProgressServer(rec, host="127.0.0.1", authkey=b"k" * 16)
    try:
        reporter = RemoteReporter("127.0.0.1", server.port, authkey=b"k" * 16)
        reporter.step(1, 0, {})
        reporter._conn.close()  # the connection drops (a driver-side reset, a network blip)
        reporter._conn = None
        reporter.step(2, 0, {})
        deadline = time.time() + 10
        while rec.steps != [1, 2] and time.time() < deadline:
            time.sleep(0.05)
        assert rec.steps == [1, 2] and reporter.reconnects == 1
        reporter.end()
    finally:
        server.close()


def test_progress_server_pins_its_port_and_says_so_when_taken():
    server = ProgressServer(Steps(), host="127.0.0.1", authkey=b"k" * 16, advertise="driver.example")
    try:
        assert server.address == ("driver.example", server.port)
        with pytest.raises(OSError, match=r"cannot listen on 127.0.0.1:\d+ .*spark.tfnet.progress.port"):
            ProgressServer(Steps(), host="127.0.0.1", authkey=b"k" * 16, port=server.port)
    finally:
        server.close()


def test_log4j2_configuration_is_private_and_fresh(tmp_path):
    import os
    import stat
    import subprocess
    import sys
    import tempfile

    planted = os.path.join(tempfile.gettempdir(), "tfnet-log4j2-error-v4.properties")  # the old predictable name
    code = ("from optim.logs import spark_log_conf; import json; "
            "print(json.dumps(spark_log_conf(1)['spark.driver.extraJavaOptions']))")
    env = {k: v for k, v in os.environ.items() if k != "TFNET_VERBOSE"}
    paths = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        paths.append(out.stdout.strip().strip('"').split("file:", 1)[1])
    assert paths[0] != paths[1] and planted not in paths, "a fresh file per process, never a predictable one"
    from optim.logs import _log4j2_file

    path = _log4j2_file()
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert "rootLogger.level = error" in open(path).read()
