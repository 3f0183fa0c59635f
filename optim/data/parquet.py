"""``TFDataset.from_parquet``: Parquet files read straight by each rank, with no Spark job for the data. Driver
side (the adapter); the ranks read their rows with :mod:`optim.data.parquet_read`. Pure pyarrow and fsspec
(no PySpark): a local path, or any URI fsspec knows (``s3://``, ``gs://``, ...).

The driver finds the files as pyarrow's dataset API and Spark do (names starting with ``_`` or ``.`` left
out; Hive-style folders such as ``.../bucket=3/part-0.parquet`` are columns like any other, ``bucket``
here), reads their footers once, and checks the columns against the net and the loss before any job, as
every road of data does (:mod:`optim.data.checks`). A file that cannot be read is named in the error.
The footers give the rows of every row group, so the rows of each rank, and so the steps per epoch, are
known before the stage starts. Rank ``r`` of ``n`` takes the rows ``[r * N // n, (r + 1) * N // n)`` of
the files in order (a row group that straddles two ranks is read by both, each keeping its part), and
streams them (:mod:`optim.data.stream`): its memory holds one row group (encoded) besides the batch, the
shuffle window and the prefetched batches. Write Parquet with row groups of a few thousand rows (Spark's
``parquet.block.size``) for a finer shuffle and a smaller memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from optim.carriers import Carrier, InPlan
from optim.data import stream
from optim.data.base import Staged
from optim.data.checks import spark_type
from optim.data.columns import ColumnDataset
from optim.data.parquet_read import BatchCheck, FileRows, ParquetSource, filesystem
from optim.errors import DataError
from optim.shares import Opened, RankData, RankEnv
from tfnet.errors import first_line

__all__ = ["FileColumn", "ParquetDataset", "list_parquet"]

#: The Parquet footer's key for a field's id (Delta's column mapping in mode ``id`` matches columns by it).
FIELD_ID_KEY = b"PARQUET:field_id"


class FileColumn(NamedTuple):
    """Where the files hold a column that the table's schema names otherwise (Delta's column mapping): the field
    named ``name``, or, where ``field_id`` is given, the field with that Parquet field id whatever its name."""

    name: str
    field_id: int | None = None


def _discover(path: str, storage_options):
    """``(files, partition values per file, schema)``: the Parquet files at ``path`` sorted, the Hive-style
    partition columns' values of each (``{column: value}``), and the schema of the rows with the partition
    columns last.

    Raises:
        DataError: nothing there, no Parquet file there, or a file whose schema cannot be read (named).
    """
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    fs, inner = filesystem(path, storage_options)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"No Parquet files at {path!r}: it does not exist.")
    single = info.type == pafs.FileType.File
    try:
        found = ds.dataset(inner, format="parquet", filesystem=fs, partitioning=None if single else "hive")
    except (pa.ArrowInvalid, OSError) as exc:  # the file it read the schema from: name it
        for name in [inner] if single else _candidates(fs, inner):
            read_footer(fs, name)
        raise DataError(f"The Parquet files at {path!r} cannot be read: {first_line(exc)}") from None
    fragments = sorted(found.get_fragments(), key=lambda f: f.path)
    if not fragments:
        raise DataError(f"No Parquet files at {path!r}: the folder holds none (names starting with _ or . are "
                        "left out).")
    values = [{} if single else dict(ds.get_partition_keys(f.partition_expression)) for f in fragments]
    return [f.path for f in fragments], values, found.schema


def _candidates(fs, folder: str) -> list[str]:
    """The files under ``folder`` pyarrow's discovery would take (names starting with ``_`` or ``.`` left out)."""
    import posixpath

    import pyarrow.fs as pafs

    out = []
    for entry in fs.get_file_info(pafs.FileSelector(folder, recursive=True)):
        parts = posixpath.relpath(entry.path, folder).split("/")
        if entry.type == pafs.FileType.File and not any(p.startswith(("_", ".")) for p in parts):
            out.append(entry.path)
    return sorted(out)


def read_footer(fs, name: str):
    """File ``name``'s Parquet metadata.

    Raises:
        DataError: the file cannot be read as Parquet (truncated, corrupt, not Parquet), naming it.
    """
    import pyarrow.parquet as pq

    try:
        with fs.open_input_file(name) as handle:
            return pq.ParquetFile(handle).metadata
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"Parquet file {name!r} cannot be read: {first_line(exc)} (a truncated or corrupt file, or "
                        "not Parquet).") from None


def list_parquet(path: str, storage_options=None) -> list[str]:
    """The Parquet files at ``path`` (a file, or a folder searched recursively), sorted; names starting
    with ``_`` or ``.`` (Spark's ``_SUCCESS``, checksums) are left out.

    Raises:
        DataError: no Parquet file is there.
    """
    return _discover(str(path), storage_options)[0]


class ParquetDataset(ColumnDataset):
    """``TFDataset.from_parquet(path, feature_cols, label_cols, feature_shapes, storage_options)``: see the
    module.

    Args:
        path: A Parquet file, or a folder of them (as Spark writes it, Hive-style partition folders
            included), a local path or a URI.
        feature_cols, label_cols, feature_shapes, batch_size, augment: As for
            :class:`~optim.data.dataframe.DataFrameDataset`.
        storage_options: fsspec options for a URI (endpoint, credentials); None for the library's
            defaults. The ranks get them with the job.
        shuffle_buffer: Rows of a shuffle window (the rank's blocks are shuffled, then the rows within
            windows of at least this many rows). Default 2048.
        prefetch: Decoded batches made ahead of the step (small batches in groups of about 4 MiB: that many
            groups). Default 2.

    Raises:
        DataError: no Parquet files at ``path``, or a file that cannot be read (named).
        ColumnError: a column that the files do not have.
    """

    road = "Parquet files"
    distributed = True
    holds_out = "ranks"

    def __init__(self, path: str, feature_cols, label_cols=None, feature_shapes=None, storage_options=None,
                 batch_size: int | None = None, augment=None, shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
                 prefetch: int = stream.DEFAULT_PREFETCH):
        files, values, schema = _discover(str(path), storage_options)
        self._set_files(str(path), files, values, schema, feature_cols, label_cols, feature_shapes,
                        storage_options=storage_options, batch_size=batch_size, augment=augment,
                        shuffle_buffer=shuffle_buffer, prefetch=prefetch)

    @classmethod
    def from_files(cls, path: str, files: list[str], partition_values: list[dict], schema: pa.Schema, feature_cols,
                   label_cols=None, feature_shapes=None, *, storage_options=None, batch_size: int | None = None,
                   augment=None, shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
                   prefetch: int = stream.DEFAULT_PREFETCH, stored: dict[str, FileColumn] | None = None,
                   absent_as_null: bool = False) -> ParquetDataset:
        """The seam for table formats (Delta; Iceberg, Hudi alike): the dataset over Parquet files that a table's
        own log chose, not found under ``path`` (which names the table in messages and gives the file system), checked
        as the module says.

        Args:
            path: The table, a local path or a URI; ``files`` are in its file system.
            files: The Parquet files, in the order the ranks share their rows.
            partition_values: Each file's partition columns' values (``{column: value}``).
            schema: The rows' schema, partition columns included (the table's).
            feature_cols, label_cols, feature_shapes, storage_options, batch_size, augment, shuffle_buffer, prefetch:
                As for :class:`ParquetDataset`.
            stored: Where the files hold the columns that they name otherwise (:class:`FileColumn`, Delta's column
                mapping). Default: under the schema's names.
            absent_as_null: A file without a column read gives nulls for it (a table's later columns) instead of an
                error. Default False.

        Raises:
            DataError: a file that cannot be read, or that lacks a column read (unless ``absent_as_null``).
            ColumnError: a column the schema does not have.
        """
        out = cls.__new__(cls)
        out._set_files(str(path), files, partition_values, schema, feature_cols, label_cols, feature_shapes,
                       storage_options=storage_options, batch_size=batch_size, augment=augment,
                       shuffle_buffer=shuffle_buffer, prefetch=prefetch, stored=stored, absent_as_null=absent_as_null)
        return out

    def _set_files(self, path: str, files: list[str], values: list[dict], schema: pa.Schema, feature_cols, label_cols,
                   feature_shapes, *, storage_options, batch_size, augment, shuffle_buffer, prefetch,
                   stored: dict[str, FileColumn] | None = None, absent_as_null: bool = False) -> None:
        """Sets up the dataset (:meth:`from_files`, whose arguments these are)."""
        self.path, self.storage_options, self.schema = path, storage_options, schema
        self.batch_size, self.augment = batch_size, augment
        self.shuffle_buffer, self.prefetch = int(shuffle_buffer), int(prefetch)
        self.set_columns(feature_cols, label_cols, feature_shapes)
        self.files, self.partition_values = list(files), list(values)
        self.require_columns(list(schema.names))
        self.types = {f.name: spark_type(f.type) for f in schema}
        self.partition_types = {name: schema.field(name).type for name in {k for v in self.partition_values for k in v}}
        self.groups: list[tuple[int, int, int]] = []  # (file, row group, rows)
        self.file_types = {c: schema.field(c).type for c in self.columns() if c not in self.partition_types}
        self.stored, self.absent_as_null = dict(stored or {}), bool(absent_as_null)
        footers = [self._footer(f, name, self.file_types) for f, name in enumerate(self.files)]
        self.file_rows = [rows for rows, _ in footers]
        #: per file, the columns read that it names otherwise: column -> its name in the file, None where it has none
        self.file_names = [names for _, names in footers]
        self.check = None

    def _footer(self, index: int, name: str, wanted: dict) -> tuple[int, dict[str, str | None]]:
        """Reads file ``index``'s footer: its row groups go into :attr:`groups`; returns its rows and the columns
        read that it names otherwise (column -> its name in the file, or None: it has none, read as nulls).

        Raises:
            DataError: the file cannot be read, or lacks a column read (``wanted``: column -> type; unless
                :attr:`absent_as_null`) or holds it with another type than the files' schema (a schema mismatch: no
                retry mends it), naming the file.
        """
        fs, _ = filesystem(self.path, self.storage_options)
        meta = read_footer(fs, name)
        own = meta.schema.to_arrow_schema()
        names = {}
        for column, kind in wanted.items():
            held = _find(own, self.stored.get(column, FileColumn(column)))
            if held is None and self.absent_as_null:
                names[column] = None
                continue
            if held is None:
                raise DataError(f"Parquet file {name!r} has no column {column!r} (its columns: {own.names}); every "
                                "file must hold the columns read.")
            if not own.field(held).type.equals(kind):
                raise DataError(f"Parquet file {name!r} holds column {column!r} as {spark_type(own.field(held).type)}, "
                                f"where the files' schema has {spark_type(kind)}: the files do not share one schema.")
            if held != column:
                names[column] = held
        self.groups.extend((index, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
        return int(meta.num_rows), names

    @property
    def num_rows(self) -> int:
        return int(sum(rows for _, _, rows in self.groups))

    def column_types(self) -> dict[str, str]:
        return dict(self.types)

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

    def with_checks(self, check) -> ParquetDataset:
        """A copy whose batches go through ``check`` (:class:`optim.data.values.PartitionChecks`) as they are
        decoded, each row named by its file and its row in the file: the rows are not read before training,
        so each batch is checked on its way."""
        import copy

        out = copy.copy(self)
        out.check = check
        return out

    def locate(self) -> FileRows:
        """How errors name a row of these files (its file and its row in it)."""
        return FileRows(self.files, np.concatenate([[0], np.cumsum(self.file_rows)]).astype(np.int64))

    def _source(self, rank: int, size: int) -> ParquetSource:
        file_columns = [c for c in self.columns() if c not in self.partition_types]
        return ParquetSource(self.path, self.storage_options, self.files, self.pieces(rank, size), file_columns,
                             self.partition_values, self.partition_types, self.locate().starts, self.file_names,
                             self.file_types)

    def shard(self, rank: int, size: int, source=None, checked: bool = True) -> stream.StreamedDataset:
        """Rank ``rank``'s rows as a stream (``source``: those rows, filtered; default: all of them)."""
        decoder = stream.Decoder(self.features, self.labels, self.single_label, rank, self.weight, self.locate())
        on_batch = BatchCheck(self.check, self.locate()) if self.check is not None and checked else None
        return stream.StreamedDataset(source or self._source(rank, size), decoder, self.augment if checked else None,
                                      self.shuffle_buffer, self.prefetch, on_batch)

    def held_out_shards(self, rank: int, size: int, holdout) -> tuple[stream.StreamedDataset, stream.StreamedDataset]:
        """Rank ``rank``'s rows split by ``holdout`` (``validation_split``): ``(training, validation)`` streams. The
        rows are read once first, to know which are held out (the hash is of their values)."""
        source = self._source(rank, size)
        reader = source.open()
        try:
            held = [holdout.mask_arrow(reader.read(b), self.data_columns()) for b in range(len(source.block_rows))]
        finally:
            reader.close()
        train = self.shard(rank, size, stream.FilteredSource(source, [~h for h in held]))
        val = self.shard(rank, size, stream.FilteredSource(source, held), checked=False)
        return train, val

    def batches(self, batch_size, *, epoch=0, seed=0, shuffle=True, skip=0, rank=0, size=1,
                drop_remainder=False, steps=None, training=False):
        return self.shard(rank, size).batches(batch_size, epoch=epoch, seed=seed, shuffle=shuffle, skip=skip, rank=rank,
                                              size=size, drop_remainder=drop_remainder, steps=steps, training=training)

    def every_column(self) -> ParquetDataset:
        """The same files read whole: every column of :attr:`schema` (partition columns included) as a feature
        column, each file's footer checked for them as for any column read (what ``predict`` keeps beside its
        outputs)."""
        return ParquetDataset.from_files(self.path, self.files, self.partition_values, self.schema,
                                         list(self.schema.names), storage_options=self.storage_options,
                                         stored=self.stored, absent_as_null=self.absent_as_null)

    def read_share(self, rank: int, size: int) -> Iterator[pa.Table]:
        """Rank side: rank ``rank`` of ``size``'s rows (:meth:`pieces`), one part of a row group at a time, in the
        files' order, as Arrow tables of :meth:`columns` (no row numbers)."""
        source = self._source(rank, size)
        reader = source.open()
        try:
            for block in range(len(source.block_rows)):
                yield reader.read(block).select(self.columns())
        finally:
            reader.close()

    # ------------------------------------------------------------ over Spark

    def predict_with(self, predictor, batch_size: int, output_cols=None):
        """The files' rows as a Spark DataFrame (:func:`optim.data.parquet_frame.as_frame`: every column of the
        files, read by the executors as the ranks read them) with the outputs added, lazily, rows in the files'
        order; one column per input (stacked scalar columns are refused)."""
        from optim.data.parquet_frame import as_frame

        return predictor.predict(as_frame(self), feature_cols=self.predict_columns(), output_cols=output_cols)

    def stage(self, host, n, per_rank, *, cleanup, validation=None, timeout_s=600.0) -> Staged:
        """Each rank reads its share of the files itself: the stage runs over a placeholder."""
        shipped = None if validation is None else validation.for_ranks(host, cleanup)
        return Staged(ParquetRankData(self, shipped), frame=host.placeholder(n))

    def for_ranks(self, host, cleanup) -> Carrier:
        return InPlan(self)

    def evaluation(self, host, partitions) -> Staged:
        n = host.partitions(partitions)
        return Staged(ParquetRankData(self), frame=host.placeholder(n), size=n)


def _find(schema: pa.Schema, where: FileColumn) -> str | None:
    """The name of the field of ``schema`` (a file's) that holds column ``where``, or None."""
    if where.field_id is None:
        return where.name if where.name in schema.names else None
    for field in schema:
        if (field.metadata or {}).get(FIELD_ID_KEY) == str(where.field_id).encode():
            return field.name
    return None


class ParquetRankData(RankData):
    """A rank's share of the files, checked batch by batch as it is read (rows named by file and row)."""

    def __init__(self, data: ParquetDataset, validation: Carrier | None = None):
        self.data, self.validation = data, validation

    def open(self, rows, rank: int, size: int, env: RankEnv) -> Opened:
        for _ in rows:  # the placeholder partition carries nothing
            pass
        data = self.data.with_checks(env.checks(f"rank {rank}'s rows"))
        if data.holdout is not None and self.validation is None:
            train, val = data.held_out_shards(rank, size, data.holdout)
            return Opened(train, val)
        return Opened(data, self.open_validation())

    def evaluate(self, rows, partition: int, size: int):
        for _ in rows:
            pass
        return self.data, partition, size
