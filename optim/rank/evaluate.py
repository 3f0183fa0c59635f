"""Distributed evaluation (:data:`optim.protocol.EVALUATE_ENTRY`): one Spark task per partition computes the
loss and metric accumulators (sums) over its rows. Worker side. The driver sums them
(:mod:`optim.launch.evaluate`), so the result equals an evaluation of the collected data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark import TaskContext

from optim.logs import quiet_worker
from optim.protocol import EvalJob
from optim.shares import unshipped
from optim.training.evaluation import accumulate, metrics_copy
from tfnet.serialize import net_from_bytes, register_hooks

__all__ = ["evaluate_task"]

_NETS: dict[str, Any] = {}  # this Python worker's nets, by the SHA-256 of their bytes


def _net(job: EvalJob):
    data = unshipped(job.net)
    key = hashlib.sha256(data + (job.hooks or b"")).hexdigest()
    if key not in _NETS:
        _NETS.clear()  # one net per worker at a time
        _NETS[key] = register_hooks(net_from_bytes(data), job.hooks)
    return _NETS[key]


def evaluate_task(job: EvalJob, rows: Iterable) -> Iterator[tuple[str]]:
    """Yields one record: the accumulator states of this task's partition, as JSON (a list of lists of floats)."""
    quiet_worker()
    net = _net(job)
    data, rank, size = job.data.evaluate(rows, TaskContext.get().partitionId(), job.size)
    acc = accumulate(net, job.loss, metrics_copy(job.metrics), data, job.batch_size, rank=rank, size=size)
    yield (json.dumps([s.ravel().tolist() for s in acc.states()]),)
