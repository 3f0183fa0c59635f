"""tfnet's one container format: named numpy arrays and a JSON header in one ``.npz``, checksummed.

Used for a serialized net, rank 0's training result and checkpoints. Not a pickle: read with
``allow_pickle=False``, so loading one cannot run code. The header holds a format name and a
SHA-256 of every array, so a truncated, corrupt or foreign file is detected, never loaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from tfnet.errors import TFNetError

__all__ = ["ContainerError", "digest", "pack", "unpack"]

HEADER_KEY = "header"


class ContainerError(TFNetError, ValueError):
    """Bytes that are not a valid tfnet container of the expected format."""


def digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over every array's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode())
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def pack(fmt: str, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """The container bytes: ``arrays`` plus ``header`` (JSON-serialisable) with ``format`` and
    ``sha256`` added.

    Raises:
        ContainerError: an array of dtype object, or an array named ``header``.
    """
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    for key, a in arrays.items():
        if key == HEADER_KEY:
            raise ContainerError(f"An array may not be named {HEADER_KEY!r}.")
        if a.dtype == object:
            raise ContainerError(f"Array {key!r} has dtype object; only numeric arrays are stored.")
    full = dict(header)
    full.update(format=fmt, sha256=digest(arrays))
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{HEADER_KEY: np.frombuffer(json.dumps(full).encode("utf-8"), np.uint8)})
    return buf.getvalue()


def unpack(data: bytes, fmt: str, what: str = "data") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(header, arrays)`` from container bytes, verified.

    Args:
        data: The bytes.
        fmt: The format expected in the header.
        what: Names the source in error messages (a path, "rank 0's result").

    Raises:
        ContainerError: unreadable, another format, or a checksum mismatch.
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        header = json.loads(bytes(arrays.pop(HEADER_KEY)).decode("utf-8"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise ContainerError(f"{what}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict) or header.get("format") != fmt:
        got = header.get("format") if isinstance(header, dict) else None
        raise ContainerError(f"{what}: expected format {fmt!r}, received {got!r}.")
    if digest(arrays) != header.get("sha256"):
        raise ContainerError(f"{what}: checksum mismatch; the data is corrupt.")
    return header, arrays
