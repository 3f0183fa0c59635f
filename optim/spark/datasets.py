"""Distributed training data: a Spark DataFrame or RDD, one shard per rank. Driver side.

Each object describes how a rank turns its partition into arrays (:mod:`optim.training.shard` does
it in the worker, through the one Arrow reader :mod:`optim.arrow`). Rows are balanced across ranks
before training when partitions are uneven or empty (see
:func:`optim.spark.driver.backends.classic.balance_dataframe`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from optim.errors import ColumnError
from optim.spark.parquet import ParquetDataset
from optim.spark.vectors import vectors_as_arrays
from optim.training import stream
from optim.training.columns import ColumnDataset
from optim.training.datasets import ArrayDataset, TFDataset
from optim.training.shard import TensorColumns, arrow_to_arrays, records_to_arrays, row_weights

__all__ = ["DataFrameDataset", "ParquetDataset", "RDDDataset", "SPLIT_COLUMN", "with_validation"]


def _through(spec: TensorColumns, mapping: dict[str, str]) -> TensorColumns:
    import dataclasses

    return dataclasses.replace(spec, columns=tuple(mapping.get(c, c) for c in spec.columns))


def _warm_up(spark) -> None:
    """The workers start importing TensorFlow now, while the driver prepares the rest (once per
    Spark application or Connect session; :func:`~optim.spark.driver.warm_up.ensure_warm_up`)."""
    from optim.spark.driver.warm_up import ensure_warm_up

    ensure_warm_up(spark)


class DataFrameDataset(ColumnDataset):
    """``TFDataset.from_dataframe(df, feature_cols, label_cols, feature_shapes)``.

    Args:
        df: A Spark DataFrame.
        feature_cols: One entry per model input, in input order: a column name (numbers, or arrays
            of numbers reshaped to ``feature_shapes[col]`` per row), or a list of scalar columns
            stacked into one vector.
        label_cols: The label column (or a list, for several labels). None for prediction.
        feature_shapes: ``{column: per-row shape}`` for array columns, or a list of shapes in the
            order of ``feature_cols``. Default: 1-D, as stored.
        batch_size: The global batch ``optimize`` uses by default. Default: none (32).
        augment: ``fn(features, rng) -> features`` applied on the ranks to training batches only,
            e.g. :class:`optim.training.augment.RandomCropFlip`. Default: none.
        weight_col: A column of sample weights, one finite, non-negative number per row (Spark
            ML's ``weightCol``): the loss and the ``weighted_metrics`` weight each row by it, as
            ``optimize(..., sample_weight=w)`` does for numpy data. Default: none (every row counts
            alike).
        streaming: Each rank keeps its partition on its local disk, still encoded, and decodes it a
            batch at a time while the steps run (:mod:`optim.training.stream`): a rank's memory does not
            grow with its rows. False: each rank decodes its whole partition into memory before the
            first step (the path before streaming; faster to start only when the partition is small).
            Default True.
        shuffle_buffer: With ``streaming``, rows of a shuffle window: the stored blocks are shuffled,
            then the rows within windows of this many rows (a partition of at most this many rows is
            shuffled in full). Default 2048.
        prefetch: With ``streaming``, decoded batches made ahead of the step. Default 2.
        local_dir: With ``streaming``, the folder on each executor for the local copies. Default: Spark's
            local dir (``spark.local.dir``, ``SPARK_LOCAL_DIRS``).
    """

    distributed = True

    def __init__(self, df, feature_cols, label_cols=None, feature_shapes=None, batch_size: int | None = None,
                 augment=None, weight_col: str | None = None, streaming: bool = True, shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
                 prefetch: int = stream.DEFAULT_PREFETCH, local_dir: str | None = None):
        self.batch_size = batch_size
        self.local_dir = local_dir
        self.augment = augment
        self.streaming = bool(streaming)
        self.shuffle_buffer, self.prefetch = _positive("shuffle_buffer", shuffle_buffer), _positive("prefetch", prefetch)
        self.block_rows = stream.DEFAULT_BLOCK_ROWS
        self._set_columns(feature_cols, label_cols, feature_shapes)
        self._set_weight(weight_col, label_cols)
        # Spark ML Vector columns are read through a hidden array column (vector_to_array)
        self.df, self.vectors = vectors_as_arrays(df, [c for s in self.features + self.labels for c in s.columns])
        if self.vectors:
            self.features = [_through(s, self.vectors) for s in self.features]
            self.labels = [_through(s, self.vectors) for s in self.labels]
        self._check_present(list(self.df.columns), "the DataFrame")
        _warm_up(getattr(df, "sparkSession", None))

    @property
    def arrow_batch_rows(self) -> int | None:
        """Rows of the Arrow batches Spark sends a rank while it reads its partition
        (:func:`optim.spark.session.small_arrow_batches`): one block's, when streaming."""
        return self.block_rows if self.streaming else None

    def label_kinds(self) -> list[tuple[str, str]]:
        """``(column, Spark type)`` of each label, for checks against the loss on the driver."""
        types = {f.name: f.dataType for f in self.df.schema.fields}
        return [(self._shown(s.name), types[s.columns[0]].simpleString() if len(s.columns) == 1 else "stacked")
                for s in self.labels]

    def column_kinds(self) -> dict[str, str]:
        from pyspark.sql.types import ArrayType, BinaryType

        kinds = {}
        for f in self.df.schema.fields:
            kind = f.dataType
            flat = isinstance(kind, ArrayType) and not isinstance(kind.elementType, ArrayType)
            kinds[f.name] = "flat" if flat else "image" if isinstance(kind, BinaryType) else "other"
        return kinds

    def shard_reader(self):
        """A picklable reader of a partition for the workers: with ``streaming``, one that keeps it on local
        disk (training) or reads it once (evaluation); else ``(arrow_batches, partition) -> ArrayDataset``."""
        if self.streaming:
            return _StreamShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment,
                                self.shuffle_buffer, self.prefetch, self.block_rows, self.local_dir, self.weight)
        return _ArrowShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment, self.weight)

    def to_local(self) -> ArrayDataset:
        """Collects the whole DataFrame to the driver (for validation data)."""
        table = self.df.select(*self.columns()).toArrow()
        reader = _ArrowShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment, self.weight)
        return reader(table.to_batches(), 0, presharded=False)

    def num_batches(self, batch_size, **kw):
        return None


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


class _ArrowShard:
    def __init__(self, features, labels, single_label, augment=None, weight: TensorColumns | None = None):
        self.features, self.labels, self.single_label, self.augment = features, labels, single_label, augment
        self.weight = weight

    def __call__(self, batches, partition: int, presharded: bool = True) -> ArrayDataset:
        batches = list(batches)
        weights = [] if self.weight is None else [self.weight]
        arrays = arrow_to_arrays(batches, list(self.features) + list(self.labels) + weights, partition)
        n_feats, n_labels = len(self.features), len(self.labels)
        feats, labels = arrays[:n_feats], arrays[n_feats:n_feats + n_labels]
        w = None
        if weights:
            w = row_weights(arrays[-1], self.weight.columns[0], partition)
        return ArrayDataset(feats, labels or None, self.single_label, presharded=presharded, augment=self.augment,
                            weights=w)


#: The column that marks validation rows in a stage that carries both (see :func:`with_validation`).
SPLIT_COLUMN = "__tfnet_validation"


def with_validation(train: DataFrameDataset, validation: DataFrameDataset, n: int):
    """One DataFrame of the training and the validation rows, marked by :data:`SPLIT_COLUMN` and
    spread round robin over ``n`` partitions, and the reader that splits a partition back into
    ``(training shard, validation shard)``: validation then runs on the ranks, each on its own
    rows, with no row collected to the driver. The validation columns pair with the training
    columns in order (their names may differ). Each side keeps its own sample weights
    (``weight_col``), or none.

    Raises:
        ColumnError: the validation data has another number of feature or label columns.
    """
    from pyspark.sql import functions as F

    t_cols, v_cols = train.data_columns(), validation.data_columns()
    if len(train.features) != len(validation.features) or len(train.labels) != len(validation.labels) or \
            len(t_cols) != len(v_cols):
        raise ColumnError(f"The validation DataFrame's columns {v_cols} do not pair with the training columns {t_cols} "
                          "(the same number of feature and label columns, in the same order).")
    # the union's weight column: the training one's name, filled with 1.0 on the side that has none
    weight = None
    if train.weight is not None or validation.weight is not None:
        weight = train.weight.columns[0] if train.weight is not None else WEIGHT_COLUMN

    def weights_of(data: DataFrameDataset) -> list:
        if weight is None:
            return []
        value = F.col(data.weight.columns[0]) if data.weight is not None else F.lit(1.0)
        return [value.cast("double").alias(weight)]

    t_df = train.df.select(*t_cols, *weights_of(train), F.lit(False).alias(SPLIT_COLUMN))
    v_df = validation.df.select(*[F.col(v).alias(t) for v, t in zip(v_cols, t_cols)], *weights_of(validation),
                                F.lit(True).alias(SPLIT_COLUMN))
    val_weight = TensorColumns((weight,), None) if validation.weight is not None else None
    reader = train.shard_reader()
    if isinstance(reader, _StreamShard):
        split = _SplitStreamShard(reader, val_weight)
    else:
        split = _SplitShard(reader, _ArrowShard(tuple(train.features), tuple(train.labels), train.single_label,
                                                weight=val_weight))
    return t_df.unionByName(v_df).repartition(n), split


#: The union's weight column when only the validation data has sample weights.
WEIGHT_COLUMN = "__tfnet_weight"


class _SplitShard:
    """``(batches, partition) -> (training ArrayDataset, validation ArrayDataset or None)``, split by
    :data:`SPLIT_COLUMN`; only the training shard is augmented."""

    def __init__(self, reader: _ArrowShard, val_reader: _ArrowShard):
        self.reader, self.val_reader = reader, val_reader

    def __call__(self, batches, partition: int, presharded: bool = True):
        import pyarrow.compute as pc

        train, val = [], []
        for batch in batches:
            mask = batch.column(batch.schema.get_field_index(SPLIT_COLUMN))
            train.append(batch.filter(pc.invert(mask)))
            val.append(batch.filter(mask))
        shard = self.reader(train, partition, presharded)
        if not sum(b.num_rows for b in val):  # no validation rows here: an empty shard (the others' sums still meet)
            labels = None if shard.labels is None else [a[:0] for a in shard.labels]
            weights = None if self.val_reader.weight is None else np.zeros(0, np.float32)
            return shard, ArrayDataset([a[:0] for a in shard.features], labels, shard.single_label, presharded=True,
                                       weights=weights)
        return shard, self.val_reader(val, partition, presharded)


class _StreamShard:
    """A partition streamed (``streaming=True``): for training, read once into a local copy on the rank's
    disk (:meth:`spool`, :mod:`optim.spark.worker.spool`) and streamed from it every epoch; for
    evaluation, read once batch by batch (:meth:`__call__`)."""

    def __init__(self, features, labels, single_label, augment, shuffle_buffer, prefetch, block_rows, local_dir=None,
                 weight: TensorColumns | None = None):
        self.features, self.labels, self.single_label, self.augment = features, labels, single_label, augment
        self.shuffle_buffer, self.prefetch, self.block_rows = shuffle_buffer, prefetch, block_rows
        self.local_dir, self.weight = local_dir, weight

    def __call__(self, batches, partition: int, presharded: bool = True) -> stream.ArrowStream:
        return stream.ArrowStream(batches, self.decoder(partition))

    def decoder(self, partition: int, weight: TensorColumns | None | bool = True) -> stream.Decoder:
        """The decoder of this reader's columns; ``weight``: True for this reader's weight column, else the
        weight column to read (None: none)."""
        return stream.Decoder(self.features, self.labels, self.single_label, partition,
                              self.weight if weight is True else weight)

    def dataset(self, source, partition: int, augment=True, weight: TensorColumns | None | bool = True
                ) -> stream.StreamedDataset:
        return stream.StreamedDataset(source, self.decoder(partition, weight), self.augment if augment else None,
                                      self.shuffle_buffer, self.prefetch)

    def spool(self, batches, partition: int, folder: str, name: str, check=None) -> stream.StreamedDataset:
        """Reads ``batches`` (the partition) into ``folder``, checking each part with ``check``
        (:class:`optim.training.checks.PartitionChecks`); returns the rank's training data."""
        from optim.spark.worker.spool import spool

        rows = _Checked(self, partition, check)
        files = spool(stream.numbered(batches), folder, {"train": name}, lambda b: {"train": rows(b)},
                      self.block_rows)
        rows.finish()
        return self.dataset(files["train"], partition)


class _Checked:
    """Each numbered part of a partition, checked as it is stored: the rows of number columns read (a bad
    row raises BadRowError, as in memory), image columns checked for nulls (an image that does not
    decode raises when its batch is decoded), and ``check`` run on what was read; rows it leaves out are
    dropped."""

    def __init__(self, reader: _StreamShard, partition: int, check=None):
        self.reader, self.partition, self.check = reader, partition, check
        self.seen = 0

    def __call__(self, batch):
        from optim.arrow import NULL, ColumnRead, is_image_shape, read_column

        first = self.seen
        self.seen += batch.num_rows
        specs = list(self.reader.features) + list(self.reader.labels)
        arrays = []
        for spec in specs:
            parts = []
            for c in spec.columns:
                col = batch.column(batch.schema.get_field_index(c))
                binary = pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)
                if len(spec.columns) == 1 and binary and is_image_shape(spec.shape):
                    if col.null_count:
                        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                        raise NULL.error(c, first + row, self.partition)
                    parts = None
                    break
                parts.append(read_column(col, ColumnRead(shape=spec.shape if len(spec.columns) == 1 else None),
                                         on_bad="raise", column=c, partition=self.partition,
                                         row_offset=first).values)
            arrays.append(None if parts is None else parts[0] if len(parts) == 1 else np.stack(parts, axis=1))
        weight = self.reader.weight
        if weight is not None:
            col = batch.column(batch.schema.get_field_index(weight.columns[0]))
            values = read_column(col, ColumnRead(), on_bad="raise", column=weight.columns[0], partition=self.partition,
                                 row_offset=first).values
            row_weights(values, weight.columns[0], self.partition, first)
        if self.check is None:
            return batch
        features, labels = arrays[:len(self.reader.features)], arrays[len(self.reader.features):]
        labels = None if not labels else labels[0] if self.reader.single_label else labels
        keep = self.check(features, labels, first)
        return batch if keep is None else batch.filter(pa.array(keep))

    def finish(self) -> None:
        if self.check is not None:
            self.check.finish()


class _SplitStreamShard:
    """:class:`_SplitShard` streamed: one read of the partition into two local copies, the training rows
    (checked) and the validation rows."""

    def __init__(self, reader: _StreamShard, val_weight: TensorColumns | None = None):
        self.reader, self.val_weight = reader, val_weight
        self.local_dir = reader.local_dir

    def spool(self, batches, partition: int, folder: str, name: str, check=None):
        import pyarrow.compute as pc

        from optim.spark.worker.spool import spool

        rows = _Checked(self.reader, partition, check)
        counts = {"train": 0, "val": 0}

        def route(batch):
            mask = batch.column(batch.schema.get_field_index(SPLIT_COLUMN))
            batch = batch.select([i for i, n in enumerate(batch.schema.names) if n != SPLIT_COLUMN])
            out = {}
            for key, part in (("train", batch.filter(pc.invert(mask))), ("val", batch.filter(mask))):
                if part.num_rows:
                    (part,) = stream.numbered([part], counts[key])
                    counts[key] += part.num_rows
                    out[key] = rows(part) if key == "train" else part
            return out

        files = spool(batches, folder, {"train": name, "val": name + "-val"}, route, self.reader.block_rows)
        rows.finish()
        return self.reader.dataset(files["train"], partition), self.reader.dataset(files["val"], partition, False, self.val_weight)


class RDDDataset(TFDataset):
    """``TFDataset.from_rdd(rdd)``: an RDD of ``(features, label)`` records, ``features`` an array
    (or a tuple of arrays, one per model input)."""

    distributed = True

    def __init__(self, rdd, batch_size: int | None = None):
        self.rdd = rdd
        self.batch_size = batch_size
        self.has_labels = True
        _warm_up(getattr(rdd, "context", None))

    def shard_reader(self):
        return _RecordShard()

    def to_local(self) -> ArrayDataset:
        """Collects the records to the driver (validation data of a distributed run)."""
        return _RecordShard()(self.rdd.collect(), 0, presharded=False)

    def num_batches(self, batch_size, **kw):
        return None


class _RecordShard:
    def __call__(self, records, partition: int, presharded: bool = True) -> ArrayDataset:
        feats, labels = records_to_arrays(records, partition)
        if not feats:
            return _empty()
        return ArrayDataset(feats, [labels], True, presharded=presharded)


def _empty() -> ArrayDataset:
    return ArrayDataset([np.zeros((0,), np.float32)], [np.zeros((0,), np.float32)], True, presharded=True)
