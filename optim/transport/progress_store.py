"""Progress through ``model_dir`` instead of a connection, for Spark Connect, whose client the
executors may not reach. Both ends live here: :class:`StoredReporter` runs on rank 0,
:class:`ProgressPoller` on the client.

Rank 0 keeps its reporter events and rewrites one small JSON file with all of them
(``model_dir/progress/<run id>/attempt-<n>.json``, an atomic write, so also on object stores that
cannot append) at most every :data:`PUBLISH_S` seconds, and at once at an epoch's end, a
validation and the end. The client reads that file every :data:`POLL_S` seconds (every
:data:`FIRST_POLL_S` until the first step has come: the start-up it shows, and ``last_run["startup_s"]``,
are then late by at most that) and hands the events it has not seen to the same reporters a classic run
uses (the progress bar, per-epoch lines).
Progress is best effort: a failed write or read is logged and training goes on.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from optim.training.reporting import Reporter
from optim.transport.progress import EventReporter, EventSink
from tfnet import storage

__all__ = ["StoredReporter", "ProgressPoller", "progress_path"]

log = logging.getLogger("tfnet.spark.progress")
PUBLISH_S = 2.0
POLL_S = 1.0
FIRST_POLL_S = 0.2


def progress_path(model_dir: str, run_id: str, attempt: int) -> str:
    return storage.join(model_dir, "progress", run_id, f"attempt-{attempt}.json")


class StoredReporter(EventReporter):
    """Rank 0's side: publishes every event to ``path`` (see the module's notes)."""

    def __init__(self, path: str, storage_options=None):
        self._path, self._options = path, storage_options
        self._events: list[dict] = []
        self._written = 0.0
        self._failed = False

    def _send(self, event: dict) -> None:
        self._events.append(event)
        if event["event"] != "step" or time.monotonic() - self._written >= PUBLISH_S:
            self._publish()

    def _publish(self) -> None:
        self._written = time.monotonic()
        try:
            storage.write_bytes_atomic(self._path, json.dumps(self._events, default=float).encode(), self._options)
        except Exception as exc:  # noqa: BLE001 - progress is best effort; training goes on
            if not self._failed:
                log.warning("Cannot publish progress to %s (%s); training goes on.", self._path, exc)
            self._failed = True

    def end(self) -> None:
        self._publish()


class ProgressPoller(EventSink):
    """The client's side: reads the file rank 0 publishes for the current attempt
    (:meth:`watch`) and dispatches the events it has not seen yet to ``reporter``."""

    def __init__(self, reporter: Reporter, storage_options=None):
        super().__init__(reporter)
        self._options = storage_options
        self._path: str | None = None
        self._seen = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfnet-progress-poller", daemon=True)
        self._thread.start()

    def watch(self, path: str | None) -> None:
        """Follows ``path`` from now on (a new attempt publishes to a new file)."""
        with self._lock:
            self.poll()
            self._path, self._seen = path, 0

    def poll(self) -> None:
        """Reads the file once and dispatches what is new."""
        path = self._path
        if path is None:
            return
        try:
            events = json.loads(storage.read_bytes(path, self._options))
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001 - a half-visible object, a network blip: the next poll
            log.debug("Cannot read progress from %s (%s).", path, exc)
            return
        for event in events[self._seen:]:
            try:
                self.dispatch(event)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("Ignored a progress message (%s).", exc)
        self._seen = max(self._seen, len(events))

    def _run(self) -> None:
        while not self._stop.wait(POLL_S if self.first_step_at is not None else FIRST_POLL_S):
            with self._lock:
                self.poll()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            self.poll()
        self.reporter.end()
