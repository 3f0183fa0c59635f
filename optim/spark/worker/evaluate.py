"""Distributed evaluation: one Spark task per partition computes the loss and metric
accumulators (sums) over its rows. Worker side. The driver sums them
(:mod:`optim.spark.driver.evaluate`), so the result equals an evaluation of the collected data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

_NETS: dict[str, Any] = {}  # this Python worker's nets, by the SHA-256 of their bytes


@dataclass
class EvalJob:
    """What every partition needs (picklable): the net's bytes (a broadcast, or the bytes under
    Spark Connect) and its hooks, the loss, the metrics, the batch size and how a partition becomes
    arrays."""

    net: Any
    loss: Any
    metrics: list
    batch_size: int
    reader: Any = None  # a shard reader (DataFrame, RDD); None for tf.data
    data: Any = None  # the TFDataDataset, for tf.data
    size: int = 1
    hooks: bytes | None = None  # tfnet.serialize.hooks_to_bytes(net)


def _net(job: EvalJob):
    from tfnet.serialize import net_from_bytes, register_hooks

    data = job.net if isinstance(job.net, (bytes, bytearray)) else job.net.value  # in the plan under Connect
    key = hashlib.sha256(data + (job.hooks or b"")).hexdigest()
    if key not in _NETS:
        _NETS.clear()  # one net per worker at a time
        _NETS[key] = register_hooks(net_from_bytes(data), job.hooks)
    return _NETS[key]


def evaluate_partition(job: EvalJob, partition: int, rows) -> str:
    """The accumulator states of one partition, as JSON (a list of lists of floats)."""
    from optim.logs import quiet_worker
    from optim.training.evaluation import accumulate, metrics_copy

    quiet_worker()
    net = _net(job)
    if job.reader is not None:
        shard, rank, size = job.reader(rows, partition), 0, 1
    else:
        for _ in rows:  # the placeholder partition of parallelize(range(size))
            pass
        shard, rank, size = job.data, partition, job.size
    acc = accumulate(net, job.loss, metrics_copy(job.metrics), shard, job.batch_size, rank=rank, size=size)
    return json.dumps([s.ravel().tolist() for s in acc.states()])
