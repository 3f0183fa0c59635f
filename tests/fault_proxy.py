"""An HTTP proxy that injects an object store's faults, for tests (issue 42): in front of an S3 server (moto), it
answers a fraction of requests with ``503 SlowDown``, resets a fraction of connections (a TCP RST before any
answer), and holds a fraction of answers past the client's read timeout before it drops the connection; the rest it
passes through. Which request gets which fault is drawn from a seeded generator, so a run of the same requests sees
the same faults; :attr:`FaultProxy.counts` says what it did.

    with MotoS3(folder) as s3, FaultProxy(s3.endpoint, slowdown=0.1, reset=0.05, stall=0.02, stall_s=4) as proxy:
        options = {**s3.options, "endpoint_url": proxy.endpoint, "config_kwargs": {"read_timeout": 2}}
"""

from __future__ import annotations

import collections
import http.client
import random
import socket
import struct
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["FaultProxy"]

_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request '
             b'rate.</Message><RequestId>tfnet-fault</RequestId></Error>')


class FaultProxy:
    """A proxy on 127.0.0.1 (a port the OS picks: :attr:`endpoint`) in front of ``target`` (``http://host:port``).

    Args:
        slowdown, reset, stall: The fraction of requests answered 503 SlowDown, reset, or stalled.
        stall_s: How long a stalled answer is held before the connection is dropped (longer than the client's
            read timeout).
        seed: Seeds the draw of faults.
        only: When given, only requests whose method is in it can get a fault (``{"PUT"}``: the writes).
    """

    def __init__(self, target: str, slowdown: float = 0.0, reset: float = 0.0, stall: float = 0.0,
                 stall_s: float = 5.0, seed: int = 0, only: set[str] | None = None):
        parsed = urllib.parse.urlparse(target)
        self.target = (parsed.hostname, parsed.port)
        self.rates = (("slowdown", slowdown), ("reset", reset), ("stall", stall))
        self.stall_s, self.only = stall_s, only
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.enabled = True
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._draw(self.command)
                if fault == "reset":
                    # SO_LINGER 0: close() sends a RST, the client sees "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "stall":
                    time.sleep(proxy.stall_s)
                    self.close_connection = True
                    return
                if fault == "slowdown":
                    body = b"" if self.command == "HEAD" else _SLOWDOWN  # a HEAD answer has no body
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                conn = http.client.HTTPConnection(*proxy.target, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                finally:
                    conn.close()
                self.send_response(answer.status, answer.reason)
                for k, v in answer.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                        self.send_header(k, v)
                # a HEAD answer says the object's length and carries no body
                length = answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any  # noqa: N815 (http.server's names)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="tfnet-fault-proxy", daemon=True)

    def _draw(self, method: str) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if not self.enabled or (self.only is not None and method not in self.only):
                return None
            x = self._rng.random()
            for name, rate in self.rates:
                if x < rate:
                    self.counts[name] += 1
                    return name
                x -= rate
            return None

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
