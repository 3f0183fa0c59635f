"""How the ranks of a Spark Connect stage find the rendezvous store rank 0 hosts. Runs on the ranks
(a Spark executor's Python worker), but needs no PySpark: the ``BarrierTaskContext`` comes in as an
argument.

Spark's ``BarrierTaskContext.allGather`` answers a task that arrives before the others only at its
next one-second tick (measured with two tasks of a local[2] Spark 4: the first to arrive waits about
1.0 s, the last about 5 ms), and a Connect stage starts with it: that second was most of what a
Connect ``optimize()`` took over a classic one to reach its first step. So the address travels two
ways at once:

* rank 0 listens on one of a few ports the job's rendezvous key and attempt name
  (:func:`preferred_ports`; the OS's pick when all are taken) and every other rank probes them, asking
  for a value only a store keyed with the job's key and started for this attempt holds
  (:func:`proof`), so that another service on the port, or a store of an earlier attempt, is passed by;
* every rank also takes part in the ``allGather`` of the address, in a thread (:class:`AddressGather`):
  the barrier stays in step, and the gathered address is the answer when no port answered.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time

__all__ = ["AddressGather", "find_store", "preferred_ports", "proof", "proves", "start_store"]

HELLO_SCOPE = "tfnet_hello"
#: Where the preferred ports lie: below Linux's ephemeral range (32768-60999), whose ports the OS hands
#: out for outgoing connections.
PORT_BASE, PORT_SPAN = 20000, 12000
PROBE_TIMEOUT_S = 0.5


def preferred_ports(key: bytes, attempt: int, n: int = 3) -> list[int]:
    """The ports rank 0 tries first, in order: drawn from the job's rendezvous key and the attempt.

    >>> preferred_ports(b"k" * 32, 0) == preferred_ports(b"k" * 32, 0) != preferred_ports(b"k" * 32, 1)
    True
    """
    digest = hmac.new(key, f"tfnet-rendezvous-port/{int(attempt)}".encode(), hashlib.sha256).digest()
    return [PORT_BASE + int.from_bytes(digest[4 * i:4 * i + 4], "big") % PORT_SPAN for i in range(n)]


def proof(key: bytes, attempt: int) -> bytes:
    """What rank 0's store holds under ``tfnet_hello/attempt<N>``: only the job's key makes it."""
    return hmac.new(key, f"tfnet-rendezvous-hello/{int(attempt)}".encode(), hashlib.sha256).hexdigest().encode()


def start_store(host: str, size: int, key: bytes, attempt: int):
    """Rank 0's :class:`optim.transport.store.SecureRendezvous` on ``host``: on the first free
    preferred port, else on one the OS picks; it holds this attempt's :func:`proof`."""
    from optim.transport.store import SecureRendezvous

    for port in preferred_ports(key, attempt):
        try:
            store = SecureRendezvous(host, size, key, port=port)
            break
        except OSError:  # taken: the next one
            continue
    else:
        store = SecureRendezvous(host, size, key)
    store.put(HELLO_SCOPE, f"attempt{int(attempt)}", proof(key, attempt))
    return store


class AddressGather:
    """``BarrierTaskContext.allGather(value)`` in a thread: :meth:`result` is rank 0's value once
    every task has sent its own. Every task of the stage starts one, so the barrier's count stays the
    same on all of them."""

    def __init__(self, ctx, value: str):
        self._ctx, self._value = ctx, value
        self._out: list[str] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tfnet-store-address", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out = list(self._ctx.allGather(self._value))
        except BaseException as exc:  # noqa: BLE001 - handed to the task's own thread in result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout_s: float) -> str:
        """Rank 0's value; waits at most ``timeout_s``, then raises RendezvousError."""
        from optim.errors import RendezvousError

        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RendezvousError(f"The ranks did not all reach the start of the stage within {timeout_s:.0f} s.")
        if self._error is not None:
            raise self._error
        return self._out[0]


def proves(host: str, port: int, key: bytes, attempt: int) -> bool:
    """True when the store on ``host:port`` is this attempt's (it holds the :func:`proof`)."""
    from http.client import HTTPException

    from optim.errors import RendezvousError
    from optim.transport.client import get

    try:
        got = get((host, port), HELLO_SCOPE, f"attempt{int(attempt)}", timeout_s=PROBE_TIMEOUT_S, token=key)
    except (RendezvousError, HTTPException, OSError, ValueError):  # nothing there, or not this attempt's store
        return False
    return got is not None and hmac.compare_digest(got, proof(key, attempt))


def find_store(host: str, key: bytes, attempt: int, gather: AddressGather, timeout_s: float) -> tuple[str, int]:
    """Rank 0's store as seen from another rank: the first preferred port on rank 0's ``host`` that
    answers, or the address the ``allGather`` brings, whichever comes first."""
    from optim.errors import RendezvousError

    ports = preferred_ports(key, attempt)
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while not gather.done():
        for port in ports:
            if proves(host, port, key, attempt):
                return host, port
        if time.monotonic() > deadline:
            raise RendezvousError(f"Rank 0's rendezvous store did not come up within {timeout_s:.0f} s.")
        time.sleep(delay)
        delay = min(0.1, delay * 2)
    address, port = gather.result(0).rsplit(":", 1)
    return address, int(port)
