"""A real Spark standalone cluster on this machine, started through docker/entrypoint.sh (the same
script the cluster image runs), for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRYPOINT = os.path.join(ROOT, "docker", "entrypoint.sh")


class StandaloneCluster:
    """``with StandaloneCluster(workers=2) as c: c.url`` starts a master and workers of one core
    each, and stops them (and their executors) on exit. ``host``: the address the master (and, here,
    the workers) bind and advertise."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "2g", host: str = "127.0.0.1",
                 decommission: bool = False):
        self.host = host
        self.decommission = decommission  # workers that take decommission notices (SIGPWR), as managed clusters run
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        # the master and the workers bind port 0; the master's ports are read back from its log
        self.port: int | None = None
        self.webui: int | None = None
        self.url = ""
        self.dir = tempfile.mkdtemp(prefix="tfnet-cluster-")
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def _env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(
            PYTHON=sys.executable, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP=self.host,
            SPARK_MASTER_HOST=self.host, SPARK_MASTER_PORT="0", SPARK_MASTER_WEBUI_PORT="0",
            SPARK_MASTER_URL=self.url, SPARK_WORKER_CORES=str(self.cores), SPARK_WORKER_MEMORY=self.memory,
            SPARK_WORKER_HOST=self.host, SPARK_LOG_DIR=self.dir, SPARK_NO_DAEMONIZE="1",
        )
        if self.decommission:
            env["SPARK_WORKER_OPTS"] = "-Dspark.decommission.enabled=true"
        env.update(extra)
        return env

    def _spawn(self, role: str, log: str, wrap=None, **env) -> subprocess.Popen:
        """``entrypoint.sh ROLE`` with the cluster's environment and ``env``; ``wrap(cmd)``: the command
        line that runs it (another host's, :class:`tests.netns_cluster.NetnsCluster`)."""
        out = open(os.path.join(self.dir, log), "wb")
        cmd = ["bash", ENTRYPOINT, role]
        return subprocess.Popen(wrap(cmd) if wrap else cmd, env=self._env(**env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def start(self) -> StandaloneCluster:
        """Starts the master and the workers and waits for them (90 s each); stops what it started
        when one does not come up."""
        try:
            self.master = self._spawn("master", "master.log")
            self._wait(self._read_master_ports, 90, "the master's ports")
            self._wait(lambda: self._alive_workers() is not None, 90, "the master")
            for _ in range(self.n_workers):
                self.add_worker()
            self._wait(lambda: (self._alive_workers() or 0) >= self.n_workers, 90, "the workers")
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self) -> subprocess.Popen:
        i = len(self.workers)
        proc = self._spawn("worker", f"worker-{i}.log", SPARK_WORKER_WEBUI_PORT="0", SPARK_MASTER_URL=self.url,
                           SPARK_WORKER_DIR=os.path.join(self.dir, f"work-{i}"))
        self.workers.append(proc)
        return proc

    def wait_for_workers(self, n: int, timeout: float = 90) -> None:
        self._wait(lambda: (self._alive_workers() or 0) >= n, timeout, f"{n} workers")

    def wait_until_idle(self, n: int, timeout: float = 90) -> None:
        """Until ``n`` workers are ALIVE with every core free and no application is running (the one before has
        ended and its executors are gone): a cluster that a test shares with the test before it."""
        def idle() -> bool:
            state = self._master_state()
            if state is None or state.get("activeapps"):
                return False
            free = [w for w in state.get("workers", []) if w.get("state") == "ALIVE" and not w.get("coresused")]
            return len(free) >= n
        self._wait(idle, timeout, f"{n} idle workers")

    def free_workers(self, n: int = 2, timeout: float = 90) -> None:
        """Back to ``n`` live workers, each with its core free and no application running, for a test that shares the
        cluster with the tests before it: a worker the master no longer counts (decommissioned) is ended, a new one
        started for each that is gone (a cluster manager's replacement), then the master's own word that ``n`` are
        ALIVE and idle."""
        state = self._master_state() or {}
        for i, proc in enumerate(self.workers):
            port = self._worker_port(i)
            seen = [w.get("state") for w in state.get("workers", []) if port and w.get("port") == port]
            if proc.poll() is None and seen and "ALIVE" not in seen:
                self.kill_worker(i)
                proc.wait(20)
        live = sum(1 for proc in self.workers if proc.poll() is None)
        for _ in range(max(0, n - live)):
            self.add_worker()
        live = sum(1 for proc in self.workers if proc.poll() is None)
        self._wait(lambda: self._alive_workers() == live, timeout, f"the master's count of {live} live workers")
        self.wait_until_idle(n, timeout)

    def newest(self) -> int:
        """The index of the worker added last (alive after :meth:`free_workers`)."""
        return len(self.workers) - 1

    def _worker_port(self, index: int) -> int | None:
        """The port worker ``index`` bound (its log: ``Successfully started service 'sparkWorker' on port N``)."""
        try:
            with open(os.path.join(self.dir, f"worker-{index}.log"), errors="replace") as f:
                found = re.search(r"service 'sparkWorker' on port (\d+)", f.read())
        except OSError:
            return None
        return int(found.group(1)) if found else None

    def kill_worker(self, index: int) -> None:
        """SIGKILLs a worker, its executor and its Python workers (its whole process group)."""
        os.killpg(self.workers[index].pid, signal.SIGKILL)

    def _read_master_ports(self) -> bool:
        """The ports the master bound, from its log: ``Starting Spark master at spark://HOST:PORT``
        and ``Bound MasterWebUI to HOST, and started at http://...:PORT``."""
        with open(os.path.join(self.dir, "master.log"), errors="replace") as f:
            text = f.read()
        master = re.search(r"Starting Spark master at (spark://[\w.]+:(\d+))", text)
        webui = re.search(r"Bound MasterWebUI to .*, and started at http://[\w.]+:(\d+)", text)
        if not (master and webui):
            return False
        self.url, self.port, self.webui = master.group(1), int(master.group(2)), int(webui.group(1))
        return True

    def _master_state(self) -> dict | None:
        """The master's ``/json/`` (workers, applications), or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.webui}/json/", timeout=2) as r:
                import json

                return json.loads(r.read())
        except OSError:
            return None

    def _alive_workers(self) -> int | None:
        data = self._master_state()
        if data is None:
            return None
        return sum(1 for w in data.get("workers", []) if w.get("state") == "ALIVE")

    def _wait(self, ok, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ok():
                return
            time.sleep(0.2)
        logs = "\n".join(f"--- {f}\n" + open(os.path.join(self.dir, f), errors="replace").read()[-1500:]
                         for f in sorted(os.listdir(self.dir)) if f.endswith(".log"))
        raise TimeoutError(f"{what} did not come up within {timeout} s.\n{logs}")

    def stop(self) -> None:
        for proc in self.workers + ([self.master] if self.master else []):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.workers + ([self.master] if self.master else []):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
