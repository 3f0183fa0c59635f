"""``TFDataset.from_parquet``: Parquet files read straight by each rank, with no Spark job for the data.
Both sides: the driver (or a Spark Connect client) reads the files' footers, the ranks read their rows.
Pure pyarrow and fsspec (no PySpark): a local path, or any URI fsspec knows (``s3://``, ``gs://``, ...).

The driver lists the files and reads their footers once: the rows of every row group, so the rows of
each rank, and so the steps per epoch, are known before the stage starts. Rank ``r`` of ``n`` takes the
rows ``[r * N // n, (r + 1) * N // n)`` of the files in order (a row group that straddles two ranks is
read by both, each keeping its part), and streams them (:mod:`optim.training.stream`): its blocks are
its parts of row groups, read one at a time, so its memory holds one row group (encoded) besides the
batch, the shuffle window and the prefetched batches. Write Parquet with row groups of a few thousand
rows (Spark's ``parquet.block.size``) for a finer shuffle and a smaller memory.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from optim.errors import DataError
from optim.training import stream
from optim.training.columns import ColumnDataset
from optim.training.datasets import Batch
from tfnet import storage

__all__ = ["ParquetDataset", "list_parquet"]


def _filesystem(path: str, storage_options):
    """``(pyarrow file system, path inside it)``."""
    import pyarrow.fs as pafs

    if not storage.is_remote(path):
        local = path[len("file://"):] if path.startswith("file://") else path
        return pafs.LocalFileSystem(), os.path.abspath(local)
    fs, inner = storage.filesystem(path, storage_options)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner


def list_parquet(path: str, storage_options=None) -> list[str]:
    """The Parquet files at ``path`` (a file, or a folder searched recursively), sorted; names starting
    with ``_`` or ``.`` (Spark's ``_SUCCESS``, checksums) are left out.

    Raises:
        DataError: no Parquet file is there.
    """
    import pyarrow.fs as pafs

    fs, inner = _filesystem(path, storage_options)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.File:
        return [inner]
    if info.type != pafs.FileType.Directory:
        raise DataError(f"No Parquet files at {path!r}: it does not exist.")
    found = []
    for entry in fs.get_file_info(pafs.FileSelector(inner, recursive=True)):
        parts = posixpath.relpath(entry.path, inner).split("/")
        if entry.type == pafs.FileType.File and not any(p.startswith(("_", ".")) for p in parts):
            found.append(entry.path)
    if not found:
        raise DataError(f"No Parquet files at {path!r}: the folder holds none (names starting with _ or . are "
                        "left out).")
    return sorted(found)


class ParquetDataset(ColumnDataset):
    """``TFDataset.from_parquet(path, feature_cols, label_cols, feature_shapes, storage_options)``: see the
    module.

    Args:
        path: A Parquet file, or a folder of them (as Spark writes it), a local path or a URI.
        feature_cols, label_cols, feature_shapes, batch_size, augment: As for
            :class:`~optim.spark.datasets.DataFrameDataset`.
        storage_options: fsspec options for a URI (endpoint, credentials); None for the library's
            defaults. The ranks get them with the job.
        shuffle_buffer: Rows of a shuffle window (the rank's blocks are shuffled, then the rows within
            windows of at least this many rows). Default 2048.
        prefetch: Decoded batches made ahead of the step. Default 2.

    Raises:
        DataError: no Parquet files at ``path``.
        ColumnError: a column that the files do not have.
    """

    distributed = True

    def __init__(self, path: str, feature_cols, label_cols=None, feature_shapes=None, storage_options=None,
                 batch_size: int | None = None, augment=None, shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
                 prefetch: int = stream.DEFAULT_PREFETCH):
        import pyarrow.parquet as pq

        self.path, self.storage_options = str(path), storage_options
        self.batch_size, self.augment = batch_size, augment
        self.shuffle_buffer, self.prefetch = int(shuffle_buffer), int(prefetch)
        self._set_columns(feature_cols, label_cols, feature_shapes)
        self.files = list_parquet(self.path, storage_options)
        fs, _ = _filesystem(self.path, storage_options)
        self.groups: list[tuple[int, int, int]] = []  # (file, row group, rows)
        schema = None
        for f, name in enumerate(self.files):
            with fs.open_input_file(name) as handle:
                meta = pq.ParquetFile(handle).metadata
                schema = schema or meta.schema.to_arrow_schema()
            self.groups.extend((f, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
        self._check_present(list(schema.names), f"the Parquet files at {self.path!r}")
        self._kinds = {f.name: _kind(f.type) for f in schema}
        self.check: Callable | None = None

    @property
    def num_rows(self) -> int:
        return int(sum(rows for _, _, rows in self.groups))

    def column_kinds(self) -> dict[str, str]:
        return dict(self._kinds)

    def pieces(self, rank: int, size: int) -> list[tuple[int, int, int, int]]:
        """Rank ``rank``'s share: ``(file, row group, first row, end row)`` parts of row groups, in order."""
        total = self.num_rows
        lo, hi = rank * total // size, (rank + 1) * total // size
        out, start = [], 0
        for f, g, rows in self.groups:
            a, b = max(lo, start), min(hi, start + rows)
            if a < b:
                out.append((f, g, a - start, b - start))
            start += rows
        return out

    def rows_on(self, rank: int, size: int) -> int:
        return int(sum(b - a for _, _, a, b in self.pieces(rank, size)))

    def num_batches(self, batch_size, *, rank=0, size=1, drop_remainder=False) -> int:
        n = self.rows_on(rank, size)
        return n // batch_size if drop_remainder else -(-n // batch_size)

    def checked(self, check) -> ParquetDataset:
        """A copy whose batches go through ``check`` (:class:`optim.training.checks.PartitionChecks`) as
        they are decoded: the rows are not read before training, so each batch is checked on its way."""
        import copy

        out = copy.copy(self)
        out.check = check
        return out

    def shard(self, rank: int, size: int) -> stream.StreamedDataset:
        """Rank ``rank``'s rows as a stream."""
        source = _ParquetSource(self.path, self.storage_options, self.files, self.pieces(rank, size), self.columns())
        decoder = stream.Decoder(self.features, self.labels, self.single_label, rank)
        on_batch = _BatchCheck(self.check) if self.check is not None else None
        return stream.StreamedDataset(source, decoder, self.augment, self.shuffle_buffer, self.prefetch, on_batch)

    def batches(self, batch_size, *, epoch=0, seed=0, shuffle=True, skip=0, rank=0, size=1,
                drop_remainder=False, steps=None, training=False):
        return self.shard(rank, size).batches(batch_size, epoch=epoch, seed=seed, shuffle=shuffle, skip=skip, rank=rank,
                                              size=size, drop_remainder=drop_remainder, steps=steps, training=training)


def _kind(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = t.value_type
        nested = pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner)
        return "other" if nested else "flat"
    return "image" if pa.types.is_binary(t) or pa.types.is_large_binary(t) else "other"


class _BatchCheck:
    """Runs a PartitionChecks on each decoded batch (rows named by their place in the batch); the rows it
    leaves out are dropped from the batch."""

    def __init__(self, check):
        self.check = check

    def __call__(self, batch: Batch, index: int) -> Batch:
        features, labels = batch
        keep = self.check(features, labels, 0, where=f"{self.check.where}, batch {index + 1}")
        if keep is None:
            return batch
        if not keep.any():
            raise DataError(f"Every row of batch {index + 1} of {self.check.where} has NaN or Inf features.")
        features = [np.asarray(f)[keep] for f in features]
        if labels is not None:
            labels = [np.asarray(a)[keep] for a in labels] if isinstance(labels, list) else np.asarray(labels)[keep]
        return features, labels


class _ParquetSource(stream.BlockSource):
    """A rank's parts of row groups as blocks."""

    def __init__(self, path, storage_options, files, pieces, columns):
        self.path, self.storage_options, self.files, self.pieces, self.columns = (path, storage_options, files, pieces,
                                                                                  columns)
        self.block_rows = [b - a for _, _, a, b in pieces]
        self.first = np.concatenate([[0], np.cumsum(self.block_rows)]).astype(np.int64)

    def open(self):
        return _ParquetReader(self)


class _ParquetReader:
    def __init__(self, source: _ParquetSource):
        self.source = source
        self.fs, _ = _filesystem(source.path, source.storage_options)
        self._open: tuple[int, object, object] | None = None

    def _file(self, f: int):
        import pyarrow.parquet as pq

        if self._open is None or self._open[0] != f:
            self.close()
            handle = self.fs.open_input_file(self.source.files[f])
            self._open = (f, handle, pq.ParquetFile(handle))
        return self._open[2]

    def read(self, block: int) -> pa.Table:
        f, g, a, b = self.source.pieces[block]
        table = self._file(f).read_row_group(g, columns=self.source.columns).slice(a, b - a)
        first = int(self.source.first[block])
        return table.append_column(stream.ROW_COLUMN, pa.array(np.arange(first, first + b - a, dtype=np.int64)))

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None
