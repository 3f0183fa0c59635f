"""A watchdog for one training task: if no progress is reported within the timeout, the process
ends, so its Spark task fails and the barrier stage fails with it, instead of waiting forever in a
collective whose peer is gone. Worker side."""

from __future__ import annotations

import os
import sys
import threading
import time


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
            if os.environ.get("TFNET_DEBUG_TIMING"):
                sys.stderr.write(f"{self.message} {time.time():.3f} {phase}\n")

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                sys.stderr.write(
                    f"{self.message}: nothing happened for {idle:.0f} s (timeout {self.timeout_s:.0f} s) "
                    f"while {self.phase}; ending this task so the stage fails and can be retried.\n"
                )
                sys.stderr.flush()
                os._exit(70)
