"""A real MLflow tracking server for tests: ``mlflow server`` with a SQLite backend and a local artifact store in the
test's folder, on a free local port, stopped on every way out.

Without MLflow's job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``, MLflow's switch for it): the runner's
huey consumers serve MLflow's GenAI jobs (scorers, prompt optimisation), which tfnet never submits, and they kept
0.58 of a core busy while the server idled and 5 CPU-s more to start (2-core AMD EPYC Zen 4,
2026-12-04: 23.9 CPU-s against 7.4 for a server started and left idle 20 s), on a machine whose two cores the other
tests need. Tracking, artifacts and the model registry are the same."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from urllib.error import URLError
from urllib.request import urlopen

__all__ = ["MLflowServer"]


def _free_port() -> int:
    with socket.socket() as s:  # mlflow server takes no port 0: a port the OS just gave out
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MLflowServer:
    """``with MLflowServer(folder) as server:`` ``server.uri`` is its ``http://127.0.0.1:PORT``."""

    def __init__(self, folder, start_s: float = 180.0):
        self.folder, self.start_s = str(folder), start_s
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self) -> MLflowServer:
        log = open(os.path.join(self.folder, "mlflow-server.log"), "wb")
        self._log = log
        db = os.path.join(self.folder, "mlflow.db")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
             "--default-artifact-root", os.path.join(self.folder, "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + self.start_s
        while True:
            try:
                with urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (URLError, OSError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("mlflow server did not start: "
                                   + open(os.path.join(self.folder, "mlflow-server.log"), errors="replace").read()[-2000:])
            time.sleep(0.5)

    def processes(self) -> list[str]:
        """The command lines of the server's processes (its process group), from ``/proc``."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.getpgid(int(pid)) == self.proc.pid:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:  # ended meanwhile
                pass
        return found

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import signal

            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
