"""Rank 0's result in pieces, for Spark Connect: it comes back through ``collect()`` as rows of at
most :func:`optim.spark.connect.chunk_bytes` each, so that no Arrow batch outgrows
``spark.connect.grpc.arrow.maxBatchSize``. Pure: runs on both sides (:func:`to_chunks` on rank 0,
:func:`join_chunks` on the client).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["to_chunks", "join_chunks"]


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
