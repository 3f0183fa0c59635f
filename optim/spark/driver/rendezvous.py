"""The driver's rendezvous store for one training stage, secured with the job's secret. Driver side.

It is Horovod's own HTTP key-value server (``horovod.runner.http``), which Gloo's rendezvous uses,
with two changes:

* it listens on the driver's address only, not on every interface;
* tfnet's keys (scopes starting ``tfnet_``: rank claims, step counts, failure reports) need the
  header ``X-Tfnet-Token`` with the job's secret, or get 403. Gloo's own requests (made by
  Horovod's C++ code, which cannot send a header) go through a proxy in each rank that adds the
  header (:mod:`optim.spark.worker.rendezvous`), so every request must present the secret.
"""

from __future__ import annotations

import hmac
import logging

from optim.spark.failures import WorkerFailure

__all__ = ["SecureRendezvous", "TOKEN_HEADER"]

TOKEN_HEADER = "X-Tfnet-Token"
FAILURE_SCOPE = "tfnet_failures"
log = logging.getLogger("tfnet.spark.rendezvous")


def _handler_class(token: str):
    from horovod.runner.http.http_server import RendezvousHandler

    class SecuredHandler(RendezvousHandler):
        def _allowed(self) -> bool:
            got = self.headers.get(TOKEN_HEADER, "")
            if hmac.compare_digest(got.encode(), token.encode()):
                return True
            log.warning("Refused a rendezvous request without the job's secret from %s: %s %s",
                        self.client_address[0], self.command, self.path)
            self.send_status_code(403)
            return False

        def do_GET(self):  # noqa: N802 (http.server names)
            if self._allowed():
                super().do_GET()

        def do_PUT(self):  # noqa: N802
            if self._allowed():
                super().do_PUT()

        def do_DELETE(self):  # noqa: N802
            if self._allowed():
                super().do_DELETE()

    return SecuredHandler


class SecureRendezvous:
    """Horovod's rendezvous server on ``host`` (port chosen by the OS), for ``size`` ranks, that
    answers only requests carrying ``token``. Use as a context manager, or call :meth:`stop`."""

    def __init__(self, host: str, size: int, token: str):
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHTTPServer
        from horovod.runner.util.threads import in_thread

        self._httpd = RendezvousHTTPServer((host, 0), _handler_class(token), 0)
        self._httpd.init(get_host_assignments(parse_hosts(",".join(f"rank{r}:1" for r in range(size))), size))
        self.address: tuple[str, int] = (host, self._httpd.server_address[1])
        self._thread = in_thread(target=self._httpd.serve_forever)

    def failures(self) -> list[WorkerFailure]:
        """The failure reports the ranks posted, in the order they came."""
        with self._httpd.cache_lock:
            values = list(self._httpd.cache.get(FAILURE_SCOPE, {}).values())
        out = []
        for v in values:
            try:
                out.append(WorkerFailure.from_json(v))
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("Ignored an unreadable failure report from a rank (%s).", exc)
        return sorted(out, key=lambda f: f.time)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def __enter__(self) -> SecureRendezvous:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
