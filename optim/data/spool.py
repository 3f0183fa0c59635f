"""A rank's local copy of its partition: Spark's Arrow batches, read once and written still encoded to an
Arrow IPC file on the executor's local disk, in fixed blocks. Rank side (pure pyarrow: no PySpark).

* **Where**: ``<local dir>/tfnet-spool/``, the local dir being the first of Spark's ``SPARK_LOCAL_DIRS``
  (which Spark sets for its Python workers), else the system's temporary folder.
* **Blocks**: :data:`~optim.data.stream.DEFAULT_BLOCK_ROWS` rows each (the last one shorter), cut
  from whatever batches Spark sent, so the epoch's order never depends on how Spark cut them. Each row
  keeps its position in the partition (:data:`~optim.data.stream.ROW_COLUMN`). Memory: one block
  and the batch Spark is sending.
* **Every way out**: the file is removed when the rank is done, when it fails, and when writing fails
  (a full disk raises :class:`~optim.errors.StorageError` naming the folder and the bytes it needed).
  A process that was killed cannot remove its own: its name holds its process id, and the next spool
  on that host removes every file whose process is gone (:func:`sweep`).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable

import pyarrow as pa

from optim.data.stream import DEFAULT_BLOCK_ROWS, PIXELS_KEY, BlockSource
from optim.errors import StorageError

__all__ = ["SPOOL_FOLDER", "SpoolFile", "SpoolWriter", "local_dir", "spool_folder", "sweep"]

log = logging.getLogger("tfnet.data")

SPOOL_FOLDER = "tfnet-spool"
_NAME = re.compile(r"^tfnet-.*-pid(\d+)\.arrow(\.part)?$")


def local_dir() -> str:
    """The executor's local folder: the first of ``SPARK_LOCAL_DIRS`` (comma-separated, set by Spark for
    its Python workers), else the system's temporary folder."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d.strip()]
    return dirs[0].strip() if dirs else tempfile.gettempdir()


def spool_folder(base: str | None = None) -> str:
    """``<base or local_dir()>/tfnet-spool``, made if missing."""
    folder = os.path.join(base or local_dir(), SPOOL_FOLDER)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise _storage_error(exc, folder, 0, 0) from None
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: str) -> list[str]:
    """Removes the spool files in ``folder`` whose process is gone (a killed rank's leftovers); returns them."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            os.remove(os.path.join(folder, name))
            removed.append(name)
        except OSError:
            pass
    if removed:
        log.info("Removed %d local cop(ies) left by killed ranks in %s: %s", len(removed), folder, removed)
    return removed


def _storage_error(exc: OSError, folder: str, written: int, needed: int) -> StorageError:
    code = exc.errno
    if code is None:  # Arrow's own OSError carries the system's code in its text: "[errno 28] ..."
        found = re.search(r"errno (\d+)", str(exc))
        code = int(found.group(1)) if found else None
    reason = os.strerror(code) if code else (exc.strerror or str(exc))
    full = code in (errno.ENOSPC, errno.EDQUOT)
    what = "is full" if full else "cannot be written"
    err = StorageError(
        f"The local copy of this rank's partition cannot be kept: {folder} {what} ({reason}); it needed at least "
        f"{written + needed} bytes ({written} written, {needed} more for the next block). Give Spark's local dirs "
        "(spark.local.dir, SPARK_LOCAL_DIRS) room for the partition's encoded rows, or pass streaming=False to "
        "hold the partition in memory."
    )
    err.folder = folder  # type: ignore[attr-defined]
    return err


class SpoolWriter:
    """Writes Arrow record batches to one spool file in blocks of ``block_rows`` rows.

    Args:
        path: The file (written as ``path + ".part"``, renamed by :meth:`finish`).
        block_rows: Rows per block. Default :data:`~optim.data.stream.DEFAULT_BLOCK_ROWS`.
    """

    def __init__(self, path: str, block_rows: int = DEFAULT_BLOCK_ROWS):
        self.path, self.block_rows = path, int(block_rows)
        self.part = path + ".part"
        self.folder = os.path.dirname(path)
        self.rows: list[int] = []
        self.written = 0
        self._pending: list[pa.RecordBatch] = []
        self._have = 0
        self._sink = self._writer = None
        self._file_schema: pa.Schema | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Adds ``batch``'s rows (which carry :data:`~optim.data.stream.ROW_COLUMN`). A column of decoded pixels
        stored as uint8 so far that comes as float32 (:func:`~optim.data.stream.pixel_column`: an image resized)
        widens the file to float32 (the blocks written are rewritten once); a later uint8 part is stored widened."""
        schema = self._schema()
        if schema is not None and not batch.schema.equals(schema):
            wide = _widened(schema, batch.schema)
            if not wide.equals(schema):
                self._widen(wide)
            batch = batch.cast(wide)
        start = 0
        while start < batch.num_rows:
            take = min(self.block_rows - self._have, batch.num_rows - start)
            self._pending.append(batch.slice(start, take))
            self._have += take
            start += take
            if self._have == self.block_rows:
                self._flush()

    def _schema(self) -> pa.Schema | None:
        if self._pending:
            return self._pending[0].schema
        return self._file_schema

    def _widen(self, schema: pa.Schema) -> None:
        """Rewrites the blocks written so far, and casts the pending rows, to ``schema``."""
        self._pending = [b.cast(schema) for b in self._pending]
        if self._writer is None:
            return
        try:
            self._writer.close()
            self._sink.close()
            os.replace(self.part, self.part + ".narrow")
            with pa.OSFile(self.part + ".narrow", "rb") as old:
                reader = pa.ipc.open_file(old)
                self._sink = pa.OSFile(self.part, "wb")
                self._writer = pa.ipc.new_file(self._sink, schema)
                self._file_schema = schema
                self.written = 0
                for i in range(reader.num_record_batches):
                    block = reader.get_batch(i).cast(schema)
                    self._writer.write_batch(block)
                    self.written += block.nbytes
        except OSError as exc:
            self.abort()
            raise _storage_error(exc, self.folder, self.written, 0) from None
        finally:
            try:
                os.remove(self.part + ".narrow")
            except OSError:
                pass

    def _flush(self) -> None:
        if not self._have:
            return
        table = pa.Table.from_batches(self._pending)
        block = table.combine_chunks().to_batches()[0] if len(self._pending) > 1 else self._pending[0]
        self._pending, self._have = [], 0
        try:
            if self._writer is None:
                self._sink = pa.OSFile(self.part, "wb")
                self._writer = pa.ipc.new_file(self._sink, block.schema)
                self._file_schema = block.schema
            self._writer.write_batch(block)
        except OSError as exc:
            needed = block.nbytes
            self.abort()
            raise _storage_error(exc, self.folder, self.written, needed) from None
        self.written += block.nbytes
        self.rows.append(block.num_rows)

    def finish(self, schema: pa.Schema | None = None) -> SpoolFile:
        """Writes the last block, closes the file and returns it as a :class:`SpoolFile` (no rows:
        no file)."""
        try:
            self._flush()
            if self._writer is not None:
                self._writer.close()
                self._sink.close()
                os.replace(self.part, self.path)
        except OSError as exc:
            self.abort()
            raise _storage_error(exc, self.folder, self.written, 0) from None
        return SpoolFile(self.path if self._writer is not None else None, self.rows)

    def abort(self) -> None:
        """Closes and removes what was written."""
        for closing in (self._writer, self._sink):
            try:
                if closing is not None:
                    closing.close()
            except (OSError, pa.ArrowException):
                pass
        self._writer = self._sink = None
        for path in (self.part, self.path):
            try:
                os.remove(path)
            except OSError:
                pass


class _Reader:
    """A block is a view of the file's pages (a memory map of its own, no copy: the window's gather is the one copy
    of its rows), unmapped once the block's table is dropped. One map for the whole file would keep every page read
    in the pass resident; one a block keeps only the blocks still in use."""

    def __init__(self, path: str):
        self._path = path
        with pa.memory_map(path) as f:  # the file is there and readable: errors come here, not at the first block
            pa.ipc.open_file(f)

    def read(self, block: int) -> pa.Table:
        with pa.memory_map(self._path) as f:
            return pa.Table.from_batches([pa.ipc.open_file(f).get_batch(block)])

    def close(self) -> None:
        pass


class _Empty:
    def read(self, block: int) -> pa.Table:  # pragma: no cover - no blocks to read
        raise IndexError(block)

    def close(self) -> None:
        pass


class SpoolFile(BlockSource):
    """A finished spool file: the rows of each block, and readers of it. ``release()`` removes it."""

    def __init__(self, path: str | None, block_rows: list[int]):
        self.path, self.block_rows = path, list(block_rows)

    @property
    def nbytes(self) -> int:
        return os.path.getsize(self.path) if self.path and os.path.exists(self.path) else 0

    def open(self):
        return _Reader(self.path) if self.path else _Empty()

    def release(self) -> None:
        if self.path:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


def _widened(stored: pa.Schema, incoming: pa.Schema) -> pa.Schema:
    """The schema that holds both: a pixel column (:data:`~optim.data.stream.PIXELS_KEY`) stored as uint8 in one
    and as float32 in the other is float32; any other difference is a bug upstream (every part of a partition is
    read into the same columns)."""
    if stored.names != incoming.names:
        raise ValueError(f"A local copy's parts differ in their columns: {stored.names} against {incoming.names}")
    fields = []
    for a, b in zip(stored, incoming):
        if a.type == b.type:
            fields.append(a)
        elif PIXELS_KEY in (a.metadata or {}) and pa.types.is_fixed_size_list(a.type) and \
                pa.types.is_fixed_size_list(b.type) and a.type.list_size == b.type.list_size:
            fields.append(a if pa.types.is_floating(a.type.value_type) else b)
        else:
            raise ValueError(f"A local copy's parts differ in column {a.name!r}: {a.type} against {b.type}")
    return pa.schema(fields, metadata=stored.metadata)


def spool_path(folder: str, name: str) -> str:
    """``folder/tfnet-<name>-pid<this process>.arrow``: the process id lets :func:`sweep` tell a live
    rank's file from a killed one's."""
    return os.path.join(folder, f"tfnet-{name}-pid{os.getpid()}.arrow")


def spool(batches: Iterable[pa.RecordBatch], folder: str, names: dict[str, str],
          route: Callable[[pa.RecordBatch], dict[str, pa.RecordBatch]],
          block_rows: int = DEFAULT_BLOCK_ROWS) -> dict[str, SpoolFile]:
    """Reads ``batches`` once into one spool file per key of ``names`` (``{key: name}``); ``route``
    splits each incoming batch into ``{key: numbered rows}`` (checks and filters included). On any
    error every file is removed."""
    sweep(folder)
    writers = {key: SpoolWriter(spool_path(folder, name), block_rows) for key, name in names.items()}
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for key, part in route(batch).items():
                writers[key].write(part)
        return {key: w.finish() for key, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
