"""Parquet files (and a Delta table's files) as a Spark DataFrame, for ``predict``: driver side. The executors read
the rows as the ranks of a training run read them (:meth:`~optim.data.parquet.ParquetDataset.read_share`: the
same files, footers, column mapping, partition values and nulls for columns a file lacks), so the files need no
Spark reader of their own (no Delta connector on the cluster), and the DataFrame is the table as tfnet reads it.

The DataFrame is ``mapInArrow`` over a placeholder of ``n`` partitions (``spark.range(n, numPartitions=n)``: the
row of partition ``i`` is ``i``); partition ``i`` holds the ``i``-th of ``n`` contiguous shares of the rows, so the
rows keep the files' order. ``n`` is the session's default parallelism, at most one per row group. It works from a
classic session and from Spark Connect alike, and no Spark job starts until the DataFrame is computed.
"""

from __future__ import annotations

import functools

import pyarrow as pa

from optim.data.parquet_read import read_partition

__all__ = ["as_frame", "frame_partitions"]


def frame_partitions(spark, row_groups: int) -> int:
    """Partitions of the DataFrame: the session's default parallelism (a Connect client reads
    ``spark.default.parallelism``, else its ``local[N]`` master), at most ``row_groups``, at least 1."""
    from optim.spark.conf import setting
    from optim.spark.connect import is_connect
    from optim.spark.slots import connect_slots

    if is_connect(spark):
        default = setting(spark, "spark.default.parallelism", None)
        n = int(default) if default else connect_slots(spark) or 1
    else:
        n = int(spark.sparkContext.defaultParallelism)
    return max(1, min(n, int(row_groups)))


def as_frame(data, spark=None):
    """``data`` (a :class:`~optim.data.parquet.ParquetDataset` or a Delta table's) as a Spark DataFrame of every
    column of its files (partition columns included), in the schema's order, lazily.

    Args:
        data: The dataset; its files and columns were checked when it was made.
        spark: The SparkSession. Default: the active one, or a new one (:func:`optim.spark.session.get_spark`), as
            ``optimize`` takes it for the same dataset.

    Raises:
        DataError: a file lacks a column of the schema (a Delta table's files read such a column as nulls).
        TypeError: a column whose Arrow type Spark cannot hold (unsigned integers, for one), naming it.
    """
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    from optim.spark.session import get_spark

    spark = spark if spark is not None else get_spark()
    whole = data.every_column()
    schema = pa.schema(whole.schema)
    try:
        spark_schema = from_arrow_schema(schema)
    except TypeError:
        bad = [f"{f.name}: {f.type}" for f in schema if not _spark_holds(f)]
        raise TypeError(f"{data.road} at {data.path!r} has columns that a Spark DataFrame cannot hold: {bad}; "
                        f"its columns: {schema.names}. Rewrite them with types Spark has (signed integers for "
                        "unsigned ones).") from None
    target = to_arrow_schema(spark_schema)
    n = frame_partitions(spark, len(whole.groups))
    task = functools.partial(read_partition, data=whole, size=n, schema=target)
    return spark.range(n, numPartitions=n).mapInArrow(task, spark_schema)


def _spark_holds(field: pa.Field) -> bool:
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        from_arrow_schema(pa.schema([field]))
    except TypeError:
        return False
    return True
