"""The driver's channels accept only clients that present the job's secret: the rendezvous store
(tfnet's keys and, through each rank's proxy, Gloo's) and the progress channel."""

import socket
import time
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest

from optim.errors import RendezvousError
from optim.spark.driver.rendezvous import SecureRendezvous
from optim.spark.progress import ProgressServer, RemoteReporter
from optim.spark.worker import rendezvous as kv
from optim.spark.worker.rendezvous import GlooProxy
from optim.training.reporting import Reporter


class Steps(Reporter):
    def __init__(self):
        self.steps = []

    def step(self, step, epoch, logs):
        self.steps.append(step)


def test_rendezvous_refuses_requests_without_the_secret():
    with SecureRendezvous("127.0.0.1", 2, "right") as server:
        addr = server.address
        with pytest.raises(RendezvousError, match=r"refused this rank: it did not present the job's secret \(403\)"):
            kv.put(addr, "tfnet_claims", "rank0", b"1")
        with pytest.raises(RendezvousError, match=r"refused this rank"):
            kv.get(addr, "tfnet_claims", "rank0", token="wrong")
        with pytest.raises(HTTPError, match="403"):  # a Gloo-style request straight to the store
            urlopen(Request(f"http://{addr[0]}:{addr[1]}/global/rank0", data=b"x", method="PUT"), timeout=5)
        kv.put(addr, "tfnet_claims", "rank0", b"1", token="right")
        assert kv.get(addr, "tfnet_claims", "rank0", token="right") == b"1"
        proxy = GlooProxy(addr, "right")  # Gloo's requests go through the rank's proxy, which adds the secret
        try:
            urlopen(Request(f"http://{proxy.address[0]}:{proxy.address[1]}/global/rank0", data=b"x", method="PUT"),
                    timeout=5).read()
            assert kv.get(addr, "global", "rank0", token="right") == b"x"
        finally:
            proxy.stop()
        kv.report_failure(addr, 1, b'{"cls": "ValueError", "message": "m", "retryable": false, "traceback": "t", '
                          b'"rank": 1, "time": 1.0}', "right")
        assert [(f.cls, f.rank) for f in server.failures()] == [("ValueError", 1)]


def test_rendezvous_listens_on_the_given_address_only():
    with SecureRendezvous("127.0.0.1", 1, "t") as server:
        assert server.address[0] == "127.0.0.1"


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
        return {c.laddr.port for c in me.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}

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
                    except OSError as exc:
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
