"""Virtual shards' arithmetic (:mod:`optim.data.virtual_shards`): which shards a rank takes, whether they divide over
the ranks, one batch of each put together, and the keys that send a shard's rows to its rank's partition. Both sides;
numpy only."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from optim.losses import SampleWeighted

__all__ = ["SHARD_COLUMN", "held_shards", "joined", "partition_keys", "reshardable", "spark_hash_int"]

#: The column that carries each row's shard in a DataFrame staged for a resumed epoch.
SHARD_COLUMN = "__tfnet_shard"


def held_shards(shards: int, rank: int, size: int) -> list[int]:
    """The shards of ``shards`` that rank ``rank`` of ``size`` takes (``size`` divides ``shards``).

    >>> held_shards(4, 1, 2)
    [2, 3]
    """
    return [v for v in range(shards) if v * size // shards == rank]


def reshardable(shards: int, size: int, batch_size: int) -> bool:
    """Whether ``size`` ranks of ``batch_size`` rows a step can take an epoch cut into ``shards``: each rank the same
    number of shards, each shard the same rows a step."""
    return shards > 0 and shards % size == 0 and batch_size % (shards // size) == 0


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int (Murmur3 x86 32-bit of 4 bytes, seed 42), as a signed 32-bit int."""
    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = rotl(k, 15) * 0x1B873593 & 0xFFFFFFFF
    h = rotl(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def partition_keys(n: int) -> list[int]:
    """For each partition ``k`` of ``n``, an int whose rows ``DataFrame.repartition(n, key)`` sends to partition
    ``k`` (Spark's hash partitioning: ``pmod(hash(key), n)``): the smallest such int.

    >>> partition_keys(1)
    [0]
    """
    keys: dict[int, int] = {}
    value = 0
    while len(keys) < n:
        keys.setdefault(spark_hash_int(value) % n, value)
        value += 1
    return [keys[k] for k in range(n)]


def _concat(parts: list):
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, SampleWeighted):
        return SampleWeighted(_concat([p.labels for p in parts]), _concat([p.weights for p in parts]))
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    return np.concatenate([np.asarray(p) for p in parts], axis=0)


def joined(iterators: list[Iterator]) -> Iterator:
    """One batch from each of ``iterators`` a step, put together (rows of the first first); ends with the shortest."""
    for parts in zip(*iterators):
        yield _concat([p[0] for p in parts]), _concat([p[1] for p in parts])
