"""``TFDataset.from_rdd``: a Spark RDD of ``(features, label)`` records, one partition per rank. Driver side
(the adapter), with the small reader each rank runs over its records (:class:`RecordShard`).

The driver's checks read one record (``rdd.take(1)``: one small job, the only one before the stage): its features
against the net's inputs and its label's type against the loss, as numpy arrays of the same values would be checked
(:mod:`optim.data.checks`); every record's values are checked on its rank as it is read. A classic session balances
the records over the ranks; Spark Connect has no RDDs, and its session refuses them when the stage is made
(:meth:`~optim.data.base.StageHost.balance_records`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from optim.carriers import Carrier
from optim.data.arrays import ArrayDataset
from optim.data.base import DataAdapter, Staged
from optim.data.decode import records_to_arrays
from optim.data.values import check_label_types
from optim.errors import ColumnError
from optim.shares import Opened, RankData, RankEnv

__all__ = ["RDDDataset", "RecordRankData", "RecordShard"]


class RDDDataset(DataAdapter):
    """``TFDataset.from_rdd(rdd)``: an RDD of ``(features, label)`` records, ``features`` an array
    (or a tuple of arrays, one per model input)."""

    road = "an RDD"
    distributed = True
    holds_out = "ranks"

    def __init__(self, rdd, batch_size: int | None = None):
        self.rdd = rdd
        self.batch_size = batch_size
        self.has_labels = True
        self._sample: list | None = None  # the record the driver's checks read (rdd.take(1)), once

    def spark_app(self):
        """The RDD's SparkContext."""
        return getattr(self.rdd, "context", None)

    def sample(self) -> ArrayDataset | None:
        """The first record as one row of arrays (None: the RDD is empty), read once (``rdd.take(1)``)."""
        if self._sample is None:
            self._sample = list(self.rdd.take(1))
        return RecordShard()(self._sample, 0, presharded=False) if self._sample else None

    def bind(self, input_names, input_specs, output_names=None) -> None:
        """The first record's features against the net's inputs, as numpy arrays of them would be checked."""
        sample = self.sample()
        if sample is not None:
            sample.bind(input_names, input_specs)

    def checked(self, loss, net, on_nonfinite: str, where: str, training: bool = True) -> RDDDataset:
        """The first record's label type against the loss, as for numpy arrays; every record's values (class ids,
        NaN or Inf features) are checked on its rank as it reads them."""
        sample = self.sample()
        if sample is not None:
            check_label_types(sample.label_kinds(), loss, net, where)
        return self

    def to_local(self) -> ArrayDataset:
        """Collects the records to the driver (validation data of a distributed run)."""
        return RecordShard()(self.rdd.collect(), 0, presharded=False)

    def num_batches(self, batch_size, **kw):
        return None

    def stage(self, host, n, per_rank, *, cleanup, validation=None, timeout_s=600.0) -> Staged:
        records = host.balance_records(self.rdd, n, per_rank, timeout_s)
        shipped = None if validation is None else validation.for_ranks(host, cleanup)
        return Staged(RecordRankData(shipped, self.holdout if validation is None else None), records=records)

    def for_ranks(self, host, cleanup) -> Carrier:
        return self.to_local().for_ranks(host, cleanup)

    def evaluation(self, host, partitions) -> Staged:
        return Staged(RecordRankData(), records=host.records(self.rdd))

    def predict_with(self, predictor, batch_size: int, output_cols=None):
        """An RDD of outputs, aligned with the records (no columns: ``output_cols`` is refused)."""
        if output_cols is not None:
            raise ColumnError(f"predict() over {self.road} returns an RDD of outputs, which has no columns; received "
                              f"output_cols={output_cols!r}.")
        return predictor.predict(self.rdd.map(lambda record: record[0] if isinstance(record, tuple) else record))


class RecordShard:
    """A partition of records into arrays (empty arrays for an empty partition)."""

    def __call__(self, records, partition: int, presharded: bool = True) -> ArrayDataset:
        feats, labels = records_to_arrays(records, partition)
        if not feats:
            return ArrayDataset([np.zeros((0,), np.float32)], [np.zeros((0,), np.float32)], True, presharded=True)
        return ArrayDataset(feats, [labels], True, presharded=presharded)


class RecordRankData(RankData):
    """A rank's partition of records, read whole and checked."""

    def __init__(self, validation: Carrier | None = None, holdout=None):
        self.validation, self.holdout = validation, holdout

    def open(self, rows: Iterable, rank: int, size: int, env: RankEnv) -> Opened:
        shard = RecordShard()(rows, rank)
        if self.holdout is not None:
            train, val = shard.hold_out(self.holdout)
            return Opened(env.check_values(train, f"partition {rank}"), val)
        return Opened(env.check_values(shard, f"partition {rank}"), self.open_validation())

    def evaluate(self, rows: Iterable, partition: int, size: int):
        return RecordShard()(rows, partition), 0, 1
