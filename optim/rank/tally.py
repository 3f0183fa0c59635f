"""What a rank trained on, epoch by epoch: how many rows, and which. Worker side.

:class:`EpochTally` stands in for the rank's training data (a :class:`~optim.data.base.DataAdapter`): the training
loop asks it for each epoch's batches as it would ask the data. Of every batch the loop trained on, it counts the
rows and adds their fingerprints (:func:`fingerprint`: each row's BLAKE2b, summed modulo 2**64, so the same rows give
the same sum in any order). When the next epoch starts, and when training ends, it writes
``model_dir/ranks/<run id>/epochs-a<attempt>-r<rank>.json``: for each epoch the batch it started from (a resumed
epoch starts later), the batches and rows it trained on and their fingerprint. With every rank's file, an operator
or a test sees whether an epoch covered each row of the data exactly once: the rows add up to the data's, and the
fingerprints to the data's.

It writes the file at each checkpoint too (:meth:`EpochTally.reporter`: the loop's ``checkpoint`` event, on every
rank), with what the open epoch had trained on at that checkpoint's step under ``checkpoints``. A rank killed after
the checkpoint leaves that record, so an epoch interrupted by a failure is stitched whole: the attempt before the
resume up to the checkpoint, then the attempt after it from there (``tests/elastic_checks.py``, ``stitched_epochs``).
"""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np

from optim.training.reporting import Reporter
from tfnet import storage

__all__ = ["EpochTally", "fingerprint"]

log = logging.getLogger("tfnet.spark.worker")

#: The values of a row that its fingerprint reads, per array (the first ones: enough to tell rows apart, and cheap
#: for an image).
ROW_VALUES = 1024
_MOD = 1 << 64


def _arrays(value) -> list:
    if isinstance(value, dict):
        return [a for k in sorted(value) for a in _arrays(value[k])]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays(v)]
    return [] if value is None else [np.asarray(value)]


def fingerprint(*parts) -> tuple[int, int]:
    """``(rows, fingerprint)`` of a batch: ``parts`` are its features, labels (arrays, or lists, tuples or dicts of
    arrays, each with the rows first). A row's fingerprint is the BLAKE2b (8 bytes) of its first :data:`ROW_VALUES`
    values of each array, numbers as float64, anything else as text; the batch's is their sum modulo 2**64."""
    arrays = [a for p in parts for a in _arrays(p)]
    if not arrays:
        return 0, 0
    n = len(arrays[0])
    numbers = [a.reshape(n, -1)[:, :ROW_VALUES].astype(np.float64) for a in arrays if a.dtype.kind in "biuf"]
    others = [a.reshape(n, -1)[:, :ROW_VALUES] for a in arrays if a.dtype.kind not in "biuf"]
    table = np.ascontiguousarray(np.concatenate(numbers, axis=1)) if numbers else np.zeros((n, 0))
    total = 0
    for i in range(n):
        h = hashlib.blake2b(table[i].tobytes(), digest_size=8)
        for a in others:
            h.update("\x1f".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                                 for v in a[i]).encode())
        total = (total + int.from_bytes(h.digest(), "little")) % _MOD
    return n, total


class EpochTally:
    """``data`` as the loop sees it, counting what each epoch trained on (see the module); ``path``: the file it
    writes (None: it counts and writes nothing), ``info``: what else the file says (rank, attempt, size)."""

    def __init__(self, data, path: str | None, options=None, info: dict | None = None):
        self._data, self._path, self._options, self._info = data, path, options, dict(info or {})
        self.epochs: dict[int, dict] = {}
        self.checkpoints: dict[int, dict] = {}  # {step: the open epoch's record at that checkpoint}
        self._open: dict | None = None
        self._sums: list[tuple[int, int]] = []  # the open epoch's (rows, fingerprint) after each batch handed out

    def __getattr__(self, name):
        return getattr(self._data, name)

    #: It counts an epoch resumed on fewer ranks too (``shards``: :func:`optim.data.virtual_shards.epoch_batches`).
    tallies_resumed = True

    def batches(self, batch_size, *, epoch: int = 0, skip: int = 0, shards: int = 0, **kwargs):
        """The data's batches for ``epoch`` from batch ``skip`` (of an epoch that ``shards`` ranks began, when it is
        resumed on fewer); each one counted once the loop comes back for the next (it trained on it), so a batch
        pulled and left (the epoch's steps were done) is not."""
        from optim.data.virtual_shards import epoch_batches

        self.close()  # the epoch before is over
        record = self.epochs[int(epoch)] = {"from_batch": int(skip), "batches": 0, "rows": 0, "fingerprint": 0}
        if shards:
            record["shards"] = int(shards)
        self._open, self._sums = record, []
        return self._counted(epoch_batches(self._data, batch_size, epoch=epoch, skip=skip, shards=shards, **kwargs),
                             record, self._sums)

    @staticmethod
    def _counted(batches, record: dict, sums: list):
        for item in batches:
            rows, fp = fingerprint(*item)
            last = sums[-1] if sums else (0, 0)
            sums.append((last[0] + rows, (last[1] + fp) % _MOD))
            yield item
            record["batches"] += 1
            record["rows"] += rows
            record["fingerprint"] = (record["fingerprint"] + fp) % _MOD

    def checkpointed(self, step: int, epoch: int, batch: int) -> None:
        """A checkpoint at ``step`` holds ``batch`` batches of ``epoch``: records what this rank trained on of them
        (from the epoch's first batch this attempt took) and writes the file."""
        record = self.epochs.get(int(epoch))
        if record is None or batch <= record["from_batch"] or batch - record["from_batch"] > len(self._sums):
            return  # an epoch boundary's checkpoint (batch 0 of the next), or an epoch this attempt did not take
        rows, fp = self._sums[batch - record["from_batch"] - 1]
        self.checkpoints[int(step)] = {"epoch": int(epoch), "batch": int(batch), "from_batch": record["from_batch"],
                                       "rows": rows, "fingerprint": fp}
        self._write()

    def reporter(self) -> Reporter:
        """A reporter for the loop that passes its ``checkpoint`` events to :meth:`checkpointed`."""
        return _Checkpoints(self)

    def close(self) -> None:
        """Writes the file (best effort: a failed write is logged) if an epoch was counted since the last write."""
        if self._open is None:
            return
        self._open = None
        self._write()

    def _write(self) -> None:
        if not self._path:
            return
        body = {**self._info,
                "epochs": {str(e): {**r, "fingerprint": str(r["fingerprint"])} for e, r in sorted(self.epochs.items())},
                "checkpoints": {str(s): {**r, "fingerprint": str(r["fingerprint"])}
                                for s, r in sorted(self.checkpoints.items())}}
        try:
            storage.write_bytes_atomic(self._path, json.dumps(body).encode(), self._options)
        except Exception as exc:  # noqa: BLE001 - a record for operators: training goes on without it
            log.warning("Cannot write %s (%s).", self._path, exc)


class _Checkpoints(Reporter):
    def __init__(self, tally: EpochTally):
        self.tally = tally

    def checkpoint(self, step: int, epoch: int, batch: int) -> None:
        self.tally.checkpointed(step, epoch, batch)
