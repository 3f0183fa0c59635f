"""Progress from rank 0 to the driver: JSON lines over one TCP connection.

:class:`ProgressServer` runs on the driver and feeds the same reporters a local run uses (the
progress bar); :class:`RemoteReporter` runs on rank 0 and sends the events. Progress is best
effort: if the connection fails, training goes on and the driver still gets the results.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from optim.reporting import Reporter


class ProgressServer:
    """Listens on ``host`` (port chosen by the OS); dispatches events to ``reporter``."""

    def __init__(self, reporter: Reporter, host: str = "0.0.0.0"):
        self.reporter = reporter
        self.last_event = time.monotonic()
        self.first_step_at: float | None = None
        self.events: list[dict] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(8)
        self._sock.settimeout(0.5)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tfnet-progress", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(1.0)
        buf = b""
        with conn:
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        self._dispatch(json.loads(line))
                    except (ValueError, TypeError, KeyError) as exc:  # a bad line must not stop the run
                        print(f"tfnet: ignored a progress message ({exc})", file=sys.stderr)

    def _dispatch(self, event: dict) -> None:
        self.last_event = time.monotonic()
        kind = event.get("event")
        self.events.append(event)
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

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        self._thread.join(timeout=2)
        self.reporter.end()


class RemoteReporter(Reporter):
    """Sends reporter events to a :class:`ProgressServer`."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0):
        self._sock = None
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            print(f"tfnet: cannot send progress to the driver at {host}:{port} ({exc}); training goes on.",
                  file=sys.stderr)

    def _send(self, event: dict) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendall((json.dumps(event, default=float) + "\n").encode())
        except OSError:
            self._sock = None

    def begin(self, epochs, steps_per_epoch, initial_step, initial_epoch):
        self._send({"event": "begin", "epochs": epochs, "steps_per_epoch": steps_per_epoch,
                    "initial_step": initial_step, "initial_epoch": initial_epoch})

    def step(self, step, epoch, logs):
        self._send({"event": "step", "step": step, "epoch": epoch, "logs": logs})

    def validation(self, step, logs):
        self._send({"event": "validation", "step": step, "logs": logs})

    def epoch_end(self, epoch, step, logs):
        self._send({"event": "epoch_end", "epoch": epoch, "step": step, "logs": logs})

    def end(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
