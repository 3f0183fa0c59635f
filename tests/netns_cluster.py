"""A Spark standalone cluster whose workers are hosts of their own: each worker runs in a network
namespace of a :class:`tests.netns.Network` (its own address, loopback and ``/tmp``, a shaped link
to the switch), started through docker/entrypoint.sh as :class:`tests.cluster.StandaloneCluster`
starts its workers. The master sits on the network's root host (this machine's namespace, at the
subnet's ``.1``), where the driver and an S3 server can sit too.

    with Network(hosts=2, rate="1gbit", delay_ms=0.2) as net, NetnsCluster(net) as cluster:
        ... SparkSession.builder.master(cluster.url).config("spark.driver.host", net.root.address) ...
"""

from __future__ import annotations

import os

from tests.cluster import StandaloneCluster
from tests.netns import Host, Network

__all__ = ["NetnsCluster"]


class NetnsCluster(StandaloneCluster):
    """A master on ``network``'s root host and one worker (``cores`` cores) on each of its hosts.

    Attributes:
        hosts: The host each worker runs on, by worker index.
    """

    def __init__(self, network: Network, cores: int = 1, memory: str = "2g"):
        super().__init__(workers=len(network.hosts), cores=cores, memory=memory, host=network.root.address)
        self.network = network
        self.hosts: list[Host] = []

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
