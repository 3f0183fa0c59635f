"""Calls to the rendezvous store (Horovod's HTTP key-value server, secured with the job's
rendezvous key: :mod:`optim.transport.store`; on the driver, or on rank 0 under Spark Connect). The
ranks make them. Every call has a timeout and is signed (:func:`optim.transport.auth.sign_request`).

The ranks use it before Horovod starts (claiming a rank once per launch; exchanging small values
faster than Spark's barrier ``allGather``, which polls once a second), to send heartbeats, to leave a
failure for the other ranks (:func:`post_failure`), and, through :class:`GlooProxy`, for Gloo's own rendezvous.
"""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from optim.errors import RendezvousError
from optim.transport.auth import AUTH_HEADER, sign_request

__all__ = ["FAILURE_SCOPE", "GLOO_PATH", "GlooProxy", "all_gather", "get", "others_left", "peer_failures", "post_failure",
           "put"]

#: The requests Gloo's rendezvous makes through Horovod's HTTP store: ``/<scope>/<key>`` with the
#: scopes ``global``, ``local_<hostname>`` (tfnet names each rank's host ``rank<N>``) and
#: ``cross_<local rank>``, each also with ``_process_set_hash_<hash>`` for a process set. Nothing
#: else is forwarded.
GLOO_PATH = re.compile(r"^/(global|local_rank\d+|cross_\d+)(_process_set_hash_[0-9a-f]+)?/[A-Za-z0-9_.:-]{1,200}$")
GLOO_METHODS = ("GET", "PUT", "DELETE")
#: Where a failing rank leaves its failure for the other ranks (:func:`post_failure`, :func:`peer_failures`).
FAILURE_SCOPE = "tfnet_failures"


def _request(addr, scope: str, key: str, auth: bytes | None, data: bytes | None = None, method: str = "GET") -> Request:
    path = f"/{scope}/{key}"
    req = Request(f"http://{addr[0]}:{addr[1]}{path}", data=data, method=method)
    if auth:
        req.add_header(AUTH_HEADER, sign_request(auth, method, path, data))
    return req


def _http_error(addr, exc: HTTPError) -> RendezvousError:
    if exc.code == 403:
        return RendezvousError(f"The rendezvous server at {addr[0]}:{addr[1]} refused this rank: its request was not "
                               "signed with the job's key (403).")
    return RendezvousError(f"The rendezvous server at {addr[0]}:{addr[1]} answered {exc.code}.")


def get(addr, scope: str, key: str, timeout_s: float = 10.0, token: bytes | None = None) -> bytes | None:
    """The value, or None if the key is not there. ``token`` is the rendezvous key."""
    try:
        with urlopen(_request(addr, scope, key, token), timeout=timeout_s) as resp:
            return resp.read()
    except HTTPError as exc:
        if exc.code == 404:
            return None
        raise _http_error(addr, exc) from None
    except (URLError, OSError) as exc:
        raise RendezvousError(f"Cannot reach the driver's rendezvous server at {addr[0]}:{addr[1]}: {exc}") from None


def put(addr, scope: str, key: str, value: bytes, timeout_s: float = 10.0, token: bytes | None = None) -> None:
    try:
        with urlopen(_request(addr, scope, key, token, value, "PUT"), timeout=timeout_s) as resp:
            resp.read()
    except HTTPError as exc:
        raise _http_error(addr, exc) from None
    except (URLError, OSError) as exc:
        raise RendezvousError(f"Cannot reach the driver's rendezvous server at {addr[0]}:{addr[1]}: {exc}") from None


def all_gather(addr, scope: str, rank: int, size: int, value: str, timeout_s: float, token: bytes | None = None) -> list[str]:
    """Every rank's ``value``, in rank order, once all ``size`` ranks have put theirs."""
    put(addr, scope, f"rank{rank}", value.encode(), token=token)
    deadline = time.monotonic() + timeout_s
    found: dict[int, str] = {}
    delay = 0.01
    while True:
        for r in range(size):
            if r not in found:
                got = get(addr, scope, f"rank{r}", token=token)
                if got is not None:
                    found[r] = got.decode()
        if len(found) == size:
            return [found[r] for r in range(size)]
        if time.monotonic() > deadline:
            missing = [r for r in range(size) if r not in found]
            raise RendezvousError(f"Ranks {missing} did not arrive within {timeout_s:.0f} s.")
        time.sleep(delay)
        delay = min(0.2, delay * 1.5)


def post_failure(addr, rank: int, data: bytes, token: bytes | None, timeout_s: float = 3.0) -> bool:
    """Leaves this rank's failure (:class:`~optim.transport.failures.WorkerFailure` JSON) for the other ranks of
    the stage, best effort: a rank whose collective then breaks carries it in its own error, so the driver learns
    the cause from whichever rank's error Spark reports. True if it arrived."""
    try:
        put(addr, FAILURE_SCOPE, f"rank{rank}", data, timeout_s=timeout_s, token=token)
        return True
    except RendezvousError:
        return False


def peer_failures(addr, rank: int, size: int, token: bytes | None, wait_s: float) -> list[bytes]:
    """The failures other ranks left (:func:`post_failure`), waiting up to ``wait_s`` seconds for the first; best
    effort (an unreachable store gives none)."""
    return others_left(lambda r: get(addr, FAILURE_SCOPE, f"rank{r}", timeout_s=2.0, token=token), rank, size, wait_s)


def others_left(read, rank: int, size: int, wait_s: float) -> list[bytes]:
    """What every rank but ``rank`` (-1: none left out) left where ``read(r)`` looks (None: nothing from rank
    ``r``), asked again every 0.1 s for up to ``wait_s`` seconds until something is there. A
    :class:`~optim.errors.RendezvousError` from ``read`` (the place is gone) ends the asking with what was found."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        try:
            for r in range(size):
                if r != rank:
                    got = read(r)
                    if got is not None:
                        found.append(got)
        except RendezvousError:
            return found
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


class GlooProxy:
    """A loopback HTTP proxy for Gloo's rendezvous requests: Horovod's C++ HTTP store cannot sign
    a request, so it talks to this proxy (``127.0.0.1``, a port chosen by the OS), which signs and
    forwards to the driver only what Gloo's rendezvous sends (:data:`GLOO_METHODS` on
    :data:`GLOO_PATH`) and answers 403 to anything else, tfnet's own scopes included. Runs in a
    thread of the rank's process.

    What another local process on the executor's host can still do through it, while the rank
    connects: read and write Gloo's rendezvous keys of this job (the ranks' addresses), which can
    disturb the connection but reaches no tfnet data and no key.

    Attributes:
        refused: How many requests it refused.
    """

    def __init__(self, upstream: tuple[str, int], token: bytes, timeout_s: float = 30.0):
        up, key, proxy = upstream, token, self
        self.refused = 0

        class Forward(BaseHTTPRequestHandler):
            timeout = timeout_s

            def _reply(self, status: int, data: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _forward(self, method: str) -> None:
                if method not in GLOO_METHODS or not GLOO_PATH.match(self.path):
                    proxy.refused += 1
                    self._reply(403)
                    return
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                req = Request(f"http://{up[0]}:{up[1]}{self.path}", data=body, method=method)
                req.add_header(AUTH_HEADER, sign_request(key, method, self.path, body))
                try:
                    with urlopen(req, timeout=timeout_s) as resp:
                        status, data = resp.status, resp.read()
                except HTTPError as exc:
                    status, data = exc.code, b""
                except (URLError, OSError):
                    status, data = 502, b""
                self._reply(status, data)

            def do_GET(self):  # noqa: N802 (http.server names)
                self._forward("GET")

            def do_PUT(self):  # noqa: N802
                self._forward("PUT")

            def do_DELETE(self):  # noqa: N802
                self._forward("DELETE")

            def do_POST(self):  # noqa: N802
                self._forward("POST")

            def log_message(self, format, *args):  # noqa: A002 - quiet
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self._httpd.daemon_threads = True
        self.address: tuple[str, int] = ("127.0.0.1", self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="tfnet-gloo-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        stopper = threading.Thread(target=self._httpd.shutdown, daemon=True)
        stopper.start()
        stopper.join(5)
        self._httpd.server_close()
        self._thread.join(5)
