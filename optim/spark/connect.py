"""Spark Connect: telling a Connect session from a classic one, and what crosses a Connect stage's
boundary as data. Pure: runs on both sides.

A Connect client (``SparkSession.builder.remote("sc://host:15002")``) has no SparkContext, no
broadcast and no listener the executors can reach. So, under Connect:

* a rank's failure travels inside its task's error text, between :data:`FAILURE_OPEN` and
  :data:`FAILURE_CLOSE` (base64 of :class:`~optim.spark.failures.WorkerFailure`'s JSON), and the
  client reads it back with :func:`failures_in`; nothing is parsed but that span;
* rank 0's result comes back through ``collect()`` as rows of at most :func:`chunk_bytes` each, so
  that no Arrow batch outgrows ``spark.connect.grpc.arrow.maxBatchSize``;
* the net, the hooks and the optimiser state travel in the plan itself (the stage's function),
  up to :func:`plan_limit` bytes, or through ``model_dir`` beyond that.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator

from optim.spark.conf import setting_bytes
from optim.spark.failures import WorkerFailure

__all__ = ["is_connect", "failure_text", "failures_in", "to_chunks", "join_chunks", "chunk_bytes", "plan_limit",
           "result_limit", "session_of"]

FAILURE_OPEN = "[tfnet-failure:"
FAILURE_CLOSE = ":tfnet-failure]"
_FAILURE = re.compile(re.escape(FAILURE_OPEN) + r"([A-Za-z0-9+/=]+)" + re.escape(FAILURE_CLOSE))
#: The worker traceback a failure carries through the error text (the start is cut).
TRACEBACK_CHARS = 4000

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


def session_of(dataset, default=None):
    """The SparkSession behind a dataset's DataFrame, else ``default``."""
    df = getattr(dataset, "df", None)
    return df.sparkSession if df is not None else default


def failure_text(failure: WorkerFailure) -> str:
    """``failure`` as a span of text an exception message can carry through Spark."""
    import dataclasses

    short = dataclasses.replace(failure, traceback=failure.traceback[-TRACEBACK_CHARS:])
    return FAILURE_OPEN + base64.b64encode(short.to_json()).decode("ascii") + FAILURE_CLOSE


def failures_in(text: str) -> list[WorkerFailure]:
    """The failures :func:`failure_text` put into ``text`` (an error message from Spark), once each."""
    out, seen = [], set()
    for match in _FAILURE.finditer(text or ""):
        if match.group(1) in seen:
            continue
        seen.add(match.group(1))
        try:
            out.append(WorkerFailure.from_json(base64.b64decode(match.group(1))))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def to_chunks(payload: bytes, size: int) -> Iterator[tuple[int, bytes]]:
    """``(index, piece)`` pairs of at most ``size`` bytes; an empty payload is one empty piece."""
    if size < 1:
        raise ValueError(f"`size` must be positive. Received: {size}")
    yield 0, payload[:size]
    for i, start in enumerate(range(size, len(payload), size), start=1):
        yield i, payload[start:start + size]


def join_chunks(rows: Iterable[tuple[int, bytes]]) -> bytes:
    """The payload back from :func:`to_chunks`' pieces in any order.

    Raises:
        ValueError: a piece is missing or repeated."""
    pieces = sorted(rows, key=lambda r: r[0])
    if [i for i, _ in pieces] != list(range(len(pieces))):
        raise ValueError(f"Rank 0's result came back incomplete: pieces {[i for i, _ in pieces][:20]}")
    return b"".join(bytes(p) for _, p in pieces)


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
