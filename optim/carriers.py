"""How a payload travels between the driver (or a Spark Connect client) and the ranks: a carrier. Both sides.

The net goes out to the ranks, and rank 0's result comes back, by one of a few roads; the backend that ships a
payload picks the road and makes its carrier (:meth:`optim.launch.backends.base.Backend.ship_net`,
:meth:`~optim.launch.backends.base.Backend.ship`), and whoever receives it only calls :meth:`Carrier.read`:

====================  =============  ==========================================================================
carrier               ``via``        the payload
====================  =============  ==========================================================================
:class:`InPlan`       ``plan``       in the job itself (pickled with the task: a Spark Connect plan)
:class:`InBroadcast`  ``broadcast``  in a Spark broadcast (a classic session)
:class:`InFile`       ``file``       in a file of the exchange folder (local disk, ``model_dir``, an object store)
``InPieces``          ``rows``       rank 0's result in the stage's rows (:class:`optim.transport.chunks.InPieces`)
====================  =============  ==========================================================================

``via`` is what ``last_run`` records of the road (``net_via``, ``result_via``). A carrier is picklable: it travels to
the ranks in the :class:`~optim.protocol.RankJob`. Rank 0's result carrier becomes the stage's result records
(:meth:`Carrier.records`, in :data:`optim.protocol.RESULT_SCHEMA`'s fields). Nothing here imports Spark.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from tfnet import storage

__all__ = ["Carrier", "InBroadcast", "InFile", "InPlan"]


class Carrier:
    """A payload on its way: :meth:`read` gives it back wherever it arrives."""

    #: The road, as ``last_run``'s ``net_via`` and ``result_via`` name it.
    via: ClassVar[str] = ""

    def read(self, storage_options: dict | None = None) -> Any:
        """The payload (the net's or rank 0's bytes; shipped data as itself). ``storage_options``: fsspec's, for a
        file at a URI."""
        raise NotImplementedError

    def discard(self, storage_options: dict | None = None) -> None:
        """Takes away what carried the payload, once it has been read (a file); nothing for the other roads."""

    def take(self, storage_options: dict | None = None) -> Any:
        """:meth:`read`, then :meth:`discard`: how the driver takes rank 0's result."""
        data = self.read(storage_options)
        self.discard(storage_options)
        return data

    def records(self, chunk_bytes: int) -> Iterator[tuple[int, bytes | None, str | None]]:
        """Rank 0's result as the stage's records ``(piece, chunk, path)``, pieces of at most ``chunk_bytes``."""
        raise TypeError(f"{type(self).__name__} does not come back as the stage's records.")


@dataclass
class InPlan(Carrier):
    """The payload in the job itself."""

    value: Any
    via: ClassVar[str] = "plan"

    def read(self, storage_options: dict | None = None) -> Any:
        return self.value


@dataclass
class InBroadcast(Carrier):
    """The payload in a Spark broadcast (made, and destroyed at the end, by the classic backend)."""

    broadcast: Any
    via: ClassVar[str] = "broadcast"

    def read(self, storage_options: dict | None = None) -> Any:
        return self.broadcast.value


@dataclass
class InFile(Carrier):
    """The payload in a file every side reads (the exchange folder)."""

    path: str
    via: ClassVar[str] = "file"

    @classmethod
    def written(cls, path: str, data: bytes, storage_options: dict | None = None) -> InFile:
        """``data`` written to ``path`` (atomically: a temporary file, then a rename), and its carrier."""
        storage.write_bytes_atomic(path, data, storage_options)
        return cls(path)

    def read(self, storage_options: dict | None = None) -> bytes:
        return storage.read_bytes(self.path, storage_options)

    def discard(self, storage_options: dict | None = None) -> None:
        storage.remove(self.path, storage_options)

    def records(self, chunk_bytes: int) -> Iterator[tuple[int, bytes | None, str | None]]:
        yield 0, None, self.path
