"""A ``tf.data`` input (``TFDataset.from_tf_data``): a batched ``tf.data.Dataset``, or a function building each
rank's. Both sides: on Spark it goes with the job (over a placeholder stage) and each rank builds its shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import tensorflow as tf

from optim.data.arrays import ArrayDataset
from optim.data.base import Batch, DataAdapter, Opened, RankData, RankEnv, Shipped, Staged
from optim.data.values import finite_batch
from optim.errors import DataError, NonFiniteInputError
from optim.losses import SampleWeighted

__all__ = ["TFDataDataset"]


class TFDataDataset(DataAdapter):
    """A batched ``tf.data.Dataset`` of ``(features, labels)``, or ``fn(rank, size)`` building one.

    A plain dataset is sharded across ranks with ``Dataset.shard(size, rank)``; a function builds
    its own shard. Shuffle inside the dataset (with a seed, for reproducible runs). On resume,
    the batches already seen in the current epoch are skipped with ``Dataset.skip``.

    ``optimize`` checks each batch for NaN or Inf features as it is read, on whichever process
    reads it (:meth:`checked`, :func:`optim.training.checks.finite_batch`): a NonFiniteInputError
    that names the batch, the row in it and the rank, or, with ``on_nonfinite="skip"``, the batch
    without those rows. A batch left with no rows is not a step: the next batch takes its place
    (with the equal-steps rule of distributed training, from the rank's repeated input), so every
    rank still takes the same number of steps.
    """

    #: NaN and Inf checks of each batch: None (none; evaluate and predict), "raise" or "skip"
    on_nonfinite: str | None = None
    #: what the data is called in a check's message ("the training data")
    nonfinite_where: str = "the data"
    nonfinite_per_epoch: bool = True
    #: wholly non-finite batches in a row after which a repeated input is taken as all bad
    MAX_EMPTY_BATCHES = 1000

    def __init__(self, dataset_or_fn):
        if isinstance(dataset_or_fn, tf.data.Dataset):
            self._fn: Callable[[int, int], tf.data.Dataset] = (
                lambda rank, size, ds=dataset_or_fn: ds if size == 1 else ds.shard(size, rank)
            )
        elif callable(dataset_or_fn):
            self._fn = dataset_or_fn
        else:
            raise TypeError(
                f"from_tf_data takes a tf.data.Dataset or a function (rank, size) -> Dataset. Received: {dataset_or_fn!r}"
            )
        self.has_labels = True

    def dataset(self, rank: int = 0, size: int = 1) -> tf.data.Dataset:
        ds = self._fn(rank, size)
        if not isinstance(ds, tf.data.Dataset):
            raise DataError(f"The function given to from_tf_data must return a tf.data.Dataset; it returned {type(ds).__name__}.")
        return ds

    def num_batches(self, batch_size, *, rank=0, size=1, drop_remainder=False):
        n = int(self.dataset(rank, size).cardinality())
        return n if n >= 0 else None

    def checked(self, loss, net, on_nonfinite: str, where: str, training: bool = True) -> TFDataDataset:
        """A copy of this dataset whose batches are checked for NaN or Inf features (``on_nonfinite``
        "raise" or "skip") as they are read; the original is left as it was. ``where`` names the data in
        messages, and ``training`` adds the epoch to the batch number. Batches count from 1, as the progress
        bar does; rows within a batch from 0, as numpy indexes them."""
        import copy

        out = copy.copy(self)
        out.on_nonfinite, out.nonfinite_where, out.nonfinite_per_epoch = on_nonfinite, where, training
        return out

    # ------------------------------------------------------------ over Spark

    def stage(self, host, n, per_rank, *, cleanup, validation=None, timeout_s=600.0) -> Staged:
        shipped = None if validation is None else validation.for_ranks(host, cleanup)
        return Staged(TFDataRankData(self, shipped), frame=host.placeholder(n))

    def for_ranks(self, host, cleanup) -> Shipped:
        """Itself when it can be pickled (``from_tf_data(fn)``: each rank builds its shard); a
        ``tf.data.Dataset`` object, which cannot, is collected here to numpy arrays of at most
        ``host.validation_limit()`` bytes and shipped as those.

        Raises:
            TypeError: the collected arrays would exceed the limit; the message says how to use
                ``TFDataset.from_tf_data(fn)`` instead.
        """
        import cloudpickle

        try:
            cloudpickle.dumps(self)
            return Shipped(self)
        except Exception:  # noqa: BLE001 - a tf.data.Dataset object cannot be pickled: collect it instead
            pass
        return _collected(self, host.validation_limit()).for_ranks(host, cleanup)

    def evaluation(self, host, partitions) -> Staged:
        n = host.partitions(partitions)
        return Staged(TFDataRankData(self), frame=host.placeholder(n), size=n)

    def batches(self, batch_size, *, epoch=0, seed=0, shuffle=True, skip=0, rank=0, size=1,
                drop_remainder=False, steps=None, training=False) -> Iterator[Batch]:
        ds = self.dataset(rank, size)
        if steps is not None:  # equal steps on every rank: repeat, then take
            ds = ds.repeat().take(steps) if self.on_nonfinite is None else ds.repeat()
        if skip:
            ds = ds.skip(skip)
        if self.on_nonfinite is None:
            for element in ds:
                yield _split_element(element)
            return
        yield from self._checked_batches(ds, None if steps is None else steps - skip, epoch, skip, rank, size)

    def _checked_batches(self, ds, want: int | None, epoch: int, skip: int, rank: int, size: int) -> Iterator[Batch]:
        """``want`` batches (all, when None) with NaN and Inf checked; a batch with no row left is
        replaced by the next one."""
        given = empty = 0
        on_rank = f" on rank {rank}" if size > 1 else ""
        of_epoch = f" of epoch {epoch + 1}" if self.nonfinite_per_epoch else ""
        if want is not None and want <= 0:
            return
        for b, element in enumerate(ds, start=skip + 1):
            where = f"{self.nonfinite_where}: batch {b}{of_epoch}{on_rank}"
            batch = finite_batch(*_split_element(element), self.on_nonfinite, where)
            if batch is None:
                empty += 1
                if want is not None and empty >= self.MAX_EMPTY_BATCHES:
                    raise NonFiniteInputError(f"{self.nonfinite_where}{on_rank}: {empty} batches in a row have NaN or "
                                              "Inf in every row; there is nothing finite to train on.")
                continue
            empty = 0
            given += 1
            yield batch
            if want is not None and given >= want:
                return


def _split_element(element) -> Batch:
    if isinstance(element, (tuple, list)) and len(element) == 2:
        features, labels = element
    elif isinstance(element, (tuple, list)) and len(element) == 3:  # (x, y, sample_weight), as Keras takes it
        features, labels = element[0], SampleWeighted(element[1], element[2])
    else:
        features, labels = element, None
    if isinstance(features, dict):
        features = list(features.values())
    features = list(features) if isinstance(features, (tuple, list)) else [features]
    return features, labels


class TFDataRankData(RankData):
    """A rank's ``tf.data`` input: the dataset itself (each rank builds its shard). The ranks agree on the
    largest count of batches, or on ``steps_per_epoch``."""

    counts_rows = False

    def __init__(self, data: TFDataDataset, validation: Shipped | None = None):
        self.data, self.validation = data, validation

    def open(self, rows: Iterable, rank: int, size: int, env: RankEnv) -> Opened:
        for _ in rows:  # the placeholder partition carries nothing
            pass
        return Opened(self.data, self.open_validation())

    def count(self, opened: Opened, rank: int, size: int) -> int:
        n = opened.train.num_batches(0, rank=rank, size=size)
        return -1 if n is None else int(n)

    def steps(self, counts: list[int], per_rank_batch: int) -> int:
        if min(counts) < 0:
            raise DataError("The tf.data input of some rank has an unknown number of batches; pass steps_per_epoch=N "
                            "to optimize().")
        return max(counts)

    def evaluate(self, rows: Iterable, partition: int, size: int):
        for _ in rows:
            pass
        return self.data, partition, size


def _collected(val: TFDataDataset, limit: int) -> ArrayDataset:
    parts, total = [], 0
    for element in val.dataset(0, 1).as_numpy_iterator():
        total += sum(int(np.asarray(a).nbytes) for a in tf.nest.flatten(element))
        if total > limit:
            raise TypeError(
                f"The tf.data.Dataset given as distributed validation_data holds more than {limit / 2**20:.0f} MiB, "
                "too much to collect to the driver and send to every rank. Give TFDataset.from_tf_data(fn) instead, "
                "with fn(rank, size) building each rank's shard of it (for example from files every host reads), or "
                "a DataFrame.")
        parts.append(element)
    if not parts:
        raise TypeError("The tf.data.Dataset given as distributed validation_data is empty.")
    joined = tf.nest.map_structure(lambda *xs: np.concatenate(xs, axis=0), *parts)
    return ArrayDataset.from_tensors(tuple(joined) if isinstance(joined, (tuple, list)) else joined)
