"""Spark Connect: telling a Connect session from a classic one, and the limits on what crosses a
Connect stage's boundary as data (they read Spark settings). Both sides.

A Connect client (``SparkSession.builder.remote("sc://host:15002")``) has no SparkContext, no
broadcast and no listener the executors can reach. So, under Connect:

* a rank's failure travels inside its task's error text (:func:`optim.transport.failures.failure_text`),
  and the client reads it back with :func:`optim.transport.failures.failures_in`;
* rank 0's result comes back through ``collect()`` as rows of at most :func:`chunk_bytes` each
  (:mod:`optim.transport.chunks`), so that no Arrow batch outgrows ``spark.connect.grpc.arrow.maxBatchSize``;
* the net, the hooks and the optimiser state travel in the plan itself (the stage's function),
  up to :func:`plan_limit` bytes, or through ``model_dir`` beyond that.
"""

from __future__ import annotations

from optim.spark.conf import setting_bytes

__all__ = ["is_connect", "chunk_bytes", "plan_limit", "result_limit", "spark_context"]

#: What the plan may carry by default (``spark.tfnet.connect.maxPlanBytes`` changes it). A Connect
#: server takes messages up to 128 MiB (``spark.connect.grpc.maxInboundMessageSize``), but the plan
#: becomes a task binary that every task deserialises in the executor's heap: a 120 MiB one ran a
#: local server with the default 1 GiB heap out of memory, 48 MiB ran (measured 2026-11-23).
DEFAULT_PLAN_LIMIT = 48 << 20
#: What rank 0's result may bring back through ``collect()`` by default (``spark.tfnet.connect.maxResultBytes``
#: changes it); a larger one goes through ``model_dir``. The pieces pass through the server's heap: a
#: 177 MB result ran a local server with the default 1 GiB heap out of memory (2026-11-23).
DEFAULT_RESULT_LIMIT = 96 << 20
#: Spark Connect's default ``spark.connect.grpc.arrow.maxBatchSize``.
DEFAULT_ARROW_BATCH = 4 << 20


def is_connect(obj) -> bool:
    """Whether ``obj`` (a SparkSession or a DataFrame) belongs to Spark Connect."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def spark_context(spark):
    """A classic session's SparkContext (``spark`` itself when it is one)."""
    return spark if hasattr(spark, "parallelize") else spark.sparkContext


def chunk_bytes(spark) -> int:
    """Bytes per result row: a quarter of ``spark.connect.grpc.arrow.maxBatchSize`` (4 MiB by
    default), so a batch of rows stays under it with room for Arrow's framing."""
    return max(64 << 10, setting_bytes(spark, "spark.connect.grpc.arrow.maxBatchSize", DEFAULT_ARROW_BATCH) // 4)


def plan_limit(spark) -> int:
    """Bytes the plan may carry (``spark.tfnet.connect.maxPlanBytes``, default :data:`DEFAULT_PLAN_LIMIT`)."""
    return setting_bytes(spark, "spark.tfnet.connect.maxPlanBytes", DEFAULT_PLAN_LIMIT)


def result_limit(spark) -> int:
    """Bytes rank 0's result may bring back through ``collect()`` (``spark.tfnet.connect.maxResultBytes``,
    default :data:`DEFAULT_RESULT_LIMIT`)."""
    return setting_bytes(spark, "spark.tfnet.connect.maxResultBytes", DEFAULT_RESULT_LIMIT)
