"""The rendezvous store for one training stage, secured with the job's rendezvous key. It runs
where the stage's channels are hosted: on the driver in a classic session, on rank 0 under Spark
Connect (whose client the executors may not reach; :mod:`optim.rank.task`). Both sides.

It is Horovod's own HTTP key-value server (``horovod.runner.http``), which Gloo's rendezvous uses,
with two changes:

* it listens on one address (the driver's bind address, or rank 0's host), on a port the OS picks or the one the
  configuration pins (``spark.tfnet.rendezvous.port``);
* every request must carry ``X-Tfnet-Auth``, an HMAC of its method, path and body under the
  rendezvous key (:mod:`optim.transport.auth`), or gets 403. The ranks sign their own requests; Gloo's
  (made by Horovod's C++ code, which cannot sign) go through a proxy in each rank
  (:mod:`optim.transport.client`) that signs only the requests Gloo's rendezvous makes.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from optim.transport.auth import AUTH_HEADER, verify_request

__all__ = ["SecureRendezvous", "HEARTBEAT_SCOPE", "stuck_rank"]

HEARTBEAT_SCOPE = "tfnet_heartbeat"
STOP_TIMEOUT_S = 10.0
log = logging.getLogger("tfnet.spark.rendezvous")


def _handler_class(key: bytes):
    from horovod.runner.http.http_server import RendezvousHandler

    class SecuredHandler(RendezvousHandler):
        def _allowed(self, body: bytes | None) -> bool:
            if verify_request(key, self.headers.get(AUTH_HEADER), self.command, self.path, body):
                return True
            self.server.refused += 1
            log.warning("Refused a rendezvous request not signed with the job's key from %s: %s %s",
                        self.client_address[0], self.command, self.path[:100])
            self.send_status_code(403)
            return False

        def do_GET(self):  # noqa: N802 (http.server names)
            if self._allowed(None):
                super().do_GET()

        def do_PUT(self):  # noqa: N802
            parts = self.path.split("/")
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
            except (ValueError, OSError):
                self.send_status_code(400)
                return
            if not self._allowed(body):
                return
            if len(parts) != 3:
                self.send_status_code(400)
                return
            self._put_value(parts[1], parts[2], body)
            self.send_status_code(200)

        def do_DELETE(self):  # noqa: N802
            if self._allowed(None):
                super().do_DELETE()

    return SecuredHandler


class SecureRendezvous:
    """Horovod's rendezvous server on ``host``, for ``size`` ranks, that answers only requests
    signed with ``key``. Use as a context manager, or call :meth:`stop`.

    Args:
        host: The address to listen on.
        size: The number of ranks.
        key: The rendezvous key (:func:`optim.transport.auth.derive_key`).
        port: 0 (default) for a port the OS picks; another number pins it.

    Attributes:
        address: ``(host, port)`` it listens on.
        refused: How many requests were refused.
    """

    def __init__(self, host: str, size: int, key: bytes, port: int = 0):
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHTTPServer

        try:
            self._httpd = RendezvousHTTPServer((host, int(port)), _handler_class(key), 0)
        except OSError as exc:
            raise OSError(f"The rendezvous server cannot listen on {host}:{port} ({exc}); pin another port with "
                          "spark.tfnet.rendezvous.port, or leave it 0.") from exc
        self._httpd.refused = 0
        self._httpd.daemon_threads = True
        self._httpd.init(get_host_assignments(parse_hosts(",".join(f"rank{r}:1" for r in range(size))), size))
        self.address: tuple[str, int] = (host, self._httpd.server_address[1])
        self._seen: dict[str, tuple[bytes, float]] = {}
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="tfnet-rendezvous", daemon=True)
        self._thread.start()

    @property
    def refused(self) -> int:
        return self._httpd.refused

    def put(self, scope: str, key: str, value: bytes) -> None:
        """Puts ``value`` under ``/<scope>/<key>``, as a signed PUT from a rank would."""
        with self._httpd.cache_lock:
            self._httpd.cache.setdefault(scope, {})[key] = value

    def keys(self, scope: str) -> list[str]:
        """The keys under ``/<scope>/``."""
        return list(self.entries(scope))

    def entries(self, scope: str) -> dict[str, bytes]:
        """What is under ``/<scope>/``, by key."""
        with self._httpd.cache_lock:
            return dict(self._httpd.cache.get(scope, {}))

    def heartbeats(self) -> dict[int, dict]:
        """Each rank's newest heartbeat (:class:`optim.rank.watchdog.Watchdog` sends one
        every few seconds), with ``received``: when (``time.monotonic()`` on the driver) it last
        changed."""
        now = time.monotonic()
        out = {}
        for key, value in self.entries(HEARTBEAT_SCOPE).items():
            old = self._seen.get(key)
            if old is None or old[0] != value:
                self._seen[key] = (value, now)
            try:
                beat = json.loads(value)
                rank = int(key.removeprefix("rank"))
            except (ValueError, TypeError):
                continue
            if isinstance(beat, dict):
                beat["received"] = self._seen[key][1]
                out[rank] = beat
        return out

    def stop(self) -> None:
        """Stops serving and closes the socket, within :data:`STOP_TIMEOUT_S`."""
        stopper = threading.Thread(target=self._httpd.shutdown, name="tfnet-rendezvous-stop", daemon=True)
        stopper.start()
        stopper.join(STOP_TIMEOUT_S)
        self._httpd.server_close()
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive() or stopper.is_alive():
            log.warning("The rendezvous server did not stop within %.0f s; its socket is closed.", STOP_TIMEOUT_S)

    def __enter__(self) -> SecureRendezvous:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


#: Seconds added to a rank's own bound before the store's host (the driver, or rank 0 under
#: Connect) calls it stuck (the rank's watchdog should end it first) and how long a rank's
#: heartbeat may stay unchanged (a frozen process or a cut network: the watchdog cannot act).
STUCK_GRACE_S = 30.0


def stuck_rank(beats: dict[int, dict], n: int, now: float, started: float, startup_timeout: float) -> str | None:
    """Why the stage is stuck, from the ranks' heartbeats (``SecureRendezvous.heartbeats()``), or
    None. A rank is stuck when its own report says it has been idle past its bound, when its
    heartbeat has not changed for :data:`STUCK_GRACE_S` plus its bound, or when it has sent none
    within ``startup_timeout`` of the launch. Pure (tested without Spark)."""
    for rank in range(n):
        beat = beats.get(rank)
        if beat is None:
            if now - started > startup_timeout + STUCK_GRACE_S:
                return f"rank {rank} sent no heartbeat within {startup_timeout:.0f} s of the launch (startup_timeout)"
            continue
        bound = float(beat.get("bound", startup_timeout))
        idle = float(beat.get("idle", 0.0)) + (now - beat["received"])
        if idle > bound + STUCK_GRACE_S:
            return (f"rank {rank} made no progress for {idle:.0f} s while {beat.get('phase', '?')} "
                    f"(its bound: {bound:.0f} s)")
    return None
