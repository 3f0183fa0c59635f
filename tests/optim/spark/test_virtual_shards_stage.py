"""A DataFrame staged for an epoch resumed on fewer ranks (DataFrameDataset.stage_resumed) on a real local Spark: each
new partition holds the shards its rank takes, and each shard's rows are the rows, in the order, that the partition of
that number held when the epoch began (the staging for the ranks that began it), through Spark's shuffle; whether the
DataFrame was staged as it came or rebalanced round robin, its rows as they came or in an order of their values (an
elastic run's staging)."""

import numpy as np
import pyarrow as pa
import pytest

from optim import TFDataset
from optim.data.shards import SHARD_COLUMN, held_shards
from optim.data.virtual_shards import ShardedArrowShard, ShardedStreamShard
from optim.launch.backends.classic import ClassicBackend
from optim.launch.stage import Cleanup

pytestmark = [pytest.mark.spark]


def _partitions(frame) -> dict[int, pa.Table]:
    """Each partition's rows, in order."""
    from pyspark.sql import functions as F

    table = frame.withColumn("__p", F.spark_partition_id()).toArrow()
    p = table.column("__p").to_numpy()
    return {int(k): table.filter(pa.array(p == k)).drop_columns(["__p"]) for k in np.unique(p)}


@pytest.mark.parametrize("source_partitions", [4, 3])  # staged as it is; rebalanced (round robin)
@pytest.mark.parametrize("goes_on, streaming, in_order", [(2, True, True), (1, False, False), (1, True, True)])
def test_each_rank_holds_its_shards_rows_in_the_order_their_ranks_had_them(spark, source_partitions, goes_on,
                                                                            streaming, in_order):
    from pyspark.sql import functions as F

    df = spark.range(0, 96, numPartitions=source_partitions).select(
        F.array(F.col("id").cast("float"), (F.col("id") * 2).cast("float"), F.rand(1).cast("float")).alias("x"),
        (F.col("id") % 7).alias("y"))
    data = TFDataset.from_dataframe(df, "x", "y", feature_shapes={"x": (3,)}, streaming=streaming)
    host, cleanup = ClassicBackend(spark), Cleanup()
    host.canonical_order = in_order  # an elastic run's staging: each partition's rows in an order of their values
    began = _partitions(data.stage(host, 4, 8, cleanup=cleanup).frame)
    assert sorted(began) == [0, 1, 2, 3]
    staged = data.stage_resumed(host, goes_on, 32 // goes_on, 4, cleanup=cleanup)
    assert isinstance(staged.rank_data.reader, ShardedStreamShard if streaming else ShardedArrowShard)
    assert staged.rank_data.reader.shards == 4
    now = _partitions(staged.frame)
    assert sorted(now) == list(range(goes_on))
    for k, table in now.items():
        shard = table.column(SHARD_COLUMN).to_numpy()
        assert sorted(set(shard.tolist())) == held_shards(4, k, goes_on), (k, set(shard.tolist()))
        for v in held_shards(4, k, goes_on):
            rows = table.filter(pa.array(shard == v)).drop_columns([SHARD_COLUMN])
            assert rows.column("x").to_pylist() == began[v].column("x").to_pylist(), (k, v)
            assert rows.column("y").to_pylist() == began[v].column("y").to_pylist(), (k, v)
    cleanup.run()


def test_data_with_validation_rows_or_no_fewer_ranks_is_staged_as_for_a_fresh_epoch(spark):
    df = spark.range(0, 32, numPartitions=2).selectExpr("array(cast(id as float)) as x", "id % 2 as y")
    host, cleanup = ClassicBackend(spark), Cleanup()
    whole = TFDataset.from_dataframe(df, "x", "y", feature_shapes={"x": (1,)})
    validation = TFDataset.from_dataframe(df, "x", "y", feature_shapes={"x": (1,)})
    assert whole.stage_resumed(host, 1, 8, 2, cleanup=cleanup, validation=validation) is None  # rows of both
    assert whole.stage_resumed(host, 2, 8, 2, cleanup=cleanup) is None  # not fewer ranks
    assert whole.stage_resumed(host, 2, 8, 3, cleanup=cleanup) is None  # 3 shards do not divide over 2 ranks
    cleanup.run()


def test_the_canonical_order_does_not_depend_on_the_order_rows_came_in(spark):
    """An elastic run's staging sorts each partition's rows by a hash of their values: the same rows in any order
    (a shuffle's fetch order) come out in one order; without it they stay as they came."""
    from optim.launch.backends.base import in_canonical_order

    rows = [([float(i), float(i % 5)], i % 3) for i in range(40)]
    mixed = list(reversed(rows[::2])) + rows[1::2]
    a = spark.createDataFrame(rows, "x array<float>, y long").coalesce(1)
    b = spark.createDataFrame(mixed, "x array<float>, y long").coalesce(1)
    assert [r.x for r in a.collect()] != [r.x for r in b.collect()]
    ordered_a = [(r.x, r.y) for r in in_canonical_order(a).collect()]
    assert ordered_a == [(r.x, r.y) for r in in_canonical_order(b).collect()]
    assert sorted(ordered_a) == sorted((r[0], r[1]) for r in rows)
