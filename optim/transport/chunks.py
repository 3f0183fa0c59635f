"""Rank 0's result in pieces, for Spark Connect: it comes back through ``collect()`` as rows of at
most :func:`optim.spark.connect.chunk_bytes` each, so that no Arrow batch outgrows
``spark.connect.grpc.arrow.maxBatchSize``. Pure: runs on both sides (:func:`to_chunks` on rank 0,
:func:`join_chunks` on the client). :class:`InPieces` is that road's carrier (:mod:`optim.carriers`), and
:func:`result_carrier` reads rank 0's carrier back from the stage's rows, whichever road it took.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from optim.carriers import Carrier, InFile, InPlan
from optim.errors import DistributedTrainingError

__all__ = ["InPieces", "join_chunks", "result_carrier", "to_chunks"]


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


@dataclass
class InPieces(InPlan):
    """Rank 0's result in the stage's rows, in pieces (:func:`to_chunks`): the payload held as :class:`InPlan` holds
    it, on another road."""

    value: bytes
    via: ClassVar[str] = "rows"

    def records(self, chunk_bytes: int) -> Iterator[tuple[int, bytes | None, str | None]]:
        for index, piece in to_chunks(self.value, chunk_bytes):
            yield index, piece, None


def result_carrier(rows: list[tuple]) -> Carrier:
    """Rank 0's result carrier from the stage's rows (:data:`optim.protocol.RESULT_SCHEMA`'s ``(piece, chunk,
    path)``, as :meth:`Carrier.records <optim.carriers.Carrier.records>` made them): the file they name, or the
    payload joined from its pieces.

    Raises:
        DistributedTrainingError: no rows.
        ValueError: a piece is missing or repeated."""
    paths = [r[2] for r in rows if r[2]]
    if paths:
        return InFile(paths[0])
    if not rows:
        raise DistributedTrainingError("Rank 0 returned no result.")
    return InPieces(join_chunks((r[0], r[1]) for r in rows))
