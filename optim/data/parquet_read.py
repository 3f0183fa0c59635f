"""A rank's share of Parquet files, read row group by row group (:class:`ParquetSource`, a
:class:`~optim.data.stream.BlockSource`), with Hive-style partition columns filled in from the folder names,
every row's place kept as its position among all the files' rows (:data:`~optim.data.stream.ROW_COLUMN`),
and errors that name the file and the row in it (:class:`FileRows`). Rank side (and the driver's footers:
:func:`filesystem`). Pure pyarrow and fsspec.

A row group that cannot be decoded (corrupt pages) is read once more; when the same error comes back, the
file is corrupt and no retry of the stage can mend it: :class:`~optim.errors.CorruptFileError`, naming the
file, which the launcher does not retry. Any other error (a network fault reading an object store) is
raised as it came, and retried as such.
"""

from __future__ import annotations

import bisect
import os

import numpy as np
import pyarrow as pa

from optim.data import stream
from optim.data.base import Batch
from optim.errors import CorruptFileError, DataError
from tfnet import storage
from tfnet.errors import first_line

__all__ = ["BatchCheck", "FileRows", "ParquetSource", "filesystem", "read_partition"]

#: What pyarrow says when a Parquet file's bytes are wrong (not when the storage under it failed).
_CORRUPT = ("thrift", "corrupt", "magic bytes", "unexpected end", "decompress", "invalid", "page header",
            "snappy", "zstd", "gzip", "lz4", "out of bounds", "not enough")


def filesystem(path: str, storage_options):
    """``(pyarrow file system, path inside it)`` for a local path or an fsspec URI."""
    import pyarrow.fs as pafs

    if not storage.is_remote(path):
        local = path[len("file://"):] if path.startswith("file://") else path
        return pafs.LocalFileSystem(), os.path.abspath(local)
    fs, inner = storage.filesystem(path, storage_options)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner


class FileRows:
    """Names a row by its position among all the files' rows: ``"row 12 of file '/data/part-1.parquet'"``.
    ``starts``: the position of each file's first row, and the total last."""

    def __init__(self, files: list[str], starts: np.ndarray):
        self.files, self.starts = list(files), np.asarray(starts, np.int64)

    def __call__(self, row: int) -> str:
        f = max(0, min(bisect.bisect_right(self.starts.tolist(), int(row)) - 1, len(self.files) - 1))
        return f"row {int(row) - int(self.starts[f])} of file {self.files[f]!r}"


class BatchCheck:
    """Runs a :class:`~optim.data.values.PartitionChecks` on each decoded batch, naming each row by its file
    and its row in it (``locate``); the rows it leaves out are dropped from the batch."""

    def __init__(self, check, locate: FileRows):
        self.check, self.locate = check, locate

    def __call__(self, batch: Batch, index: int, rows: np.ndarray) -> Batch:
        features, labels = batch
        keep = self.check(features, labels, 0, where=self.check.where, locate=lambda i: self.locate(rows[i]))
        if keep is None:
            return batch
        if not keep.any():
            raise DataError(f"Every row of batch {index + 1} of {self.check.where} has NaN or Inf features.")
        features = [np.asarray(f)[keep] for f in features]
        if labels is not None:
            labels = [np.asarray(a)[keep] for a in labels] if isinstance(labels, list) else np.asarray(labels)[keep]
        return features, labels


class ParquetSource(stream.BlockSource):
    """A rank's parts of row groups as blocks: ``pieces`` of ``(file, row group, first row, end row)``,
    ``columns`` read from the files, ``values[f]`` the partition columns of file ``f`` (of ``types``), and
    ``starts[f]`` the position of file ``f``'s first row among all the files' rows. ``names[f]``: the columns
    that file ``f`` names otherwise (column -> its name there; None: the file has none, and it reads as nulls of
    ``kinds[column]``, as Delta reads a column added after the file was written)."""

    def __init__(self, path, storage_options, files, pieces, columns, values=None, types=None, starts=None,
                 names=None, kinds=None):
        self.path, self.storage_options, self.files, self.pieces = path, storage_options, files, pieces
        self.columns, self.values, self.types = list(columns), values or [{} for _ in files], types or {}
        self.starts = np.zeros(len(files) + 1, np.int64) if starts is None else np.asarray(starts, np.int64)
        self.names, self.kinds = names or [{} for _ in files], kinds or {}
        self.block_rows = [b - a for _, _, a, b in pieces]

    def open(self):
        return ParquetReader(self)


class ParquetReader:
    """Reads a :class:`ParquetSource`'s blocks, one file open at a time."""

    def __init__(self, source: ParquetSource):
        self.source = source
        self.fs, _ = filesystem(source.path, source.storage_options)
        self._open: tuple[int, object, object] | None = None

    def _file(self, f: int):
        import pyarrow.parquet as pq

        if self._open is None or self._open[0] != f:
            self.close()
            handle = self.fs.open_input_file(self.source.files[f])
            self._open = (f, handle, pq.ParquetFile(handle))
        return self._open[2]

    def _row_group(self, f: int, g: int) -> pa.Table:
        try:
            return self._columns(f, g)
        except (pa.ArrowInvalid, OSError) as first:
            if not _looks_corrupt(first):
                raise
            self.close()
            try:  # once more from a fresh handle: a fault of the storage goes away, a corrupt file does not
                return self._columns(f, g)
            except (pa.ArrowInvalid, OSError) as again:
                if str(again) != str(first):
                    raise
                raise CorruptFileError(f"Parquet file {self.source.files[f]!r} is corrupt: row group {g} cannot be "
                                       f"decoded ({first_line(again)}). Rewrite or remove the file; a retry reads "
                                       "the same bytes.") from None

    def _columns(self, f: int, g: int) -> pa.Table:
        """Row group ``g`` of file ``f``: its :attr:`~ParquetSource.columns`, under their names whatever the file
        names them, and nulls for those it does not hold."""
        names = self.source.names[f]
        if not names:
            return self._file(f).read_row_group(g, columns=self.source.columns)
        held = [names.get(c, c) for c in self.source.columns]
        table = self._file(f).read_row_group(g, columns=[n for n in held if n is not None])
        fields, arrays = [], []
        for column, name in zip(self.source.columns, held):
            if name is None:
                fields.append(pa.field(column, self.source.kinds[column]))
                arrays.append(pa.nulls(self._file(f).metadata.row_group(g).num_rows, self.source.kinds[column]))
            else:
                fields.append(table.schema.field(name).with_name(column))
                arrays.append(table.column(name))
        return pa.table(arrays, schema=pa.schema(fields))

    def read(self, block: int) -> pa.Table:
        f, g, a, b = self.source.pieces[block]
        table = self._row_group(f, g).slice(a, b - a)
        for name, value in self.source.values[f].items():
            if name in self.source.columns or name not in self.source.types:
                continue
            table = table.append_column(name, pa.array([value] * table.num_rows, self.source.types[name]))
        first = int(self.source.starts[f]) + self._group_start(f, g) + a
        return table.append_column(stream.ROW_COLUMN, pa.array(np.arange(first, first + b - a, dtype=np.int64)))

    def _group_start(self, f: int, g: int) -> int:
        meta = self._file(f).metadata
        return int(sum(meta.row_group(i).num_rows for i in range(g)))

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None


def read_partition(batches, data, size: int, schema: pa.Schema):
    """A ``mapInArrow`` task over a placeholder partition (:func:`optim.data.parquet_frame.as_frame`): each row of
    ``batches`` is a share's number ``r``; yields share ``r`` of ``size`` of ``data``'s rows
    (:meth:`~optim.data.parquet.ParquetDataset.read_share`) as record batches of ``schema``."""
    for batch in batches:
        for share in batch.column(0).to_pylist():
            for table in data.read_share(int(share), size):
                yield from table.cast(schema).to_batches()


def _looks_corrupt(exc: BaseException) -> bool:
    if isinstance(exc, pa.ArrowInvalid):
        return True
    if getattr(exc, "errno", None):  # the operating system's own error: a storage fault, not the bytes
        return False
    text = str(exc).lower()
    return any(word in text for word in _CORRUPT)

