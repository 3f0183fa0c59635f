"""``TFDataset.from_dataframe``: a Spark DataFrame, one partition per rank. Driver side.

The adapter checks the columns against the net and the loss from the DataFrame's schema before any job
(:mod:`optim.data.checks`), stages the DataFrame for ``n`` ranks (balanced as the session can:
:class:`~optim.data.base.StageHost`), and ships the reader that turns a rank's partition into its data
(:mod:`optim.data.partition`, rank side). When the validation data is a DataFrame too, one stage carries
both (:func:`with_validation`), and each rank validates on its own rows.
"""

from __future__ import annotations

import numpy as np

from optim.carriers import Carrier
from optim.data import stream
from optim.data.arrays import ArrayDataset
from optim.data.base import Staged
from optim.data.columns import ColumnDataset
from optim.data.decode import TensorColumns
from optim.data.partition import (
    SPLIT_COLUMN,
    ArrowShard,
    FrameRankData,
    SplitShard,
    SplitStreamShard,
    StreamShard,
)
from optim.data.vectors import vectors_as_arrays
from optim.errors import ColumnError

__all__ = ["DataFrameDataset", "SPLIT_COLUMN", "WEIGHT_COLUMN", "with_validation"]


def _through(spec: TensorColumns, mapping: dict[str, str]) -> TensorColumns:
    import dataclasses

    return dataclasses.replace(spec, columns=tuple(mapping.get(c, c) for c in spec.columns))


class DataFrameDataset(ColumnDataset):
    """``TFDataset.from_dataframe(df, feature_cols, label_cols, feature_shapes)``.

    Args:
        df: A Spark DataFrame.
        feature_cols: One entry per model input, in input order: a column name (numbers, or arrays
            of numbers reshaped to ``feature_shapes[col]`` per row), or a list of scalar columns
            stacked into one vector.
        label_cols: The label column (or a list in output order, for several outputs, or a dict by output name,
            as Keras's ``fit`` takes labels). None for prediction.
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
            batch at a time while the steps run (:mod:`optim.data.stream`): a rank's memory does not
            grow with its rows. False: each rank decodes its whole partition into memory before the
            first step (the path before streaming; faster to start only when the partition is small).
            Default True.
        shuffle_buffer: With ``streaming``, rows of a shuffle window: the stored blocks are shuffled,
            then the rows within windows of this many rows (a partition of at most this many rows is
            shuffled in full). Default 2048.
        prefetch: With ``streaming``, decoded batches made ahead of the step (small batches in groups of
            about 4 MiB: that many groups). Default 2.
        local_dir: With ``streaming``, the folder on each executor for the local copies. Default: Spark's
            local dir (``spark.local.dir``, ``SPARK_LOCAL_DIRS``).
        decode_once: With ``streaming``, encoded images are decoded once, as the partition is stored, and the
            local copy holds their pixels (uint8, 12 KiB a 64x64x3 row, where every image is at its
            ``feature_shapes`` size; float32, 48 KiB, once one had to be resized; the batches come in that dtype,
            and the step casts uint8 inside its graph), so no epoch decodes them again; False keeps them encoded
            on disk (smaller) and decodes each batch every epoch. Default True.
    """

    road = "a DataFrame"
    distributed = True
    holds_out = "ranks"

    def __init__(self, df, feature_cols, label_cols=None, feature_shapes=None, batch_size: int | None = None,
                 augment=None, weight_col: str | None = None, streaming: bool = True, shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
                 prefetch: int = stream.DEFAULT_PREFETCH, local_dir: str | None = None, decode_once: bool = True):
        self.batch_size = batch_size
        self.local_dir = local_dir
        self.decode_once = bool(decode_once)
        self.augment = augment
        self.streaming = bool(streaming)
        self.shuffle_buffer, self.prefetch = _positive("shuffle_buffer", shuffle_buffer), _positive("prefetch", prefetch)
        self.block_rows = stream.DEFAULT_BLOCK_ROWS
        self.set_columns(feature_cols, label_cols, feature_shapes)
        self.set_weight(weight_col, label_cols)
        self.require_columns(list(df.columns))
        self.types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        # Spark ML Vector columns are read through a hidden array column (vector_to_array)
        self.df, self.vectors = vectors_as_arrays(df, [c for s in self.features + self.labels for c in s.columns])
        if self.vectors:
            self.features = [_through(s, self.vectors) for s in self.features]
            self.labels = [_through(s, self.vectors) for s in self.labels]

    @property
    def arrow_batch_rows(self) -> int | None:
        """Rows of the Arrow batches Spark sends a rank while it reads its partition
        (:func:`optim.spark.session.small_arrow_batches`): one block's, when streaming."""
        return self.block_rows if self.streaming else None

    def session(self):
        return self.df.sparkSession

    def column_types(self) -> dict[str, str]:
        return dict(self.types)

    def shard_reader(self):
        """A picklable reader of a partition for the ranks: with ``streaming``, one that keeps it on local
        disk (training) or reads it once (evaluation); else ``(arrow_batches, partition) -> ArrayDataset``."""
        if self.streaming:
            return StreamShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment,
                               self.shuffle_buffer, self.prefetch, self.block_rows, self.local_dir, self.weight,
                               decode_images=self.decode_once)
        return ArrowShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment, self.weight)

    def held_out_reader(self):
        """A reader that splits a partition into ``(training, validation)`` by the hold-out's hash."""
        rule = (self.holdout, self.data_columns())
        reader = self.shard_reader()
        if isinstance(reader, StreamShard):
            return SplitStreamShard(reader, self.weight, holdout=rule)
        return SplitShard(reader, ArrowShard(tuple(self.features), tuple(self.labels), self.single_label,
                                             weight=self.weight), holdout=rule)

    def to_local(self) -> ArrayDataset:
        """Collects the whole DataFrame to the driver (for validation data)."""
        table = self.df.select(*self.columns()).toArrow()
        reader = ArrowShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment, self.weight)
        return reader(table.to_batches(), 0, presharded=False)

    def num_batches(self, batch_size, **kw):
        return None

    # ------------------------------------------------------------ over Spark

    def stage(self, host, n, per_rank, *, cleanup, validation=None, timeout_s=600.0) -> Staged:
        """The DataFrame with ``n`` partitions: balanced by the session (``host.balance``), or, with a
        DataFrame of validation data, both in one (:func:`with_validation`); with a hold-out
        (``validation_split``), each rank splits its partition as it reads it."""
        if isinstance(validation, DataFrameDataset):
            frame, reader = with_validation(self, validation, n)
            return Staged(FrameRankData(reader), frame=frame)
        frame = host.balance(self.df.select(*self.columns()), n, per_rank, timeout_s)
        if self.holdout is not None and validation is None:
            return Staged(FrameRankData(self.held_out_reader()), frame=frame)
        shipped = None if validation is None else validation.for_ranks(host, cleanup)
        return Staged(FrameRankData(self.shard_reader(), shipped), frame=frame)

    def stage_resumed(self, host, n, per_rank, shards, *, cleanup, validation=None, timeout_s=600.0) -> Staged | None:
        """The DataFrame staged as ``shards`` ranks had it (:meth:`stage`), each row marked with its partition there
        (:data:`~optim.data.virtual_shards.SHARD_COLUMN`), then moved to ``n`` partitions: partition ``k`` the shards
        that rank ``k`` takes (:func:`~optim.data.virtual_shards.held_shards`), each shard's rows in their order.
        With no validation rows in the frame (a validation DataFrame, ``validation_split``); else None."""
        from pyspark.sql import functions as F

        from optim.data.shards import SHARD_COLUMN, held_shards, partition_keys
        from optim.data.virtual_shards import ShardedArrowShard, ShardedStreamShard

        if self.holdout is not None or isinstance(validation, DataFrameDataset) or shards % n or shards <= n:
            return None
        frame = host.balance(self.df.select(*self.columns()), shards, per_rank * n // shards, timeout_s)
        frame = frame.withColumn(SHARD_COLUMN, F.spark_partition_id())
        keys = partition_keys(n)
        key = F.lit(keys[0])
        for k in range(1, n):
            key = F.when(F.col(SHARD_COLUMN).isin(held_shards(shards, k, n)), F.lit(keys[k])).otherwise(key)
        frame = frame.repartition(n, key)
        shipped = None if validation is None else validation.for_ranks(host, cleanup)
        reader = self.shard_reader()
        sharded = ShardedStreamShard(reader, shards, n) if self.streaming else ShardedArrowShard(reader, shards)
        return Staged(FrameRankData(sharded, shipped), frame=frame)

    def for_ranks(self, host, cleanup) -> Carrier:
        return self.to_local().for_ranks(host, cleanup)

    def evaluation(self, host, partitions) -> Staged:
        return Staged(FrameRankData(self.shard_reader()), frame=self.df.select(*self.columns()))

    def predict_with(self, predictor, batch_size: int, output_cols=None):
        """The DataFrame with the outputs added, lazily (one column per input: stacked scalar columns are
        refused)."""
        out = predictor.predict(self.df, feature_cols=self.predict_columns(), output_cols=output_cols)
        return out.drop(*self.vectors.values()) if self.vectors else out


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


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
    if isinstance(reader, StreamShard):
        split = SplitStreamShard(reader, val_weight)
    else:
        split = SplitShard(reader, ArrowShard(tuple(train.features), tuple(train.labels), train.single_label,
                                              weight=val_weight))
    return t_df.unionByName(v_df).repartition(n), split


#: The union's weight column when only the validation data has sample weights.
WEIGHT_COLUMN = "__tfnet_weight"
