"""Where a rank meets the others on the network: the interface Gloo listens on (:func:`gloo_iface`,
:func:`iface_address`), and whether Horovod's process sets could reach this rank from another host
(:func:`check_process_sets`). Worker side: runs in each rank's process, before ``hvd.init()``
(:func:`optim.rank.rank.run_rank`); needs no Spark.
"""

from __future__ import annotations

__all__ = ["PROCESS_SET_IFACE_PATCH", "address_toward", "check_process_sets", "gloo_iface", "horovod_patches",
           "iface_address", "iface_for", "process_set_problem"]


def iface_for(address: str) -> str | None:
    """The network interface that holds ``address`` (an IP or a name), so Gloo listens where peers
    can reach it; None when no interface holds it."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return None
    import socket

    try:
        ip = socket.gethostbyname(address)
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.address == ip:
                return name
    return None


def _is_loopback(address: str | None) -> bool:
    import ipaddress

    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def address_toward(peer: str) -> str | None:
    """This host's address on the route to ``peer`` (the one the kernel would send from); None when
    ``peer`` does not resolve or no route leads there."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(peer), 9))  # a UDP "connection" sends nothing
            return s.getsockname()[0]
    except OSError:
        return None


def gloo_iface(address: str, peer: str | None = None) -> str | None:
    """The interface Gloo listens on, for a rank whose executor is at ``address`` and meets the others
    through ``peer`` (the rendezvous host): the interface that holds ``address``; but when none holds
    it (a host name that resolves elsewhere, such as Debian's ``127.0.1.1``), or it is a loopback while
    ``peer`` is not (ranks on other hosts cannot reach a loopback), the interface on the route to
    ``peer``. None when neither is known (Gloo then binds the address of the host's name).

    >>> gloo_iface("127.0.0.1", "127.0.0.1")
    'lo'
    """
    iface = iface_for(address)
    if peer is None:
        return iface
    unreachable = iface is None or (_is_loopback(iface_address(iface)) and not _peer_is_loopback(peer))
    if not unreachable:
        return iface
    toward = address_toward(peer)
    return (toward and iface_for(toward)) or iface


def _peer_is_loopback(peer: str) -> bool:
    import socket

    try:
        return _is_loopback(socket.gethostbyname(peer))
    except OSError:
        return False


def iface_address(iface: str | None) -> str | None:
    """The IPv4 address of the interface ``iface`` (None for None, or an interface without one)."""
    if iface is None:
        return None
    import socket

    import psutil

    return next((a.address for a in psutil.net_if_addrs().get(iface, []) if a.family == socket.AF_INET), None)


#: What tfnet's scripts/build_horovod.sh patches in Horovod 0.28.1 (recorded in ``horovod.tfnet_patches``).
PROCESS_SET_IFACE_PATCH = "gloo-iface-for-process-sets"


def horovod_patches() -> tuple[str, ...]:
    """The patches tfnet's build made in the installed Horovod (empty for a Horovod built elsewhere)."""
    try:
        from horovod.tfnet_patches import PATCHES
    except ImportError:
        return ()
    return tuple(PATCHES)


def process_set_problem(patched: bool, gloo_address: str | None, name_addresses: list[str],
                        hosts: list[str]) -> str | None:
    """Why Horovod's collectives cannot reach this rank, or None. Horovod 0.28.1 as released makes the
    Gloo device of its process sets (the global one carries every collective) on the address of the
    host's name, not on ``HOROVOD_GLOO_IFACE``; when that name resolves to a loopback address
    (``name_addresses``) while the ranks meet over ``gloo_address`` from more than one host (``hosts``:
    every rank's executor address), the ranks of other hosts cannot connect and Horovod aborts the
    process. tfnet's build patches it (:data:`PROCESS_SET_IFACE_PATCH`).

    >>> process_set_problem(False, "10.0.0.5", ["127.0.1.1"], ["10.0.0.5", "10.0.0.6"]) is not None
    True
    >>> process_set_problem(True, "10.0.0.5", ["127.0.1.1"], ["10.0.0.5", "10.0.0.6"]) is None
    True
    >>> process_set_problem(False, "10.0.0.5", ["127.0.1.1"], ["10.0.0.5", "10.0.0.5"]) is None  # one host
    True
    """
    if patched or gloo_address is None or _is_loopback(gloo_address) or len(set(hosts)) < 2:
        return None
    bindable = [a for a in name_addresses if a]
    if not bindable or not _is_loopback(bindable[0]):
        return None
    import socket

    return (f"Horovod's collectives would listen on {bindable[0]}, the address of this host's name "
            f"({socket.gethostname()!r}), which the ranks on other hosts cannot reach; the ranks meet over "
            f"{gloo_address}. Horovod 0.28.1 as released makes the Gloo device of its process sets there, whatever "
            "HOROVOD_GLOO_IFACE says: rebuild it with tfnet's scripts/build_horovod.sh (which patches that), or "
            f"make the host's name resolve to {gloo_address} (/etc/hosts).")


def _name_addresses() -> list[str]:
    """The addresses of this host's name, in the resolver's order (what Gloo binds without an interface)."""
    import socket

    try:
        return [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET,
                                                          socket.SOCK_STREAM)]
    except OSError:
        return []


def check_process_sets(gloo_address: str | None, hosts: list[str]) -> None:
    """Raises SparkSetupError when Horovod's collectives could not reach this rank from another host
    (:func:`process_set_problem`; ``hosts``: every rank's executor address), before ``hvd.init()``
    aborts the process over it."""
    why = process_set_problem(PROCESS_SET_IFACE_PATCH in horovod_patches(), gloo_address, _name_addresses(), hosts)
    if why:
        from optim.errors import SparkSetupError

        raise SparkSetupError(why)
