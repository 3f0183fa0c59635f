"""A virtual clock for tests of code that waits: bounds are checked by the clock's value, not by
how fast the machine happens to be."""

from __future__ import annotations


class VirtualClock:
    """``time.monotonic``, ``time.time`` and ``time.sleep`` for a module under test (monkeypatch
    its ``time``): sleeping moves the clock on at once and is recorded in :attr:`sleeps`."""

    def __init__(self, start: float = 1000.0):
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
