"""Driving the Docker tier: the engine (scripts/docker_env.sh), the image (scripts/docker_build.sh from a
clean clone) and a compose project of docker/docker-compose.yml. Every call has a timeout."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

from tests import spark_jvm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE_FILE = os.path.join(ROOT, "docker", "docker-compose.yml")
# the override for a cluster with no shared disk (each container its own /shared; AWS_* passed through)
NO_SHARED_DISK_FILE = os.path.join(ROOT, "docker", "docker-compose.s3.yml")
#: The tier's own override, after the others: the cluster's JVMs with the host suite's Java options (the
#: client compiler alone: tests/docker/jvm-options.yml says why and how each JVM gets them)
JVM_OPTIONS_FILE = os.path.join(ROOT, "tests", "docker", "jvm-options.yml")


def sh(cmd: list[str], timeout: float, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Runs ``cmd`` with captured text output; on failure (and ``check``) raises with its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited with {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


#: Run with a container's Python: its JVMs, as ``[[main class, whether the image's class-data archive is mapped, whether
#: it runs with the client compiler alone]]`` (the first ``org.apache.spark.`` argument of each ``java`` command line,
#: /proc/PID/maps, and ``-XX:TieredStopAtLevel=1`` on the command line: tests/docker/jvm-options.yml).
JVMS = """
import json, os
out = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\\0")
        if not args[0].endswith("java"):
            continue
        main = next((a for a in args if a.startswith("org.apache.spark.")), "?").rsplit(".", 1)[-1]
        out.append([main, "/tmp/tfnet-spark.jsa" in open(f"/proc/{pid}/maps").read(), "-XX:TieredStopAtLevel=1" in args])
    except OSError:
        pass
print(json.dumps(sorted(out)))
"""


def bridge_candidates(network: dict) -> list[tuple[str, str]]:
    """Where the host may be reached from containers, read from ``docker network inspect bridge``'s
    JSON, best first, as ``(address, how it was found)``: the IPAM gateway when the engine reports one;
    else the address of the bridge's interface (``docker0`` unless the network names another); else the
    first host of each IPAM subnet. Debian's engine 20.10 reports the subnet alone on a fresh machine."""
    out: list[tuple[str, str]] = []
    configs = (network.get("IPAM") or {}).get("Config") or []
    for cfg in configs:
        gateway = (cfg.get("Gateway") or "").split("/")[0]
        if gateway:
            out.append((gateway, "IPAM gateway"))
    iface = (network.get("Options") or {}).get("com.docker.network.bridge.name") or "docker0"
    addr = interface_ipv4(iface)
    if addr:
        out.append((addr, f"address of interface {iface}"))
    for cfg in configs:
        subnet = cfg.get("Subnet") or ""
        try:
            net = ipaddress.ip_network(subnet, strict=False)
        except ValueError:
            continue
        if net.version == 4 and net.num_addresses > 2:
            out.append((str(net.network_address + 1), f"first host of subnet {subnet}"))
    seen: set[str] = set()
    return [(a, how) for a, how in out if not (a in seen or seen.add(a))]


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (``SIOCGIFADDR``), or None."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def bindable(address: str) -> str | None:
    """None when a TCP socket binds to ``address`` on this host (so a server can listen there), else why not."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


def host_address_for_containers(network: str = "bridge") -> str:
    """This host's address on Docker's default bridge: the address that ``host-gateway`` (so
    ``host.docker.internal`` in docker/docker-compose.s3.yml) names inside containers, and one a server
    on the host can bind. Tries :func:`bridge_candidates` in order and takes the first that binds;
    raises ``RuntimeError`` listing every candidate and why it was refused."""
    raw = sh(["docker", "network", "inspect", network], timeout=60).stdout
    return first_bindable(bridge_candidates(json.loads(raw)[0]), f"`docker network inspect {network}` says: {raw[:2000]}")


def first_bindable(candidates: list[tuple[str, str]], context: str) -> str:
    """The first address of ``candidates`` that a server can bind; else ``RuntimeError`` naming each
    candidate and why it was refused, then ``context``."""
    tried = []
    for address, how in candidates:
        why = bindable(address)
        if why is None:
            return address
        tried.append(f"{address} ({how}): {why}")
    raise RuntimeError("no address of this host on Docker's bridge network could be found and bound. Tried: "
                       f"{'; '.join(tried) or 'nothing (no gateway, no bridge interface address, no IPv4 subnet)'}. "
                       f"{context}")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def clean_clone(dest: str) -> str:
    """A clone of this repository at ``dest`` plus the working tree's uncommitted changes (tracked
    edits and untracked files git does not ignore): what a clean clone of this state would hold,
    without .venv, build outputs or anything else git ignores."""
    sh(["git", "clone", "--quiet", "--no-hardlinks", ROOT, dest], timeout=120)
    diff = sh(["git", "-C", ROOT, "diff", "--binary", "HEAD"], timeout=60).stdout
    if diff.strip():
        subprocess.run(["git", "-C", dest, "apply", "--whitespace=nowarn"], input=diff, text=True, check=True,
                       timeout=60)
    untracked = sh(["git", "-C", ROOT, "ls-files", "-o", "--exclude-standard", "-z"], timeout=60).stdout
    for rel in filter(None, untracked.split("\0")):
        os.makedirs(os.path.dirname(os.path.join(dest, rel)) or dest, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), os.path.join(dest, rel))
    return dest


def build_image(clone: str, tag: str, log_path: str) -> float:
    """scripts/docker_build.sh in ``clone``; the wheelhouse is made with this interpreter's pip.
    Returns the seconds it took."""
    env = dict(os.environ, TFNET_PYTHON=sys.executable)
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.run(["bash", "scripts/docker_build.sh", tag], cwd=clone, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=3000, check=False)
    if proc.returncode != 0:
        with open(log_path, errors="replace") as f:
            raise RuntimeError(f"scripts/docker_build.sh exited with {proc.returncode}; its log ends with:\n"
                               f"{f.read()[-5000:]}")
    return time.time() - t0


class Compose:
    """One project of docker/docker-compose.yml (and the ``overrides`` files after it) under a unique
    name, on ``image``; ``env``: more variables for docker-compose (what the files substitute or pass on)."""

    def __init__(self, image: str, worker_cores: int = 1, worker_memory: str = "3g", overrides: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.project = f"tfnettest{uuid.uuid4().hex[:8]}"
        self.env = dict(os.environ, TFNET_IMAGE=image, WORKER_CORES=str(worker_cores), WORKER_MEMORY=worker_memory,
                        TFNET_MASTER_UI_PORT="", TFNET_CONNECT_PORT="",  # "": a port the host picks
                        COMPOSE_PROJECT_NAME=self.project,
                        TFNET_TEST_JAVA_OPTIONS=spark_jvm.java_options())  # what JVM_OPTIONS_FILE gives each JVM
        self.env.pop("SPARK_LOCAL_IP", None)  # the host's setting must not leak into the containers
        self.env.update(env or {})
        self.files = [a for f in (COMPOSE_FILE, *overrides, JVM_OPTIONS_FILE) for a in ("-f", f)]

    def __call__(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return sh(["docker-compose", *self.files, "-p", self.project, *args], timeout=timeout, check=check,
                  env=self.env)

    def up(self, timeout: float = 240) -> None:
        self("up", "-d", timeout=timeout)
        deadline = time.time() + timeout
        while time.time() < deadline:
            states = [self.inspect(c)["State"] for c in self.containers()]
            if len(states) == 3 and all(s.get("Health", {}).get("Status") == "healthy" for s in states):
                return
            time.sleep(1)
        raise TimeoutError(f"the cluster was not healthy within {timeout} s:\n{self('logs', '--tail', '30').stdout}")

    def run(self, service: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """``docker-compose run --rm -T service args``; its exit code is the job's."""
        return self("run", "--rm", "-T", service, *args, timeout=timeout, check=False)

    def start(self, service: str, *args: str) -> subprocess.Popen:
        """``docker-compose run --rm -T service args`` in the background (text pipes)."""
        return subprocess.Popen(["docker-compose", *self.files, "-p", self.project, "run", "--rm", "-T", service, *args],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def containers(self, service: str | None = None) -> list[str]:
        """The ids of the project's containers (of ``service``), what ``docker-compose ps -q`` lists: the labels
        Compose sets, read by Docker's own CLI (Compose v1 is a Python program: 0.6 CPU-s a call, and ``up`` asked
        once a second)."""
        labels = [f"com.docker.compose.project={self.project}"]  # one-off ``run`` containers too, as Compose v1 lists them
        labels += [f"com.docker.compose.service={service}"] if service else []
        out = sh(["docker", "ps", "-a", "-q", "--no-trunc", *(a for label in labels for a in ("--filter", f"label={label}"))],
                 timeout=60).stdout
        return sorted(out.split())

    @staticmethod
    def inspect(container: str) -> dict:
        return json.loads(sh(["docker", "inspect", container], timeout=60).stdout)[0]

    @staticmethod
    def jvms(container: str) -> list[list]:
        """The container's JVMs as ``[main class, maps the image's class-data archive, C1 alone]`` (:data:`JVMS`)."""
        return json.loads(sh(["docker", "exec", container, "python", "-c", JVMS], timeout=60).stdout)

    def master(self) -> str:
        return self.containers("spark-master")[0]

    def exec_master(self, *cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return sh(["docker", "exec", self.master(), *cmd], timeout=timeout, check=check)

    def copy_in(self, src: str, dest: str) -> None:
        """``docker cp`` into the master (onto /shared), then owned by the image's user: docker cp keeps
        the host's owner (root) and modes (tfnet's atomic writers make 0600 files)."""
        sh(["docker", "cp", src, f"{self.master()}:{dest}"], timeout=120)
        sh(["docker", "exec", "-u", "0", self.master(), "chown", "-R", "tfnet:tfnet", dest], timeout=60)

    def copy_out(self, src: str, dest: str) -> None:
        sh(["docker", "cp", f"{self.master()}:{src}", dest], timeout=120)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes still labelled with this project."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": self.containers(),
            "networks": sh(["docker", "network", "ls", "-q", "--filter", label], timeout=60).stdout.split(),
            "volumes": sh(["docker", "volume", "ls", "-q", "--filter", label], timeout=60).stdout.split(),
        }

    def down(self) -> None:
        self("down", "-v", "--remove-orphans", "--timeout", "10", timeout=180, check=False)
