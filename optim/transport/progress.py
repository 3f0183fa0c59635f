"""Progress from rank 0 to the driver over an authenticated connection. Both ends live here: the
server runs on the driver, the reporter on rank 0.

The channel is :mod:`multiprocessing.connection`'s: the server listens on the driver's address
and runs its HMAC challenge with the job's secret before it reads anything, so a client without
the secret is refused. Messages are JSON (never unpickled). Progress is best effort: if the
connection fails, training goes on, the reporter reconnects (at most every
:data:`RECONNECT_S` seconds), and the driver still gets the results. The driver does not take this
channel as a sign of life: that is the ranks' heartbeat (:mod:`optim.rank.watchdog`).
Every read and send on it has a bound (:data:`IO_TIMEOUT_S`).
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from optim.training.reporting import Reporter

__all__ = ["EventReporter", "EventSink", "ProgressServer", "RemoteReporter"]

log = logging.getLogger("tfnet.spark.progress")
AUTH_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 30.0
RECONNECT_S = 5.0


def _set_timeouts(sock: socket.socket, seconds: float) -> None:
    value = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _authenticated(sock: socket.socket, authkey: bytes, server: bool) -> Connection:
    """Runs the mutual HMAC challenge on ``sock`` (as ``Listener``/``Client`` do), with a read
    timeout so a silent peer cannot hold the thread, then leaves reads and sends bounded by
    :data:`IO_TIMEOUT_S`. Raises AuthenticationError or OSError."""
    sock.settimeout(None)
    _set_timeouts(sock, AUTH_TIMEOUT_S)
    conn = Connection(sock.detach())
    try:
        if server:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
    except BaseException:
        conn.close()
        raise
    fd = socket.socket(fileno=conn.fileno())  # a view of the same fd, to set the timeouts
    _set_timeouts(fd, IO_TIMEOUT_S)
    fd.detach()
    return conn


class EventSink:
    """Hands rank 0's reporter events to ``reporter`` and keeps them (``events``, and when each arrived:
    ``arrived``, on this process's monotonic clock), with when the first step arrived (``first_step_at``).
    The progress server and, under Spark Connect, the progress poller
    (:mod:`optim.transport.progress_store`) are both one."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter
        self.last_event = time.monotonic()
        self.first_step_at: float | None = None
        self.events: list[dict] = []
        self.arrived: list[float] = []
        self.refused = 0

    def dispatch(self, event: dict) -> None:
        self.last_event = time.monotonic()
        kind = event.get("event")
        self.events.append(event)
        self.arrived.append(self.last_event)
        if kind == "begin":
            self.reporter.begin(event["epochs"], event["steps_per_epoch"], event["initial_step"], event["initial_epoch"])
        elif kind == "step":
            if self.first_step_at is None:
                self.first_step_at = time.monotonic()
            self.reporter.step(event["step"], event["epoch"], event["logs"])
        elif kind == "validation":
            self.reporter.validation(event["step"], event["logs"])
        elif kind == "epoch_end":
            self.reporter.epoch_end(event["epoch"], event["step"], event["logs"])


class ProgressServer(EventSink):
    """Listens on ``host`` for clients that know ``authkey``; dispatches their events to
    ``reporter``.

    Args:
        port: 0 (default) for a port the OS picks; another number pins it.
        advertise: The address the ranks connect to. Default: ``host``.

    Attributes:
        refused: How many clients failed the challenge.
    """

    def __init__(self, reporter: Reporter, host: str, authkey: bytes, port: int = 0, advertise: str | None = None):
        super().__init__(reporter)
        self._authkey = authkey
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, int(port)))
        except OSError as exc:
            self._sock.close()
            raise OSError(f"The progress server cannot listen on {host}:{port} ({exc}); pin another port with "
                          "spark.tfnet.progress.port, or leave it 0.") from exc
        self._sock.listen(8)
        self._sock.settimeout(0.5)
        self.port = self._sock.getsockname()[1]
        self.address: tuple[str, int] = (advertise or host, self.port)
        self._readers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tfnet-progress", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            reader = threading.Thread(target=self._read, args=(sock,), name="tfnet-progress-reader", daemon=True)
            reader.start()
            self._readers = [t for t in self._readers if t.is_alive()] + [reader]

    def _read(self, sock: socket.socket) -> None:
        peer = sock.getpeername()[0] if sock.fileno() >= 0 else "?"
        try:
            conn = _authenticated(sock, self._authkey, server=True)
        except (AuthenticationError, OSError, EOFError) as exc:
            self.refused += 1
            log.warning("Refused a progress connection from %s: it did not present the job's secret (%s).",
                        peer, type(exc).__name__)
            return
        with conn:
            while not self._stop.is_set():
                try:
                    if not conn.poll(0.5):
                        continue
                    line = conn.recv_bytes(1 << 20)
                except (EOFError, OSError):  # closed, or silent past IO_TIMEOUT_S mid-message
                    return
                try:
                    self.dispatch(json.loads(line))
                except (ValueError, TypeError, KeyError) as exc:  # a bad message must not stop the run
                    log.warning("Ignored a progress message (%s).", exc)

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        self._thread.join(timeout=2)
        for reader in self._readers:
            reader.join(timeout=2)
        self.reporter.end()


class EventReporter(Reporter):
    """A reporter that turns each event into a JSON-able dict (the form :meth:`EventSink.dispatch`
    reads) and hands it to ``_send``."""

    def _send(self, event: dict) -> None:
        raise NotImplementedError

    def begin(self, epochs, steps_per_epoch, initial_step, initial_epoch):
        self._send({"event": "begin", "epochs": epochs, "steps_per_epoch": steps_per_epoch,
                    "initial_step": initial_step, "initial_epoch": initial_epoch})

    def step(self, step, epoch, logs):
        self._send({"event": "step", "step": step, "epoch": epoch, "logs": logs})

    def validation(self, step, logs):
        self._send({"event": "validation", "step": step, "logs": logs})

    def epoch_end(self, epoch, step, logs):
        self._send({"event": "epoch_end", "epoch": epoch, "step": step, "logs": logs})


class RemoteReporter(EventReporter):
    """Sends reporter events to a :class:`ProgressServer`, authenticating with ``authkey``. A
    lost connection is made again at the next event (at most every :data:`RECONNECT_S` seconds);
    events in between are dropped."""

    def __init__(self, host: str, port: int, authkey: bytes, timeout_s: float = 10.0):
        self._addr, self._authkey, self._timeout_s = (host, port), authkey, timeout_s
        self._conn: Connection | None = None
        self._tried = 0.0
        self.reconnects = -1
        self._connect()

    def _connect(self) -> None:
        self._tried = time.monotonic()
        try:
            sock = socket.create_connection(self._addr, timeout=self._timeout_s)
            self._conn = _authenticated(sock, self._authkey, server=False)
            self.reconnects += 1
        except (OSError, EOFError, AuthenticationError) as exc:
            log.warning("Cannot send progress to the driver at %s:%s (%s); training goes on.", *self._addr, exc)

    def _send(self, event: dict) -> None:
        if self._conn is None and time.monotonic() - self._tried >= RECONNECT_S:
            self._connect()
        if self._conn is None:
            return
        try:
            self._conn.send_bytes(json.dumps(event, default=float).encode())
        except OSError:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None

    def end(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None
