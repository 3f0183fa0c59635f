"""Where tfnet reads and writes files: a local path, or any URI that fsspec understands (``s3://``,
``gs://``, ``abfs://``, ``hdfs://``, ``file://``). The one seam for checkpoints, TensorBoard
events, exports and the exchange between the driver and the ranks.

Local paths keep plain ``os`` calls. A URI goes through ``fsspec`` with the file system the scheme
names (``pip install tfnet[s3]`` for ``s3fs``, ``tfnet[gcs]``, ``tfnet[azure]``, ``tfnet[hdfs]``);
credentials come from where that library looks (the environment, an instance profile, its own
config files), or from ``storage_options`` given by the caller (fsspec's keyword, as pandas and
Dask take it), never from tfnet's files.

Writes are atomic everywhere, so a reader never sees part of a file under its final name. On a file
system (local, HDFS) the bytes go to a temporary name in the same folder (``.tmp-...``) and are then
moved into place. On an object store (``s3://``, ``gs://``, ``abfs://``) one upload is already atomic:
an object appears under its name whole when its upload completes (S3's PutObject and multipart
completion, GCS's uploads, Azure's block-blob commit), and until then the name keeps its old object or
none; so the bytes go straight to their name. A move there would be a server-side copy and a delete:
twice the traffic, and with gcsfs, where the store does not offer GCS's moveTo call (an emulator), a
fallback after about 30 s of retries on every write.
"""

from __future__ import annotations

import os
import posixpath
import secrets
from collections.abc import Mapping
from typing import Any

from tfnet.atomic import write_bytes_atomic as write_local
from tfnet.errors import TFNetError

__all__ = ["StorageUnavailableError", "exists", "filesystem", "is_remote", "isdir", "join", "listdir", "makedirs",
           "read_bytes", "remove", "rmtree", "upload_file", "write_bytes_atomic"]

# scheme -> the pip extra that brings its fsspec implementation
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "abfs": "azure", "abfss": "azure", "az": "azure",
           "hdfs": "hdfs", "viewfs": "hdfs"}

#: Schemes of object stores: keys, no folders (making one would make a bucket, or nothing), and an upload is
#: atomic (an object appears whole when its upload completes).
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"}


class StorageUnavailableError(TFNetError, ImportError):
    """A URI whose file system is not installed (``pip install tfnet[s3]``, ...)."""


def is_remote(path: str | os.PathLike | None) -> bool:
    """True for a URI with a scheme other than ``file``; False for a local path (or None)."""
    if path is None:
        return False
    text = os.fspath(path)
    return "://" in text and not text.startswith("file://")


def _scheme(path) -> str:
    return os.fspath(path).split("://", 1)[0].lower()


def _local(path) -> str:
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


def filesystem(uri: str, storage_options: Mapping[str, Any] | None = None):
    """``(fsspec file system, path inside it)`` for a URI.

    Raises:
        StorageUnavailableError: fsspec, or the scheme's implementation, is not installed.
    """
    scheme = uri.split("://", 1)[0].lower()
    try:
        import fsspec
    except ImportError:
        raise StorageUnavailableError(
            f"{uri!r} is a URI, and reading it needs fsspec: pip install 'tfnet[{_EXTRAS.get(scheme, 's3')}]'."
        ) from None
    options = dict(storage_options or {})
    if scheme == "s3a":  # Hadoop's name for the same store
        uri = "s3://" + uri.split("://", 1)[1]
    try:
        fs, path = fsspec.core.url_to_fs(uri, **options)
    except (ImportError, ValueError) as exc:
        extra = _EXTRAS.get(scheme)
        hint = f"pip install 'tfnet[{extra}]'" if extra else "install the fsspec implementation for that scheme"
        raise StorageUnavailableError(f"Cannot open {uri!r}: {exc} ({hint}).") from None
    return fs, path


def join(base: str, *parts: str) -> str:
    """``os.path.join`` for local paths; ``/``-joined for URIs."""
    if is_remote(base):
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


def read_bytes(path, storage_options=None) -> bytes:
    """The file's bytes. Raises FileNotFoundError when it does not exist."""
    if not is_remote(path):
        with open(_local(path), "rb") as f:
            return f.read()
    fs, p = filesystem(os.fspath(path), storage_options)
    return fs.cat_file(p)


def write_bytes_atomic(path, data: bytes, storage_options=None) -> None:
    """Writes ``data`` to ``path`` atomically: on an object store as one upload (atomic there), elsewhere through
    a temporary name in the same folder and a move."""
    if not is_remote(path):
        write_local(_local(path), data)
        return
    fs, p = filesystem(os.fspath(path), storage_options)
    if _scheme(path) in _OBJECT_STORES:
        fs.pipe_file(p, data)
        return
    folder, name = posixpath.split(p)
    tmp = posixpath.join(folder, f".tmp-{secrets.token_hex(6)}-{name}")
    fs.pipe_file(tmp, data)
    try:
        fs.mv(tmp, p)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)


def _fresh(path, storage_options):
    """``(file system, path inside it)`` with what the file system remembers of ``path`` and its folder forgotten.
    fsspec keeps one file system per set of options in a process, and caches listings in it; the files here are
    written by other processes (the ranks, the driver), so every question asks the store. (``ls(refresh=True)``
    is not enough: adlfs reads ``invalidate_cache=`` instead, and answers ``exists`` from a cached listing of the
    folder, a missing file as a folder.)"""
    fs, p = filesystem(os.fspath(path), storage_options)
    fs.invalidate_cache(p.rstrip("/"))
    fs.invalidate_cache(posixpath.dirname(p.rstrip("/")))
    return fs, p


def exists(path, storage_options=None) -> bool:
    if not is_remote(path):
        return os.path.exists(_local(path))
    fs, p = _fresh(path, storage_options)
    return fs.exists(p)


def isdir(path, storage_options=None) -> bool:
    if not is_remote(path):
        return os.path.isdir(_local(path))
    fs, p = _fresh(path, storage_options)
    return fs.isdir(p)


def listdir(path, storage_options=None) -> list[str]:
    """The names (not paths) in a folder; an empty list when it does not exist."""
    if not is_remote(path):
        try:
            return sorted(os.listdir(_local(path)))
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs, p = _fresh(path, storage_options)
    try:
        entries = fs.ls(p, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return sorted(posixpath.basename(e.rstrip("/")) for e in entries if e.rstrip("/") != p.rstrip("/"))


def makedirs(path, storage_options=None) -> None:
    """Creates a folder (and its parents): local, or on a file system with folders (HDFS); on an
    object store there are only keys, so nothing is made."""
    if not is_remote(path):
        os.makedirs(_local(path), exist_ok=True)
        return
    if _scheme(path) in _OBJECT_STORES:
        return
    fs, p = filesystem(os.fspath(path), storage_options)
    fs.makedirs(p, exist_ok=True)


def remove(path, storage_options=None) -> None:
    """Removes a file; a missing one is not an error."""
    if not is_remote(path):
        try:
            os.unlink(_local(path))
        except FileNotFoundError:
            pass
        return
    fs, p = filesystem(os.fspath(path), storage_options)
    try:
        fs.rm(p)
    except FileNotFoundError:
        pass


def rmtree(path, storage_options=None) -> None:
    """Removes a folder and everything in it; a missing one is not an error."""
    if not is_remote(path):
        import shutil

        shutil.rmtree(_local(path), ignore_errors=True)
        return
    fs, p = filesystem(os.fspath(path), storage_options)
    try:
        fs.rm(p, recursive=True)
    except FileNotFoundError:
        pass


def upload_file(local_path: str, path, storage_options=None) -> None:
    """Copies a local file to ``path`` (atomically, as :func:`write_bytes_atomic`)."""
    with open(local_path, "rb") as f:
        write_bytes_atomic(path, f.read(), storage_options)
