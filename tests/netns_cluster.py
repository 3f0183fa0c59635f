"""A Spark standalone cluster whose workers are hosts of their own: each worker runs in a network
namespace of a :class:`tests.netns.Network` (its own address, loopback and ``/tmp``, a shaped link
to the switch), started through docker/entrypoint.sh as :class:`tests.cluster.StandaloneCluster`
starts its workers. The master runs on the network's services host (``.2``), the driver on its root
host (this machine's namespace, ``.1``); :meth:`NetnsCluster.start_s3` starts an S3 server (moto) on
the services host.

    with Network(hosts=2, rate="1gbit", delay_ms=0.2, services=True) as net, NetnsCluster(net) as cluster:
        ... SparkSession.builder.master(cluster.url).config("spark.driver.host", net.root.address) ...
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from tests.cluster import StandaloneCluster
from tests.netns import Host, Network

__all__ = ["NetnsCluster"]


class NetnsCluster(StandaloneCluster):
    """A master on ``network``'s services host and one worker (``cores`` cores) on each of its hosts.
    ``worker_timeout_s``: Spark's ``spark.worker.timeout`` for the master and the workers (the master declares a
    worker lost, and its executors with it, after that long without a heartbeat; Spark's default is 60 s).

    Attributes:
        hosts: The host each worker runs on, by worker index.
    """

    def __init__(self, network: Network, cores: int = 1, memory: str = "2g", worker_timeout_s: int | None = None):
        if network.services is None:
            raise ValueError("NetnsCluster runs its master on the network's services host: make the Network with "
                             "services=True.")
        super().__init__(workers=len(network.hosts), cores=cores, memory=memory, host=network.services.address)
        self.network = network
        self.worker_timeout_s = worker_timeout_s
        self.hosts: list[Host] = []
        self.s3: subprocess.Popen | None = None

    def _env(self, **extra) -> dict:
        env = super()._env(**extra)
        if self.worker_timeout_s:
            env["SPARK_DAEMON_JAVA_OPTS"] = (env.get("SPARK_DAEMON_JAVA_OPTS", "") +
                                             f" -Dspark.worker.timeout={int(self.worker_timeout_s)}").strip()
        return env

    def _spawn(self, role: str, log: str, wrap=None, **env) -> subprocess.Popen:
        if role == "master":
            wrap = (lambda cmd: self.network.command(self.network.services, cmd))
        return super()._spawn(role, log, wrap, **env)

    def start_s3(self, bucket: str = "tfnet", timeout: float = 60) -> str:
        """Starts an S3 server (moto, a port the OS picks, read from its banner) on the services host,
        with ``bucket``; returns its endpoint. It stops with the cluster."""
        log = os.path.join(self.dir, "s3.log")
        with open(log, "wb") as out:
            self.s3 = self.network.popen(self.network.services, [
                sys.executable, "-m", "moto.server", "-H", self.network.services.address,
                "-p", "0"], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while True:
            banner = open(log, errors="replace").read()
            m = re.search(r"Running on (http://[0-9.]+:\d+)", banner)
            if m:
                break
            if self.s3.poll() is not None or time.time() > deadline:
                raise TimeoutError(f"moto_server on {self.network.services.address} did not start:\n{banner[-2000:]}")
            time.sleep(0.1)
        import boto3

        boto3.client("s3", endpoint_url=m.group(1), aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        return m.group(1)

    def stop(self) -> None:
        if self.s3 is not None and self.s3.poll() is None:
            self.s3.terminate()
            try:
                self.s3.wait(10)
            except subprocess.TimeoutExpired:
                self.s3.kill()
                self.s3.wait(10)
        super().stop()

    def add_worker(self, host: Host | None = None):
        """Starts a worker on ``host`` (default: the next host of the network)."""
        host = host or self.network.hosts[len(self.workers)]
        i = len(self.workers)
        proc = self._spawn("worker", f"worker-{i}.log", wrap=lambda cmd: self.network.command(host, cmd),
                           SPARK_LOCAL_IP=host.address, SPARK_WORKER_HOST=host.address, SPARK_MASTER_URL=self.url,
                           SPARK_WORKER_WEBUI_PORT="0", SPARK_WORKER_DIR=os.path.join("/tmp", f"spark-work-{i}"))
        self.workers.append(proc)
        self.hosts.append(host)
        return proc

    def kill_worker(self, index: int) -> None:
        """SIGKILLs every process on the worker's host: the worker, its executor and its Python
        workers (a host that is lost)."""
        self.network.kill_host(self.hosts[index])

    def worker_on(self, address: str) -> int:
        """The index of the worker on the host at ``address``."""
        for i, host in enumerate(self.hosts):
            if host.address == address:
                return i
        raise ValueError(f"No worker on {address}; the workers are on {[h.address for h in self.hosts]}.")
