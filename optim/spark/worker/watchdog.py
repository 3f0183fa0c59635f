"""A watchdog for one training task: if no progress is reported within the timeout, the process
ends, so its Spark task fails and the barrier stage fails with it, instead of waiting forever in a
collective whose peer is gone. Worker side."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

log = logging.getLogger("tfnet.spark.watchdog")


class Watchdog:
    """Call :meth:`kick` on progress. After ``timeout_s`` seconds without a kick, writes
    ``message`` and the phase to stderr and ends the process with exit code 70."""

    def __init__(self, timeout_s: float, message: str = "tfnet: no progress"):
        self.timeout_s = float(timeout_s)
        self.message = message
        self.phase = "starting"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfnet-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def kick(self, phase: str | None = None) -> None:
        self._last = time.monotonic()
        if phase and phase != self.phase:
            self.phase = phase
            log.debug("%s %.3f %s", self.message, time.time(), phase)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                log.error("%s: nothing happened for %.0f s (timeout %.0f s) while %s; ending this task so the "
                          "stage fails and can be retried.", self.message, idle, self.timeout_s, self.phase)
                for handler in logging.getLogger().handlers + [logging.lastResort]:
                    if handler is not None:
                        handler.flush()
                sys.stderr.flush()
                os._exit(70)
