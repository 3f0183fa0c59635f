"""Errors as data across the Spark boundary. Pure: runs on both sides.

A rank that fails turns its exception into a :class:`WorkerFailure` (class name, message, whether
a retry can help, the worker's formatted traceback), and that travels one way, in both modes: inside its
task's error text, between :data:`FAILURE_OPEN` and :data:`FAILURE_CLOSE` (base64 of the failure's JSON:
:func:`failure_text`), which Spark carries to the driver or Spark Connect client whatever the ranks can
reach. The driver reads it back with :func:`failures_in` (nothing is parsed but that span) and rebuilds
the error (:func:`to_exception`) instead of parsing Py4J text.
"""

from __future__ import annotations

import base64
import errno
import json
import re
import time
import traceback
from dataclasses import asdict, dataclass

from optim.errors import SparkSetupError, WorkerError, error_class

__all__ = ["WorkerFailure", "from_exception", "to_exception", "pick_root", "raised_at", "failure_text", "failures_in",
           "read_failures"]

FAILURE_OPEN = "[tfnet-failure:"
FAILURE_CLOSE = ":tfnet-failure]"
_FAILURE = re.compile(re.escape(FAILURE_OPEN) + r"([A-Za-z0-9+/=]+)" + re.escape(FAILURE_CLOSE))
#: The worker traceback a failure carries through the error text (the start is cut).
TRACEBACK_CHARS = 4000

# Builtin exceptions that mean the input or the code is wrong: rerunning the stage cannot help.
_BUILTIN_NOT_RETRYABLE = {"ValueError": ValueError, "TypeError": TypeError, "KeyError": KeyError,
                          "IndexError": IndexError, "FloatingPointError": FloatingPointError}
# What a rank's error says when a peer died under it (a collective aborted): TensorFlow wraps
# Horovod's shutdown in an op error of its own, so the class alone does not tell.
_PEER_GONE = ("Horovod has been shut down", "HorovodInternalError", "Connection reset by peer",
              "Connection closed by peer", "Broken pipe")
# OSErrors that a rerun meets again: a full disk or quota, a read-only file system, no permission.
_HOPELESS_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
# Exceptions that mean a peer or the network went away: a rerun can succeed.
_RETRYABLE_NAMES = {"HorovodInternalError", "ConnectionError", "ConnectionResetError", "BrokenPipeError",
                    "TimeoutError", "OSError", "EOFError", "RendezvousError", "StageRetryError",
                    "DistributedTrainingError"}


@dataclass(frozen=True)
class WorkerFailure:
    """One rank's exception, as data."""

    cls: str
    message: str
    retryable: bool
    traceback: str
    rank: int = -1
    time: float = 0.0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WorkerFailure:
        return cls(**json.loads(data.decode()))


def read_failures(blobs) -> list[WorkerFailure]:
    """The failures in ``blobs`` (:meth:`WorkerFailure.to_json` each, as the ranks leave them in the store); a blob
    that is not one is passed over."""
    out = []
    for data in blobs:
        try:
            out.append(WorkerFailure.from_json(data))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def from_exception(exc: BaseException, rank: int = -1) -> WorkerFailure:
    """``exc`` as data. ``retryable`` comes from the exception's class attribute when it has
    one (every optim error does), else from its name and whether it says a peer went away
    (network and Horovod errors retry; the rest, programming errors included, do not)."""
    name, message = type(exc).__name__, str(exc)
    retryable = getattr(exc, "retryable", None)
    hopeless = _hopeless_os_error(exc)
    if hopeless is not None and not isinstance(retryable, bool):
        name, retryable = "StorageError", False
        message = (f"{message} (a rerun would fail the same way: errno {errno.errorcode.get(hopeless, hopeless)}; "
                   "free space or fix the permissions, then run again)")
    if not isinstance(retryable, bool):
        retryable = name in _RETRYABLE_NAMES or any(s in message for s in _PEER_GONE)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return WorkerFailure(name, message, retryable, text, rank, time.time())


def _hopeless_os_error(exc: BaseException) -> int | None:
    """The errno of an OSError (in ``exc`` or its causes) that a rerun meets again, or None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _HOPELESS_ERRNOS:
            return exc.errno
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def to_exception(failure: WorkerFailure) -> Exception:
    """The exception to raise on the driver: the same tfnet/optim class when there is one, the
    same builtin for input errors, :class:`SparkSetupError` for import failures, else
    :class:`WorkerError` naming the original class. The message says which rank raised it (the
    column, partition and row are in the rank's own message where it knows them); the worker's
    traceback is attached as ``worker_traceback``, and a one-line note says where on the rank it
    was raised (the whole traceback as the note with ``TFNET_VERBOSE=1``)."""
    cls = error_class(failure.cls)
    message = failure.message
    if failure.rank >= 0 and f"rank {failure.rank}" not in message.lower():
        message = f"{message} (rank {failure.rank})"
    if cls is not None:
        err: Exception = cls(message)
    elif failure.cls in _BUILTIN_NOT_RETRYABLE:
        err = _BUILTIN_NOT_RETRYABLE[failure.cls](message)
    elif failure.cls in ("ImportError", "ModuleNotFoundError"):
        err = SparkSetupError(f"A Spark worker failed to import: {message}")
    else:
        err = WorkerError(f"Rank {failure.rank} failed with {failure.cls}: {failure.message}")
    err.retryable = failure.retryable  # type: ignore[attr-defined]
    err.worker_traceback = failure.traceback  # type: ignore[attr-defined]
    err.rank = failure.rank  # type: ignore[attr-defined]
    if hasattr(err, "add_note"):
        if _verbose():
            err.add_note(f"Traceback on rank {failure.rank}:\n{failure.traceback.rstrip()}")
        else:
            where = raised_at(failure.traceback)
            err.add_note(f"Raised on rank {failure.rank}{f' at {where}' if where else ''}; the rank's traceback is in "
                         "the error's `worker_traceback` (TFNET_VERBOSE=1 prints it).")
    return err


def _verbose() -> bool:
    import os

    return os.environ.get("TFNET_VERBOSE", "0") not in ("", "0")


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def raised_at(text: str) -> str:
    """``"optim/arrow.py:132 (read_column)"``: the innermost frame of a formatted traceback, its path
    from the package folder on; "" when there is none."""
    frames = [m for m in (_FRAME.match(line) for line in text.splitlines()) if m]
    if not frames:
        return ""
    path = frames[-1].group("path").replace("\\", "/")
    for root in ("/optim/", "/tfnet/", "/site-packages/"):
        if root in path:
            path = path[path.rindex(root) + (1 if root != "/site-packages/" else len(root)):]
            break
    return f"{path}:{frames[-1].group('line')} ({frames[-1].group('func')})"


def pick_root(failures: list[WorkerFailure]) -> WorkerFailure | None:
    """The failure that caused the others: the first non-retryable one (a rank's own error makes
    its peers fail in the collective afterwards), else the earliest."""
    if not failures:
        return None
    hard = [f for f in failures if not f.retryable]
    return min(hard or failures, key=lambda f: f.time)


def failure_text(failure: WorkerFailure) -> str:
    """``failure`` as a span of text an exception message can carry through Spark."""
    import dataclasses

    short = dataclasses.replace(failure, traceback=failure.traceback[-TRACEBACK_CHARS:])
    return FAILURE_OPEN + base64.b64encode(short.to_json()).decode("ascii") + FAILURE_CLOSE


def failures_in(text: str) -> list[WorkerFailure]:
    """The failures :func:`failure_text` put into ``text`` (an error message from Spark), once each."""
    out, seen = [], set()
    for match in _FAILURE.finditer(text or ""):
        if match.group(1) in seen:
            continue
        seen.add(match.group(1))
        try:
            out.append(WorkerFailure.from_json(base64.b64decode(match.group(1))))
        except (ValueError, TypeError, KeyError):
            continue
    return out
