"""Hosts that are not one machine, on one machine: network namespaces on a switch, with shaped links.
For tests and benchmarks; needs root (``ip``, ``tc``, ``iptables``).

``with Network(hosts=2, rate="1gbit", delay_ms=0.2) as net:`` makes

* a **switch**: a namespace of its own holding a bridge (so the bridged traffic meets neither the
  machine's firewall nor Docker's, whose ``FORWARD`` policy drops it);
* **host 0 .. N-1**: a namespace each, with ``lo`` and ``eth0`` (one end of a veth pair whose other
  end is a port of the bridge) at ``<subnet>.11``, ``.12``, ... and only the subnet's route: no
  default route, so their traffic cannot leave the namespaces the network made;
* the **root host**: the machine's own namespace, on the bridge through a veth of its own at
  ``<subnet>.1`` (where a test's driver runs);
* with ``services=True``, a **services host**: a namespace at ``<subnet>.2`` for the Spark master and
  an S3 server, so that a killed run leaves no process outside the namespaces (the sweep kills them);
* **shaped links**: every link is limited to ``rate`` in each direction, and a packet from one host
  to another arrives ``delay_ms`` later (one way). With ``tc``'s ``netem`` in the kernel: ``netem
  rate R delay D/2`` on both ends of every link (two links between two hosts). Without it (this
  machine's kernel has no ``sch_netem``): ``tbf rate R`` on both ends, and the delay added at the
  switch: its ``FORWARD`` chain (which bridged packets reach through ``br_netfilter``) queues every
  IPv4 packet to :mod:`tests.netns_delay`, which accepts each one ``D`` after it arrived.

The subnet is the first ``192.168.240.0/24`` .. ``192.168.254.0/24`` that no address or route of the
machine uses, chosen under a lock. Every name the network makes starts with :data:`PREFIX` (namespaces)
or :data:`LINK_PREFIX` (links in the root namespace) and the creating process's id; :func:`sweep`
removes those of processes that no longer run (a run that was killed), and :meth:`Network.stop` its
own on every way out: the processes still inside its namespaces are killed first. Every command has
a timeout.

Faults on one host (issue 42): :meth:`Network.partition` cuts it off (``iptables`` DROP of everything in and out
of its ``eth0``) and :meth:`Network.heal` joins it again; :meth:`Network.impair` makes its link lossy (a random
fraction of what it sends dropped: ``-m statistic``) or slow (what it sends held ``delay_ms`` in its own namespace
by :mod:`tests.netns_delay` on a netfilter queue), as ``netem loss``/``netem delay`` on the link's end would.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "tfnh-"  # namespaces: tfnh-<pid>-<k>-sw, tfnh-<pid>-<k>-h<i>
LINK_PREFIX = "tfh"  # links made in the root namespace: tfh<pid hex>-<k><role>
SUBNETS = [f"192.168.{i}.0/24" for i in range(240, 255)]
LOCK = os.path.join(tempfile.gettempdir(), "tfnet-netns.lock")
CMD_TIMEOUT_S = 30.0
QUEUE = 0  # the switch's netfilter queue (its own namespace: no clash with other networks)
log = logging.getLogger("tests.netns")
_counter = itertools.count()


def _under_tmp(path: str) -> str | None:
    """The top folder under ``/tmp`` that holds ``path`` (``/tmp/a`` for ``/tmp/a/b/c``), else None."""
    parts = os.path.realpath(path).split(os.sep)
    return os.sep.join(parts[:3]) if len(parts) > 2 and parts[1] == "tmp" else None


class NetworkSetupError(RuntimeError):
    """The machine cannot make the network (not root, no veth or bridge, no way to delay packets)."""


def sh(*cmd: str, ns: str | None = None, check: bool = True, timeout: float = CMD_TIMEOUT_S) -> str:
    """Runs ``cmd`` (in namespace ``ns``) and returns its output; raises NetworkSetupError on failure."""
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    try:
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NetworkSetupError(f"`{' '.join(full)}` did not finish within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        raise NetworkSetupError(f"`{' '.join(full)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def ensure_tools() -> None:
    """``ip``, ``tc`` and ``iptables``, installed with apt where missing (scripts/host_tools.sh): this tier runs
    alone on a fresh machine, which has no iptables."""
    if all(shutil.which(tool) for tool in ("ip", "tc", "iptables")):
        return
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "host_tools.sh")], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise NetworkSetupError(f"scripts/host_tools.sh could not install ip, tc and iptables:\n{done.stderr[-2000:]}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILLs every process inside namespace ``ns`` (by id) and waits up to 10 s for them to go."""
    for _ in range(3):
        pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)


def _delete_namespace(ns: str) -> None:
    _kill_namespace(ns)
    sh("ip", "netns", "del", ns, check=False)


def sweep() -> list[str]:
    """Removes the namespaces and root links of networks whose creating process no longer runs (a
    run that was killed before it could clean up). Returns the names removed."""
    removed = []
    for line in sh("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{re.escape(PREFIX)}(\d+)-", name)
        if m and not _alive(int(m.group(1))):
            _delete_namespace(name)
            removed.append(name)
    for line in sh("ip", "-o", "link", "show", check=False).splitlines():
        m = re.match(rf"^\d+:\s+({re.escape(LINK_PREFIX)}([0-9a-f]+)-[^:@\s]+)", line)
        if m and not _alive(int(m.group(2), 16)):
            sh("ip", "link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    if removed:
        log.warning("Removed a killed run's test network: %s", ", ".join(removed))
    return removed


def _used_subnets() -> str:
    return sh("ip", "-4", "-o", "addr", "show") + sh("ip", "-4", "route", "show")


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_subnets()
    for cidr in SUBNETS:
        net = ipaddress.IPv4Network(cidr)
        if str(net.network_address)[:-1] not in used:  # "192.168.250." appears nowhere
            return net
    raise NetworkSetupError(f"No free subnet among {SUBNETS[0]} .. {SUBNETS[-1]}: the machine uses them all.")


def has_netem(ns: str, dev: str) -> bool:
    """Whether the kernel has ``tc``'s ``netem`` (tried on ``dev`` in ``ns``, then taken away)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms"],
                         capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if out.returncode != 0:
        return False
    sh("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)
    return True


def _rate_bits(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", rate.strip().lower())
    if not m:
        raise ValueError(f"`rate` must look like '1gbit', '10gbit' or '100mbit'. Received: {rate!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


@dataclass
class Host:
    """One host of the network: its name (``h0``, ``h1``, ..., ``sv``, ``root``), its namespace (None:
    the root host), its address, and a private temporary folder (bound over ``/tmp`` for what
    :meth:`Network.popen` starts there)."""

    name: str
    ns: str | None
    address: str
    tmp: str
    dev: str = ""  # its end of its link
    port: str = ""  # the switch's end


class Network:
    """``hosts`` namespaces and the root host on one switch; see the module.

    Args:
        hosts: Namespaced hosts (for Spark's workers).
        services: Add the services host (``.2``, for the master and an S3 server). Default False.
        rate: Each link's rate in each direction, as ``tc`` writes it (``"1gbit"``, ``"10gbit"``);
            None: not limited.
        delay_ms: One-way delay between two hosts (milliseconds); 0: none.
        shaping: ``"auto"`` (netem when the kernel has it, else tbf and the switch's queue),
            ``"netem"`` or ``"tbf+queue"``.

    Attributes:
        hosts: The namespaced :class:`Host` s; ``root``: the root host; ``services``: the services
            host, or None.
        shaping: What shapes the links (``"netem"``, ``"tbf+queue"`` or ``"none"``).
        subnet: The network's ``/24``.
    """

    def __init__(self, hosts: int = 2, rate: str | None = "1gbit", delay_ms: float = 0.2, shaping: str = "auto",
                 services: bool = False):
        if shaping not in ("auto", "netem", "tbf+queue"):
            raise ValueError(f"`shaping` must be 'auto', 'netem' or 'tbf+queue'. Received: {shaping!r}")
        if rate is not None:
            _rate_bits(rate)
        self.n, self.rate, self.delay_ms, self.wanted, self.with_services = hosts, rate, float(delay_ms), shaping, services
        self.tag = f"{os.getpid()}-{next(_counter)}"
        self.link_tag = f"{LINK_PREFIX}{os.getpid():x}-{int(self.tag.split('-')[1]) % 16:x}"
        self.switch = f"{PREFIX}{self.tag}-sw"
        self.hosts: list[Host] = []
        self.root: Host | None = None
        self.services: Host | None = None
        self.shaping = "none"
        self.subnet: ipaddress.IPv4Network | None = None
        self.dir = tempfile.mkdtemp(prefix="tfnet-netns-")
        self._made: list[tuple[str, str]] = []  # ("ns", name) / ("link", name), to take away
        self._delay: subprocess.Popen | None = None
        self.delay_stats: dict | None = None
        self._impaired: dict[str, tuple[list[list[str]], subprocess.Popen | None]] = {}  # host name -> (rules, delay)

    # ------------------------------------------------------------ making it

    def start(self) -> Network:
        if os.geteuid() != 0:
            raise NetworkSetupError("Network namespaces need root (ip netns add).")
        ensure_tools()
        sweep()
        try:
            with open(LOCK, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.subnet = _free_subnet()
                self._switch()
                self.root = self._link("root", 1)  # takes the subnet's .1 in the root namespace: seen by the next run
            if self.with_services:
                self.services = self._link("sv", 2)
            for i in range(self.n):
                self.hosts.append(self._link(f"h{i}", 11 + i))
            self._shape()
        except BaseException:
            self.stop()
            raise
        return self

    def _ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self._made.append(("ns", name))
        sh("ip", "link", "set", "lo", "up", ns=name)

    def _switch(self) -> None:
        self._ns(self.switch)
        sh("ip", "link", "add", "br0", "type", "bridge", ns=self.switch)
        sh("ip", "link", "set", "br0", "up", ns=self.switch)

    def _link(self, role: str, last: int) -> Host:
        """The host ``role`` (``root``: this machine's namespace) at the subnet's address ``last``, and
        its link to the switch."""
        address = str(self.subnet.network_address + last)
        short = "r" if role == "root" else role  # link names have at most 15 characters
        near, far = f"{self.link_tag}{short}", f"{self.link_tag}{short}s"  # far: the switch's port
        sh("ip", "link", "add", near, "type", "veth", "peer", "name", far)
        self._made.append(("link", near))
        sh("ip", "link", "set", far, "netns", self.switch)
        sh("ip", "link", "set", far, "master", "br0", ns=self.switch)
        sh("ip", "link", "set", far, "up", ns=self.switch)
        ns = None
        dev = near
        if role != "root":
            ns = f"{PREFIX}{self.tag}-{role}"
            self._ns(ns)
            sh("ip", "link", "set", near, "netns", ns)
            sh("ip", "link", "set", near, "name", "eth0", ns=ns)
            dev = "eth0"
        run = (lambda *c: sh(*c, ns=ns))
        run("ip", "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", dev)
        run("ip", "link", "set", dev, "up")
        tmp = os.path.join(self.dir, role)
        os.makedirs(tmp, mode=0o1777)
        os.chmod(tmp, 0o1777)
        return Host(role, ns, address, tmp, dev, far)

    def _shape(self) -> None:
        """Rate and delay on every link (see the module)."""
        if self.rate is None and not self.delay_ms:
            return
        mode = self.wanted
        if mode == "auto":
            mode = "netem" if has_netem(self.switch, "br0") else "tbf+queue"
        if mode == "tbf+queue" and self.delay_ms:
            self._start_delay()
        for host in self.all_hosts():
            for ns, dev in ((host.ns, host.dev), (self.switch, host.port)):
                sh("tc", "qdisc", "add", "dev", dev, "root", *self._qdisc(mode), ns=ns)
        self.shaping = mode

    def reshape(self, rate: str | None) -> None:
        """Gives every link another ``rate`` (the delay stays as it is)."""
        if rate is not None:
            _rate_bits(rate)
        if self.shaping == "none":
            raise ValueError("The links were made without shaping: make the network with a rate or a delay.")
        self.rate = rate
        for host in self.all_hosts():
            for ns, dev in ((host.ns, host.dev), (self.switch, host.port)):
                sh("tc", "qdisc", "replace", "dev", dev, "root", *self._qdisc(self.shaping), ns=ns)

    def _qdisc(self, mode: str) -> list[str]:
        if mode == "netem":
            args = ["netem"]
            if self.rate:
                args += ["rate", self.rate]
            if self.delay_ms:
                args += ["delay", f"{self.delay_ms / 2 * 1000:.0f}us"]
            return args + ["limit", "100000"]
        if not self.rate:
            return ["pfifo", "limit", "100000"]
        # a burst of at least two 64 KiB segments (GSO) and 0.5 ms at the rate; up to 20 ms queued
        burst = max(256 << 10, int(_rate_bits(self.rate) / 8 * 5e-4))
        return ["tbf", "rate", self.rate, "burst", str(burst), "latency", "20ms"]

    def _start_delay(self) -> None:
        """The switch's delay (:mod:`tests.netns_delay`) and the rule that queues every bridged IPv4
        packet to it."""
        try:
            bridged = sh("cat", "/proc/sys/net/bridge/bridge-nf-call-iptables", ns=self.switch).strip()
        except NetworkSetupError:
            bridged = ""
        if bridged != "1":
            raise NetworkSetupError(
                "The kernel has no tc netem, and bridged packets do not reach iptables (br_netfilter is not loaded, or "
                "net.bridge.bridge-nf-call-iptables is 0): the links cannot be delayed. Load sch_netem or br_netfilter.")
        stats = os.path.join(self.dir, "delay.json")
        self._delay = subprocess.Popen(
            ["ip", "netns", "exec", self.switch, sys.executable, "-m", "tests.netns_delay", str(QUEUE),
             str(self.delay_ms), stats], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "delay.log"), "wb"), start_new_session=True)
        deadline = time.monotonic() + 20
        while not os.path.exists(stats + ".ready"):
            if self._delay.poll() is not None or time.monotonic() > deadline:
                raise NetworkSetupError("The switch's delay did not start: "
                                        + open(os.path.join(self.dir, "delay.log")).read()[-2000:])
            time.sleep(0.05)
        sh("iptables", "-w", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass",
           ns=self.switch)

    # ------------------------------------------------------------ using it

    def all_hosts(self) -> list[Host]:
        """The root host, the services host (if any) and the namespaced hosts."""
        return [self.root, *([self.services] if self.services else []), *self.hosts]

    def command(self, host: Host, cmd: list[str]) -> list[str]:
        """``cmd`` as it runs on ``host``: in its namespace, with its own ``/tmp`` (a private mount)."""
        if host.ns is None:
            return list(cmd)
        # a checkout or a virtual environment under /tmp (a clone made there) stays visible through the
        # private /tmp: bound at the same path inside it first
        keep = sorted({_under_tmp(p) for p in (ROOT, sys.prefix, os.path.realpath(sys.executable))} - {None})
        binds = "".join(f'mkdir -p "$0{p[4:]}" && mount --bind "{p}" "$0{p[4:]}" && ' for p in keep)
        return ["ip", "netns", "exec", host.ns, "sh", "-c", binds + 'mount --rbind "$0" /tmp && exec "$@"', host.tmp,
                *cmd]

    def popen(self, host: Host, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Starts ``cmd`` on ``host`` (:meth:`command`), in a session of its own."""
        return subprocess.Popen(self.command(host, cmd), start_new_session=True, **kwargs)

    def kill_host(self, host: Host) -> None:
        """SIGKILLs every process on ``host`` (a lost machine; the namespace and its link stay)."""
        if host.ns is None:
            raise ValueError("The root host is this machine: it cannot be killed.")
        _kill_namespace(host.ns)

    # ------------------------------------------------------------ faults on one host

    _CUT = (["INPUT", "-i", "eth0", "-j", "DROP"], ["OUTPUT", "-o", "eth0", "-j", "DROP"])

    def partition(self, host: Host) -> None:
        """Cuts ``host`` off: every packet into or out of its link dropped (its processes run on, unreachable)."""
        if host.ns is None:
            raise ValueError("The root host is this machine: it cannot be cut off.")
        for rule in self._CUT:
            sh("iptables", "-w", "-I", rule[0], "1", *rule[1:], ns=host.ns)

    def heal(self, host: Host) -> None:
        """Undoes :meth:`partition`."""
        for rule in self._CUT:
            sh("iptables", "-w", "-D", *rule, ns=host.ns, check=False)

    def impair(self, host: Host, loss: float = 0.0, delay_ms: float = 0.0) -> None:
        """What ``host`` sends is dropped with probability ``loss`` and held ``delay_ms`` before it leaves (one end
        of its link, as ``netem loss`` and ``netem delay`` on it). :meth:`unimpair` takes it away."""
        if host.ns is None:
            raise ValueError("The root host is this machine: impair a namespaced host.")
        self.unimpair(host)
        rules, delay = [], None
        if delay_ms:
            stats = os.path.join(self.dir, f"delay-{host.name}.json")
            delay = subprocess.Popen(["ip", "netns", "exec", host.ns, sys.executable, "-m", "tests.netns_delay", "1",
                                      str(delay_ms), stats], cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.dir, f"delay-{host.name}.log"), "wb"),
                                     start_new_session=True)
            deadline = time.monotonic() + 20
            while not os.path.exists(stats + ".ready"):
                if delay.poll() is not None or time.monotonic() > deadline:
                    raise NetworkSetupError(f"The delay on {host.name} did not start.")
                time.sleep(0.05)
            rules.append(["OUTPUT", "-o", "eth0", "-j", "NFQUEUE", "--queue-num", "1", "--queue-bypass"])
        if loss:
            rules.append(["OUTPUT", "-o", "eth0", "-m", "statistic", "--mode", "random", "--probability", str(loss),
                          "-j", "DROP"])
        for rule in rules:
            sh("iptables", "-w", "-I", rule[0], "1", *rule[1:], ns=host.ns)
        self._impaired[host.name] = (rules, delay)

    def unimpair(self, host: Host) -> None:
        """Takes :meth:`impair` away (the rules, then the delay's process)."""
        rules, delay = self._impaired.pop(host.name, ([], None))
        for rule in rules:
            sh("iptables", "-w", "-D", *rule, ns=host.ns, check=False)
        if delay is not None and delay.poll() is None:
            os.killpg(delay.pid, signal.SIGTERM)
            try:
                delay.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(delay.pid, signal.SIGKILL)
                delay.wait(10)

    def dropped(self, host: Host) -> int:
        """Packets :meth:`impair` and :meth:`partition` have dropped on ``host`` (its DROP rules' counters)."""
        total = 0
        for chain in ("INPUT", "OUTPUT"):
            for line in sh("iptables", "-w", "-nvxL", chain, ns=host.ns).splitlines():
                parts = line.split()
                if len(parts) > 2 and parts[0].isdigit() and parts[2] == "DROP":
                    total += int(parts[0])
        return total

    def count_traffic(self) -> None:
        """Starts counting the bytes each namespaced host sends to each other host (iptables
        rules without a target in its ``OUTPUT`` chain); read them with :meth:`sent_bytes`."""
        for host in self.hosts:
            for other in self.all_hosts():
                if other is not host:
                    sh("iptables", "-w", "-A", "OUTPUT", "-o", "eth0", "-d", other.address, ns=host.ns)

    def sent_bytes(self, host: Host) -> dict[str, int]:
        """The bytes ``host`` has sent to each other host's address since :meth:`count_traffic`."""
        out = {}
        for line in sh("iptables", "-w", "-nvxL", "OUTPUT", ns=host.ns).splitlines():
            parts = line.split()
            if len(parts) >= 8 and parts[0].isdigit():
                out[parts[7]] = out.get(parts[7], 0) + int(parts[1])
        return out

    _WATCH = "tfnet-watch"

    def watch_sent(self, host: Host, to: Host) -> Callable[[], int]:
        """Counts the bytes ``host`` sends to ``to`` from now on, ahead of every rule of its ``OUTPUT`` chain so far
        (the packets that :meth:`impair` holds back included, as they enter its queue); returns a function that reads
        the count. :meth:`unwatch_sent` takes the rule away (while it is there, :meth:`sent_bytes` counts twice)."""
        rule = ["OUTPUT", "-o", "eth0", "-d", to.address, "-m", "comment", "--comment", self._WATCH]
        sh("iptables", "-w", "-I", rule[0], "1", *rule[1:], ns=host.ns)

        def read() -> int:
            for line in sh("iptables", "-w", "-nvxL", "OUTPUT", ns=host.ns).splitlines():
                parts = line.split()
                if self._WATCH in line and len(parts) >= 8 and parts[7] == to.address:
                    return int(parts[1])
            return 0

        return read

    def unwatch_sent(self, host: Host, to: Host) -> None:
        """Takes :meth:`watch_sent`'s rule away."""
        sh("iptables", "-w", "-D", "OUTPUT", "-o", "eth0", "-d", to.address, "-m", "comment", "--comment",
           self._WATCH, ns=host.ns, check=False)

    def measure(self, a: Host, b: Host, seconds: float = 2.0) -> dict:
        """What the link from ``a`` to ``b`` gives one TCP connection: the median round trip of one
        byte (``rtt_ms``, over 200) and the rate of a stream (``gbit_s``, for ``seconds``)."""
        server = self.popen(b, [sys.executable, "-c", _ECHO_SERVER, b.address], stdout=subprocess.PIPE, text=True)
        try:
            ready = server.stdout.readline()
            if not ready.startswith("PORT "):
                raise NetworkSetupError(f"The echo server on {b.address} did not start: {ready!r}")
            out = subprocess.run(self.command(a, [sys.executable, "-c", _PROBE, b.address, ready.split()[1],
                                                  str(seconds)]), capture_output=True, text=True,
                                 timeout=seconds + 60)
            if out.returncode != 0:
                raise NetworkSetupError(f"The link probe from {a.address} to {b.address} failed: {out.stderr[-1000:]}")
            return json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            server.kill()
            server.wait(10)

    def routes(self, host: Host) -> list[str]:
        """The host's IPv4 routes."""
        return [r for r in sh("ip", "-4", "route", "show", ns=host.ns).splitlines() if r.strip()]

    # ------------------------------------------------------------ taking it away

    def stop(self) -> None:
        """Stops the switch's delay (its figures go to ``delay_stats``), kills every process in the
        network's namespaces, then removes them and the links. Safe to call twice."""
        for host in [h for h in self.hosts if h.name in self._impaired]:
            self.unimpair(host)
        if self._delay is not None:
            if self._delay.poll() is None:
                os.killpg(self._delay.pid, signal.SIGTERM)
                try:
                    self._delay.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(self._delay.pid, signal.SIGKILL)
                    self._delay.wait(10)
            stats = os.path.join(self.dir, "delay.json")
            if os.path.exists(stats):
                with open(stats) as f:
                    self.delay_stats = json.load(f)
            self._delay = None
        for kind, name in reversed(self._made):
            if kind == "ns":
                _delete_namespace(name)
            else:
                sh("ip", "link", "del", name, check=False)
        self._made.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_ECHO_SERVER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(1)
print("PORT", s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    d = c.recv(1 << 20)
    if not d:
        break
    if len(d) == 1:
        c.sendall(d)
"""

_PROBE = """
import json, socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(200):
    t = time.perf_counter()
    c.sendall(b"x")
    c.recv(1)
    rtts.append(time.perf_counter() - t)
rtts.sort()
buf, sent, t = b"\\0" * (1 << 20), 0, time.perf_counter()
while time.perf_counter() - t < float(sys.argv[3]):
    c.sendall(buf)
    sent += len(buf)
print(json.dumps({"rtt_ms": rtts[100] * 1e3, "gbit_s": sent * 8 / (time.perf_counter() - t) / 1e9}))
"""
