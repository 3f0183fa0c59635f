"""Writing local files atomically: a temporary file in the same folder, then a rename, so that a reader
(or a crash) never sees half a file; and sweeping the temporaries a killed writer left. The one atomic
writer for local paths (:mod:`tfnet.storage` uses it for them; object stores have their own moves).
Pure standard library."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading

__all__ = ["STALE_TEMPORARY_S", "sweep_stale_temporaries", "write_bytes_atomic", "write_json_atomic"]

_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask (reading it means setting it, so under a lock)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


#: Temporary files of :func:`write_bytes_atomic` are ``.tmp-<host>.<pid>.<random>``; one whose
#: writer is gone (a dead process on this host, or older than this many seconds) is stale.
STALE_TEMPORARY_S = 600.0


def _host() -> str:
    return socket.gethostname().replace(".", "_") or "host"


def _temporary_prefix() -> str:
    return f".tmp-{_host()}.{os.getpid()}."


def _writer_gone(name: str, host: str) -> bool:
    """True when ``name`` is a temporary of a process on this host that no longer runs."""
    parts = name[len(".tmp-"):].split(".")
    if len(parts) < 3 or parts[0] != host or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, but another user's
        return False
    return False


def sweep_stale_temporaries(folder: str, max_age_s: float = STALE_TEMPORARY_S) -> list[str]:
    """Removes the ``.tmp-*`` files in ``folder`` left by a killed writer: those of a dead process
    on this host, and any older than ``max_age_s``. Returns the paths removed."""
    import time

    try:
        names = [n for n in os.listdir(folder) if n.startswith(".tmp-")]
    except OSError:
        return []
    host = _host()
    removed = []
    now = time.time()
    for name in names:
        path = os.path.join(folder, name)
        try:
            stale = _writer_gone(name, host) or now - os.stat(path).st_mtime > max_age_s
            if stale:
                os.unlink(path)
                removed.append(path)
        except OSError:  # gone meanwhile, or a folder
            continue
    return removed


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(), dir=folder)
    try:
        # mkstemp makes the file 0600; give it the mode open() would (0666 less the umask), so that a
        # model written to a shared volume stays readable by the other users of that volume.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str, obj: object) -> None:
    write_bytes_atomic(path, json.dumps(obj, indent=2, sort_keys=False).encode("utf-8"))
