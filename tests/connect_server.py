"""A real Spark Connect server for tests: pyspark's own ``SparkConnectServer`` class through
``spark-submit``, on ``local[2]`` in a process of its own (as a remote server is), bound to port 0
on 127.0.0.1; its port is read from the line it logs when it starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time

from tests import spark_jvm

STARTED = re.compile(r"Spark Connect server started at: ([0-9.]+):(\d+)")


class ConnectServer:
    """``ConnectServer(cores=2).start()``; ``url`` is ``sc://127.0.0.1:PORT``; ``stop()`` ends it. ``master``:
    a cluster's URL instead of ``local[cores]``."""

    def __init__(self, cores: int = 2, conf: dict[str, str] | None = None, master: str | None = None):
        import pyspark

        self.log_path = tempfile.mktemp(prefix="tfnet-connect-", suffix=".log")
        local = tempfile.mkdtemp(prefix="tfnet-connect-spark-")
        settings = {
            "spark.connect.grpc.binding.port": "0", "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": "127.0.0.1", "spark.python.worker.reuse": "true", "spark.driver.memory": "2g",
            "spark.sql.shuffle.partitions": str(cores), "spark.local.dir": local,
            "spark.sql.warehouse.dir": os.path.join(local, "warehouse"),
            "spark.executorEnv.TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"),
        }
        settings.update(conf or {})
        submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
        self.cmd = [submit, "--master", master or f"local[{cores}]", *spark_jvm.submit_args()]
        for key, value in settings.items():
            self.cmd += ["--conf", f"{key}={value}"]
        self.cmd += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    def start(self, timeout_s: float = 180.0) -> ConnectServer:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
            env.pop(key, None)
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        found: list[str] = []
        threading.Thread(target=self._pump, args=(found,), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"The Spark Connect server exited with {self.proc.returncode}; see {self.log_path}")
            time.sleep(0.2)
        if not found:
            self.stop()
            raise TimeoutError(f"The Spark Connect server did not start within {timeout_s:.0f} s; see {self.log_path}")
        self.url = found[0]
        return self

    def _pump(self, found: list[str]) -> None:
        with open(self.log_path, "w") as log:
            for raw in iter(self.proc.stderr.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                m = STARTED.search(line)
                if m and not found:
                    found.append(f"sc://{m.group(1)}:{m.group(2)}")

    def session(self):
        """A Connect client session to this server; :func:`close_session` ends it."""
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(self.url).create()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def close_session(session) -> None:
    """Stops a Connect client session and takes back the process-wide switch pyspark set for it, so
    that classic sessions in the same process work again."""
    try:
        session.stop()
    finally:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
