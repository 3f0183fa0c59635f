"""Ctrl-C at a public call (``TFOptimizer.optimize``, ``evaluate``). Driver side (any process).

The first Ctrl-C interrupts as the process's own handler says (Python's, pyspark's, a notebook's): a
Spark job then is cancelled and its tasks end first (:func:`optim.spark.jobs.run_job`). Every further
Ctrl-C while the call stops (the job cancelled, its tasks ending, the channels closed) is ignored, so
that it cannot break the stop half-way (a second Ctrl-C printed py4j's "reentrant call" tracebacks).
While a call stops, :func:`stopping` is true, and the progress bar prints nothing more (rank 0 goes on
reporting epochs until its task is killed).
"""

from __future__ import annotations

import signal
import threading

__all__ = ["Interruptible", "stopping"]

_STOPPING = threading.Event()


def stopping() -> bool:
    """Whether a call in this process is stopping on Ctrl-C."""
    return _STOPPING.is_set()


class Interruptible:
    """Around a public call, on the main thread: the first Ctrl-C goes to the process's own SIGINT
    handler (which raises ``KeyboardInterrupt``, and pyspark's also cancels every job), and every
    later one, while the call stops, is ignored. The handler is put back when the call returns or
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

    def __enter__(self) -> Interruptible:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):  # not SIG_IGN, SIG_DFL or a handler set outside Python
                signal.signal(signal.SIGINT, self._handle)
                self._previous = previous
        return self

    def _handle(self, signum, frame) -> None:
        if self._stopping:
            return  # the call is stopping already
        self._stopping = True
        _STOPPING.set()
        self._previous(signum, frame)  # raises KeyboardInterrupt (Python's, pyspark's), or decides otherwise
        self._stopping = False  # it returned: nothing stops
        _STOPPING.clear()

    def __exit__(self, *exc) -> bool:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self._stopping:
            self._stopping = False
            _STOPPING.clear()
        return False
