"""A few calls to the driver's rendezvous server (Horovod's HTTP key-value store), used by the
ranks before Horovod starts: claiming a rank once per launch, and exchanging small values faster
than Spark's barrier ``allGather`` (which polls once a second). Worker side. Every call has a
timeout."""

from __future__ import annotations

import time
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from tfnet.errors import TFNetError


class RendezvousError(TFNetError, RuntimeError):
    """The driver's rendezvous server did not answer, or the ranks did not all arrive in time."""


def _url(addr: tuple[str, int], scope: str, key: str) -> str:
    return f"http://{addr[0]}:{addr[1]}/{scope}/{key}"


def get(addr, scope: str, key: str, timeout_s: float = 10.0) -> bytes | None:
    """The value, or None if the key is not there."""
    try:
        return urlopen(Request(_url(addr, scope, key)), timeout=timeout_s).read()
    except HTTPError as exc:
        if exc.code == 404:
            return None
        raise RendezvousError(f"The rendezvous server at {addr[0]}:{addr[1]} answered {exc.code}.") from None
    except (URLError, OSError) as exc:
        raise RendezvousError(f"Cannot reach the driver's rendezvous server at {addr[0]}:{addr[1]}: {exc}") from None


def put(addr, scope: str, key: str, value: bytes, timeout_s: float = 10.0) -> None:
    try:
        urlopen(Request(_url(addr, scope, key), data=value, method="PUT"), timeout=timeout_s).read()
    except (URLError, OSError) as exc:
        raise RendezvousError(f"Cannot reach the driver's rendezvous server at {addr[0]}:{addr[1]}: {exc}") from None


def all_gather(addr, scope: str, rank: int, size: int, value: str, timeout_s: float) -> list[str]:
    """Every rank's ``value``, in rank order, once all ``size`` ranks have put theirs."""
    put(addr, scope, f"rank{rank}", value.encode())
    deadline = time.monotonic() + timeout_s
    found: dict[int, str] = {}
    delay = 0.01
    while True:
        for r in range(size):
            if r not in found:
                got = get(addr, scope, f"rank{r}")
                if got is not None:
                    found[r] = got.decode()
        if len(found) == size:
            return [found[r] for r in range(size)]
        if time.monotonic() > deadline:
            missing = [r for r in range(size) if r not in found]
            raise RendezvousError(f"Ranks {missing} did not arrive within {timeout_s:.0f} s.")
        time.sleep(delay)
        delay = min(0.2, delay * 1.5)
