"""Horovod's own threads at idle priority, so that they never take a core from the training step.
Runs in each rank's process (Linux; elsewhere nothing is changed).

Why: Horovod's background thread wakes every millisecond (its cycle time, which cannot be set
safely in a reused process: ``UNSAFE_ACROSS_INIT`` in :mod:`optim.training.horovod`) and
coordinates with the other ranks over Gloo, whose TCP loop thread wakes for every message. On a
host whose cores the ranks' TensorFlow threads fill, those wake-ups cost a training rank about a
fifth of its core even when nothing is being averaged (measured: docs/benchmarks.md, "Issue 19:
Horovod's threads"). As ``SCHED_IDLE`` threads (``sched(7)``) they run only on a core that has
nothing else to run: a spare core, or the rank's own core while its step waits for an average.
A collective is then as fast as before once the step waits for it; what is lost is progress on an
average while every core computes, which on such a host was only ever taken from the computation.

``TFNET_HOROVOD_THREADS=normal`` (in the driver's environment) leaves the threads as Horovod made
them.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("tfnet.training")

#: The choices of ``TFNET_HOROVOD_THREADS``.
MODES = ("idle", "normal")


def mode_from_env() -> str:
    """``TFNET_HOROVOD_THREADS`` (default ``"idle"``), checked. Read on the driver.

    Raises:
        ValueError: a value other than ``idle`` or ``normal``.
    """
    value = os.environ.get("TFNET_HOROVOD_THREADS", "idle").strip().lower() or "idle"
    if value not in MODES:
        raise ValueError(f"TFNET_HOROVOD_THREADS must be one of {', '.join(MODES)}. Received: {value!r}")
    return value


def thread_ids() -> set[int]:
    """The ids of this process's threads (empty where ``/proc`` has none)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def alive(tids) -> list[int]:
    """Those of ``tids`` that are still threads of this process, in their order."""
    now = thread_ids()
    return [t for t in tids if t in now]


class IdleRecord:
    """The threads one :func:`demote` call put under ``SCHED_IDLE``, and which of them still run.

    A Horovod or Gloo thread may end at any time (a short-lived helper of a collective), so
    :attr:`demoted` is the record made at the time and :meth:`live` the part of it that is still
    alive when asked; a thread that has ended is in the first and not in the second.

    Attributes:
        started: The ids of the threads that were offered (those ``hvd.init()`` started).
        demoted: The ids put at idle priority, as :func:`demote` returned them.
    """

    def __init__(self, started=(), idle: bool = True):
        self.started = tuple(sorted(started))
        self.demoted = tuple(demote(set(self.started))) if idle else ()

    def live(self) -> list[int]:
        """The demoted threads that are still alive now."""
        return alive(self.demoted)


def demote(tids: set[int]) -> list[int]:
    """Puts the threads ``tids`` under ``SCHED_IDLE``, except TensorFlow's own (named ``tf_*``,
    which may start at the same time). Returns the ids changed; a thread that has ended or cannot be
    changed (no ``sched_setscheduler``, a seccomp filter) is left as it is."""
    if not hasattr(os, "SCHED_IDLE"):
        return []
    done = []
    for tid in sorted(tids):
        if _name(tid).startswith("tf_"):
            continue
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            done.append(tid)
        except OSError as exc:
            log.debug("Thread %d keeps its scheduling: %s", tid, exc)
    return done
