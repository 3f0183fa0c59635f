"""A watchdog for one training task. Worker side.

If no progress is reported within the bound of the current phase, the process ends, so its Spark
task fails and the barrier stage fails with it, instead of waiting forever in a collective whose
peer is gone. Phases that are long by nature (the first step's compile, a checkpoint write,
waiting for the other ranks' validation) get the long bound (:meth:`Watchdog.phase`).

It also sends a heartbeat to the driver every few seconds (:data:`HEARTBEAT_S`), from its own
thread: the driver decides a rank is stuck from these, not from the progress display.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from optim.training.liveness import Liveness

log = logging.getLogger("tfnet.spark.watchdog")
HEARTBEAT_S = 2.0


class Watchdog(Liveness):
    """Call :meth:`kick` on progress. After ``timeout_s`` seconds without a kick (``long_timeout_s``
    inside :meth:`phase`), writes ``message`` and the phase to stderr and ends the process with
    exit code 70.

    Args:
        timeout_s: The bound between two kicks.
        message: What the log line starts with.
        long_timeout_s: The bound inside :meth:`phase`. Default: ``timeout_s``.
        beat: Called with a heartbeat (JSON bytes: ``seq``, ``phase``, ``idle``, ``bound``) every
            :data:`HEARTBEAT_S` seconds, from a thread of its own. Default: none.
    """

    def __init__(self, timeout_s: float, message: str = "tfnet: no progress", long_timeout_s: float | None = None,
                 beat: Callable[[bytes], None] | None = None):
        self.timeout_s = float(timeout_s)
        self.long_timeout_s = float(long_timeout_s if long_timeout_s is not None else timeout_s)
        self.message = message
        self.phase_name = "starting"
        self._bound: float | None = None  # the bound of the current phase(), if inside one
        self._last = time.monotonic()
        self._seq = 0
        self._beat = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfnet-watchdog", daemon=True)
        self._beater = threading.Thread(target=self._send_beats, name="tfnet-heartbeat", daemon=True)

    @property
    def bound(self) -> float:
        return self._bound if self._bound is not None else self.timeout_s

    def start(self) -> Watchdog:
        self._thread.start()
        if self._beat is not None:
            self._beater.start()
        return self

    def kick(self, phase: str | None = None) -> None:
        self._last = time.monotonic()
        if phase and phase != self.phase_name and self._bound is None:
            self.phase_name = phase
            log.debug("%s %.3f %s", self.message, time.time(), phase)

    @contextmanager
    def phase(self, name: str, timeout_s: float | None = None) -> Iterator[None]:
        saved = (self.phase_name, self._bound)
        self.kick(name)
        self.phase_name, self._bound = name, float(timeout_s if timeout_s is not None else self.long_timeout_s)
        try:
            yield
        finally:
            self.phase_name, self._bound = saved
            self.kick()

    def stop(self) -> None:
        self._stop.set()

    def heartbeat(self) -> bytes:
        """The heartbeat the driver gets: a sequence number, the phase, the seconds since the last
        kick and the bound that applies."""
        self._seq += 1
        return json.dumps({"seq": self._seq, "phase": self.phase_name, "idle": time.monotonic() - self._last,
                           "bound": self.bound, "pid": os.getpid()}).encode()

    def _send_beats(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat(self.heartbeat())
            except Exception as exc:  # noqa: BLE001 - a heartbeat is best effort; the driver notices its absence
                log.debug("Heartbeat not sent: %s", exc)

    def overdue(self) -> str | None:
        """What the watchdog says when the current phase has gone past its bound without a kick; None
        while it is within it. The watchdog's thread checks this about every second (more often for
        bounds under 4 s) and ends the process when it is not None."""
        idle = time.monotonic() - self._last
        bound = self.bound
        if idle <= bound:
            return None
        return (f"{self.message}: nothing happened for {idle:.0f} s (bound {bound:.0f} s) while {self.phase_name}; "
                "ending this task so the stage fails and can be retried.")

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            why = self.overdue()
            if why is not None:
                log.error("%s", why)
                for handler in logging.getLogger().handlers + [logging.lastResort]:
                    if handler is not None:
                        handler.flush()
                sys.stderr.flush()
                os._exit(70)
