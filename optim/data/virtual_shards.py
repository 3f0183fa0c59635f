"""An epoch resumed on fewer ranks than started it, each row still taken once: virtual shards. Rank side.

An epoch is cut into as many shards as it had ranks when it began (``V``, recorded in every checkpoint taken inside
it). Shard ``v`` is what rank ``v`` of ``V`` trained on: its rows, shuffled with ``[seed, epoch, v]``, ``G / V`` of
them a step (``G``: the global batch). When the run goes on with ``n`` ranks from a checkpoint at batch ``b`` of that
epoch (a decommission notice, or a shrink after a failure), rank ``k`` takes the shards ``v`` with ``v * n // V ==
k`` (:func:`held_shards`) and, at each step from ``b`` to the epoch's end, the next batch of each: the batches shard
``v``'s rank would have trained on, put together. Every row of the epoch is then taken once: the batches before ``b``
by the attempt that wrote the checkpoint, the others here; and the global batch stays ``G``. The next epoch starts
afresh on ``n`` ranks (its shards are the ``n`` ranks').

A rank's data answers ``shard_batches`` where it can give other ranks' shards: numpy arrays every rank holds whole
(:class:`~optim.data.arrays.ArrayDataset`), and a DataFrame partition staged with each row's shard (the driver stages
it so: :meth:`optim.data.dataframe.DataFrameDataset.stage_resumed`), read whole (:class:`ShardedArrays`, made by
:class:`ShardedArrowShard`) or streamed (:class:`ShardedStreams`, each shard stored as its rank stored it, made by
:class:`ShardedStreamShard`). Elsewhere (a DataFrame with validation rows in its stage, RDDs, Parquet files, a Delta
table, a ``tf.data`` input) the resumed epoch is cut afresh over ``n`` ranks from batch ``b``, which may take some rows
twice and others not at all; :func:`resumed_batches` says so in the log (``docs/clusters.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

from optim.data.arrays import ArrayDataset
from optim.data.partition import CheckedParts
from optim.data.shards import SHARD_COLUMN, held_shards, joined, reshardable
from optim.data.spool import spool
from optim.data.stream import ROW_COLUMN

__all__ = ["ShardedArrays", "ShardedArrowShard", "ShardedStreamShard", "ShardedStreams", "epoch_batches",
           "resumed_batches"]

log = logging.getLogger("tfnet.spark.worker")

def resumed_batches(data, batch_size: int, *, shards: int, rank: int, size: int, **kwargs) -> Iterator:
    """This rank's batches of an epoch cut into ``shards`` and resumed on ``size`` ranks (see the module), from
    ``data.shard_batches``; where the data cannot give them, or the shards do not divide over the ranks, its plain
    batches, with a warning that rows of this epoch may be taken twice or not at all."""
    if not reshardable(shards, size, batch_size):
        why = f"{shards} shard(s) do not divide evenly over {size} rank(s) of {batch_size} rows a step"
    elif not getattr(data, "gives_shards", False):
        why = f"{type(data).__name__} cannot give another rank's shard"
    else:
        return data.shard_batches(batch_size, shards=shards, rank=rank, size=size, **kwargs)
    if rank == 0:
        log.warning("The epoch resumed here began on %d rank(s) and goes on on %d: %s, so its rows are cut afresh from "
                    "the batch it resumed at; some rows of this epoch may be trained twice and others not at all.",
                    shards, size, why)
    return data.batches(batch_size, rank=rank, size=size, **kwargs)


def epoch_batches(data, batch_size: int, *, shards: int = 0, rank: int = 0, size: int = 1, **kwargs) -> Iterator:
    """The batches of one epoch, as the loop asks for them: ``data.batches``, or, for an epoch that ``shards`` ranks
    began and fewer go on with, :func:`resumed_batches` (through the data's own tally when it keeps one:
    :class:`~optim.rank.tally.EpochTally`)."""
    if not shards or shards == size:
        return data.batches(batch_size, rank=rank, size=size, **kwargs)
    if getattr(data, "tallies_resumed", False):
        return data.batches(batch_size, rank=rank, size=size, shards=shards, **kwargs)
    return resumed_batches(data, batch_size, shards=shards, rank=rank, size=size, **kwargs)


class _HeldShards:
    """The shards a rank holds (``parts``: shard -> its rows, an adapter) of an epoch cut into ``shards``; their
    batches put together, each shard's as its own rank took them."""

    #: It gives the shards it holds (:func:`resumed_batches`).
    gives_shards = True

    def __init__(self, parts: dict, shards: int):
        self.parts, self.shards = dict(sorted(parts.items())), int(shards)

    def joined_batches(self, batch_size: int, **kwargs) -> Iterator:
        """A batch of each shard a step, ``batch_size`` rows in all (each shard seeded as rank ``v`` of ``shards``)."""
        per_shard = batch_size // len(self.parts)
        return joined([p.batches(per_shard, rank=v, size=self.shards, **kwargs) for v, p in self.parts.items()])

    def shard_batches(self, batch_size, *, shards, rank, size, **kwargs) -> Iterator:
        held = held_shards(shards, rank, size)
        if shards != self.shards or sorted(self.parts) != held:
            raise ValueError(f"Rank {rank} of {size} holds shards {sorted(self.parts)} of {self.shards}; the epoch "
                             f"resumed needs shards {held} of {shards}.")
        return self.joined_batches(batch_size, **kwargs)


class ShardedArrays(_HeldShards):
    """A rank's rows staged for a resumed epoch: ``parts`` maps each shard it holds to that shard's rows (an
    :class:`ArrayDataset`, in the order the shard's own rank read them). For the resumed epoch,
    :meth:`shard_batches`; for the epochs after it, everything else, as one partition (the shards' rows in shard
    order)."""

    def __init__(self, parts: dict[int, ArrayDataset], shards: int):
        super().__init__(parts, shards)
        first = next(iter(self.parts.values()))
        self.whole = ArrayDataset([np.concatenate(a) for a in zip(*(p.features for p in self.parts.values()))],
                                  None if first.labels is None else
                                  [np.concatenate(a) for a in zip(*(p.labels for p in self.parts.values()))],
                                  first.single_label, first.batch_size, True, first.augment,
                                  None if first.weights is None else
                                  np.concatenate([p.weights for p in self.parts.values()]))

    def __getattr__(self, name):
        if name in ("parts", "whole", "shards"):
            raise AttributeError(name)
        return getattr(self.whole, name)

    def __len__(self) -> int:
        return len(self.whole)

    def each_shard(self, check, where: str) -> ShardedArrays:
        """Each shard's rows through ``check(dataset, where)`` (the rank's value checks, which may drop rows)."""
        return ShardedArrays({v: check(p, f"{where}, shard {v}") for v, p in self.parts.items()}, self.shards)


class ShardedArrowShard:
    """``(arrow batches, partition) -> ShardedArrays``: a partition staged with :data:`SHARD_COLUMN`, read by
    ``reader`` (an :class:`~optim.data.partition.ArrowShard`) shard by shard, each shard's rows in the order they
    came."""

    def __init__(self, reader, shards: int):
        self.reader, self.shards = reader, int(shards)

    def __call__(self, batches, partition: int) -> ShardedArrays:
        import pyarrow as pa

        table = pa.Table.from_batches(list(batches))
        tags = table.column(SHARD_COLUMN).to_numpy()
        table = table.drop_columns([SHARD_COLUMN])
        parts = {}
        for v in np.unique(tags):
            part = table.filter(pa.array(tags == v))
            parts[int(v)] = self.reader(part.to_batches(), partition)
        if not parts:
            raise ValueError(f"Partition {partition} of an epoch resumed on fewer ranks holds no rows.")
        return ShardedArrays(parts, self.shards)


class ShardedStreams(_HeldShards):
    """A rank's rows staged for a resumed epoch and streamed (``streaming=True``): ``parts`` maps each shard it holds to
    that shard's local copy (a :class:`~optim.data.stream.StreamedDataset`, stored as the shard's own rank stored
    it). Every epoch of the attempt takes each shard's batches, ``G / V`` rows a step, put together: the resumed epoch
    as the shards' ranks would have gone on, the later ones each shard shuffled on its own (``[seed, epoch, shard]``),
    every row once an epoch as ever."""

    def __init__(self, parts: dict, shards: int):
        super().__init__(parts, shards)
        first = next(iter(self.parts.values()))
        self.has_labels, self.single_label = first.has_labels, first.single_label

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts.values())

    def rows_on(self, rank: int, size: int) -> int:
        """Rows as the steps are agreed on: the largest shard's, times the shards held (each step takes a batch of
        each), so the ranks agree on the steps the shards' own ranks took."""
        return len(self.parts) * max(len(p) for p in self.parts.values())

    def num_batches(self, batch_size, *, rank=0, size=1, drop_remainder=False) -> int:
        per_shard = max(1, batch_size // len(self.parts))
        return max(p.num_batches(per_shard, drop_remainder=drop_remainder) for p in self.parts.values())

    def batches(self, batch_size, *, rank=0, size=1, **kwargs) -> Iterator:
        return self.joined_batches(batch_size, **kwargs)

    def release(self) -> None:
        for p in self.parts.values():
            p.release()

    @property
    def source(self):
        """The first shard's local copy (what the rank's record of its memory reads)."""
        return next(iter(self.parts.values())).source


class ShardedStreamShard:
    """A partition staged with :data:`SHARD_COLUMN`, stored shard by shard (``streaming=True``): each shard's rows
    numbered, checked and stored into a local copy of its own, as ``reader`` (a
    :class:`~optim.data.partition.StreamShard`) stores a partition; ``size``: the ranks the partitions go to."""

    def __init__(self, reader, shards: int, size: int):
        self.reader, self.shards, self.size = reader, int(shards), int(size)

    def spool(self, batches, partition: int, folder: str, name: str, check=None) -> ShardedStreams:
        import pyarrow as pa

        held = held_shards(self.shards, partition, self.size)
        checked = {v: CheckedParts(self.reader, partition, check) for v in held}
        seen = dict.fromkeys(held, 0)

        def route(batch) -> dict:
            tags = batch.column(batch.schema.get_field_index(SHARD_COLUMN)).to_numpy()
            rows = batch.select([n for n in batch.schema.names if n != SHARD_COLUMN])
            out = {}
            for v in np.unique(tags).tolist():
                if v not in checked:
                    raise ValueError(f"Partition {partition} holds rows of shard {v}; its rank takes shards {held}.")
                part = rows.filter(pa.array(tags == v))
                part = part.append_column(ROW_COLUMN, pa.array(np.arange(seen[v], seen[v] + part.num_rows,
                                                                         dtype=np.int64)))
                seen[v] += part.num_rows
                out[v] = checked[v](part)
            return out

        files = spool(batches, folder, {v: f"{name}-s{v}" for v in held}, route, self.reader.block_rows)
        if check is not None:
            check.finish()
        return ShardedStreams({v: self.reader.dataset(files[v], partition) for v in held}, self.shards)
