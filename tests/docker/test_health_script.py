"""docker/health.py, the compose cluster's health checks, run here against a local HTTP server that answers as a Spark
master's web UI does (``/json/``: its ``workers``, each with ``host`` and ``state``). No Docker: the checks of real
containers are in test_compose_cluster.py (how often they run) and in every compose test's start (healthy)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import socket
import threading
import types

import pytest

from tests.docker.compose import ROOT

spec = importlib.util.spec_from_file_location("tfnet_health", os.path.join(ROOT, "docker", "health.py"))
health = importlib.util.module_from_spec(spec)
spec.loader.exec_module(health)

ME = socket.gethostbyname(socket.gethostname())


@pytest.fixture
def master(monkeypatch, tmp_path):
    """A web UI on port 0 that answers ``/json/`` with ``master.reply`` ((status, body)); the checks point at it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = server.reply if self.path == "/json/" else (404, b"")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.reply = (200, json.dumps({"workers": []}).encode())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(health, "MASTER_UI", ("127.0.0.1", server.server_address[1]))
    monkeypatch.setattr(health, "MARKER", str(tmp_path / "healthy"))
    slept = []
    monkeypatch.setattr(health, "time", types.SimpleNamespace(sleep=slept.append))  # the script's clock only
    server.slept = slept
    yield server
    server.shutdown()
    server.server_close()


def workers(*states: tuple[str, str]) -> tuple[int, bytes]:
    return 200, json.dumps({"workers": [{"host": h, "state": s} for h, s in states]}).encode()


def test_a_worker_is_healthy_only_while_the_master_lists_it_alive(master, capsys):
    master.reply = workers(("10.9.9.9", "ALIVE"), (ME, "ALIVE"))
    assert health.main(["worker"]) == 0 and health.main(["master"]) == 0
    master.reply = workers(("10.9.9.9", "ALIVE"), (ME, "DEAD"))
    assert health.main(["worker"]) == 1
    assert capsys.readouterr().out.strip() == f"unhealthy: the master lists no ALIVE worker at {ME}"
    master.reply = (500, b"")
    assert health.main(["master"]) == 1
    assert "HTTP/1.0 500" in capsys.readouterr().out
    master.reply = (200, b"<html>")
    assert health.main(["master"]) == 1
    assert "not JSON" in capsys.readouterr().out


def test_nothing_listening_is_unhealthy_with_the_reason(monkeypatch, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    monkeypatch.setattr(health, "MASTER_UI", ("127.0.0.1", free))
    monkeypatch.setattr(health, "MARKER", str(tmp_path / "healthy"))
    assert health.main(["master"]) == 1
    assert "Connection refused" in capsys.readouterr().out
    assert health.main(["nonsense"]) == 2


def test_a_check_that_follows_a_healthy_one_of_the_same_run_sleeps_first(master):
    """Healthy: the next check sleeps STEADY_S before it looks (a healthy cluster is checked about every 22 s);
    unhealthy or another run of the container (a restart): it looks at once."""
    master.reply = workers((ME, "ALIVE"))
    assert health.main(["worker"]) == 0 and master.slept == []
    with open(health.MARKER) as f:
        assert f.read() == health.this_run() != ""
    assert health.main(["worker"]) == 0 and master.slept == [health.STEADY_S] == [20.0]
    master.reply = workers((ME, "DEAD"))
    assert health.main(["worker"]) == 1 and master.slept == [20.0, 20.0]
    assert not os.path.exists(health.MARKER)
    master.reply = workers((ME, "ALIVE"))
    assert health.main(["worker"]) == 0 and master.slept == [20.0, 20.0]  # the failure left no marker
    with open(health.MARKER, "w") as f:
        f.write("12345")  # healthy in an earlier run of the container
    assert health.main(["worker"]) == 0 and master.slept == [20.0, 20.0]
