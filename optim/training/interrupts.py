"""Ctrl-C at a public call (``TFOptimizer.optimize``, ``evaluate``). Driver side (any process).

The first Ctrl-C interrupts as the process's own handler says (Python's, pyspark's, a notebook's): a
Spark job then is cancelled and its tasks end first (:func:`optim.spark.jobs.run_job`). Every further
Ctrl-C while the call stops (the job cancelled, its tasks ending, the channels closed) is ignored, so
that it cannot break the stop half-way (a second Ctrl-C printed py4j's "reentrant call" tracebacks).
While a call stops, :func:`stopping` is true, and the progress bar prints nothing more (rank 0 goes on
reporting epochs until its task is killed).

A Ctrl-C that lands while the main thread waits for the JVM's answer to a Py4J call is held until the
call returns (at most :data:`HOLD_S`): raised there, ``KeyboardInterrupt`` would leave the connection
half-read (py4j logs "KeyboardInterrupt while sending command" with a traceback), and pyspark's own
handler, which cancels every job through that same connection, failed with "reentrant call inside
<_io.BufferedReader>" and a raw Py4J traceback. For Python's and pyspark's handlers the interrupt is
then a plain ``KeyboardInterrupt``: the job tfnet runs is cancelled by its own tag (``run_job``), not
every job of the application.
"""

from __future__ import annotations

import signal
import threading
import time

__all__ = ["Interruptible", "stopping"]

_STOPPING = threading.Event()

#: Seconds a Ctrl-C is held while the main thread waits for a Py4J answer; then it is raised anyway.
HOLD_S = 10.0
#: Seconds between two looks at whether the Py4J call has returned.
_RECHECK_S = 0.05


def _raises_keyboard_interrupt(handler) -> bool:
    """Python's default handler or pyspark's (``SparkContext``'s: cancels every job, then raises)."""
    return handler is signal.default_int_handler or getattr(handler, "__module__", "").startswith("pyspark")


def _in_py4j(frame) -> bool:
    """Whether the interrupted frame is inside py4j (a call to the JVM, waiting for its answer)."""
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("py4j"):
            return True
        frame = frame.f_back
    return False


def stopping() -> bool:
    """Whether a call in this process is stopping on Ctrl-C."""
    return _STOPPING.is_set()


class Interruptible:
    """Around a public call, on the main thread: the first Ctrl-C raises ``KeyboardInterrupt`` where
    the process's own SIGINT handler is Python's or pyspark's (once the main thread is out of any Py4J
    call), or goes to that handler where it is another (a notebook's, the user's); every later one,
    while the call stops, is ignored. The handler is put back when the call returns or
    raises. Elsewhere (another thread, a handler that ignores Ctrl-C) it changes nothing.

    Example:
        >>> with Interruptible():                                          # doctest: +SKIP
        ...     try:
        ...         return run()
        ...     except KeyboardInterrupt:
        ...         raise KeyboardInterrupt from None  # one short traceback, from the user's call
    """

    def __init__(self):
        self._previous = None
        self._stopping = False
        self._held_since = None  # monotonic time of a Ctrl-C held during a Py4J call
        self._timer = None  # its re-delivery
        self._redelivered = False

    def __enter__(self) -> Interruptible:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):  # not SIG_IGN, SIG_DFL or a handler set outside Python
                signal.signal(signal.SIGINT, self._handle)
                self._previous = previous
        return self

    def _handle(self, signum, frame) -> None:
        if self._held_since is not None:  # the re-delivery of a held Ctrl-C, or one more while it is held
            if self._redelivered:  # (one more while the re-delivery is pending: that one decides)
                self._raise_when_out_of_py4j(signum, frame)
            return
        if self._stopping:
            return  # the call is stopping already
        self._stopping = True
        _STOPPING.set()
        if _raises_keyboard_interrupt(self._previous):
            self._held_since = time.monotonic()
            self._raise_when_out_of_py4j(signum, frame)
            return
        self._previous(signum, frame)  # a notebook's or the user's own: it decides
        self._stopping = False  # it returned: nothing stops
        _STOPPING.clear()

    def _raise_when_out_of_py4j(self, signum, frame) -> None:
        if _in_py4j(frame) and time.monotonic() - self._held_since < HOLD_S:
            self._redelivered = False
            self._timer = threading.Timer(_RECHECK_S, self._redeliver, (signum,))
            self._timer.daemon = True
            self._timer.start()
            return
        self._held_since = None
        raise KeyboardInterrupt

    def _redeliver(self, signum) -> None:
        self._redelivered = True
        signal.pthread_kill(threading.main_thread().ident, signum)  # to the main thread: ends a sleep or a wait

    def __exit__(self, exc_type, exc, tb) -> bool:
        held = self._held_since is not None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        self._held_since = None
        if self._stopping:
            self._stopping = False
            _STOPPING.clear()
        if held and exc_type is None:  # the call ended while a Ctrl-C was held: it is not lost
            raise KeyboardInterrupt
        return False
