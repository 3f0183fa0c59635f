"""Training and evaluation data for TFOptimizer.

A :class:`TFDataset` gives each worker (rank) its batches for an epoch. Local forms:

* ``TFDataset.from_ndarrays((features, labels))``: numpy arrays (features may be a list/tuple for
  several inputs); shuffled per epoch with a seeded generator, so a seed fixes the order;
* ``TFDataset.from_tf_data(dataset_or_fn)``: a ``tf.data.Dataset`` of ``(features, labels)``
  *batches* (as Keras ``fit`` takes it), or a function ``fn(rank, size) -> dataset`` building each
  rank's input (for example, TFRecord shards read by each worker).

The distributed forms (``from_dataframe``, ``from_rdd``, ``from_parquet``) live in ``optim.spark.datasets``, which
subclasses :class:`TFDataset` and :class:`ArrayDataset` from here. The factories import that module
when they are called (:func:`_spark_datasets`), on purpose: a module-level import would be a cycle
(each module needing the other to finish first), and this module, which the local loop and every
rank import, stays free of the ``optim.spark`` package (tests/optim/test_imports.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from optim.errors import DataError
from optim.losses import SampleWeighted

__all__ = ["TFDataset", "ArrayDataset", "TFDataDataset", "as_dataset"]

Batch = tuple[list, Any]



class TFDataset:
    """Base class and factory. Subclasses implement :meth:`batches` and :meth:`num_batches`."""

    has_labels: bool = True

    @staticmethod
    def from_ndarrays(tensors, batch_size: int | None = None) -> ArrayDataset:
        """``tensors`` is ``(features, labels)`` or ``features`` alone (for prediction); features
        and labels are arrays or lists/tuples of arrays, all with the same first dimension."""
        return ArrayDataset.from_tensors(tensors, batch_size)

    @staticmethod
    def from_tf_data(dataset_or_fn) -> TFDataDataset:
        """A batched ``tf.data.Dataset``, or ``fn(rank, size) -> tf.data.Dataset``."""
        return TFDataDataset(dataset_or_fn)

    @staticmethod
    def from_dataframe(df, feature_cols, label_cols=None, feature_shapes=None, batch_size: int | None = None,
                       augment=None, weight_col: str | None = None, *, streaming: bool = True,
                       shuffle_buffer: int = 2048, prefetch: int = 2, local_dir: str | None = None):
        """A Spark DataFrame; see :class:`optim.spark.datasets.DataFrameDataset`. ``batch_size``, as
        Analytics Zoo's TFDataset took it, is the global batch ``optimize`` uses by default;
        ``augment`` runs on the ranks, on training batches only; ``weight_col`` names a column of
        sample weights (default: none). With ``streaming`` (the default) each
        rank keeps its partition on local disk, still encoded, and decodes it a batch at a time, so its
        memory does not grow with its rows; ``streaming=False`` decodes the whole partition into memory
        first. ``shuffle_buffer`` (rows of a shuffle window, default 2048) and ``prefetch`` (decoded
        batches made ahead of the step, default 2) set a streaming rank's memory with the batch;
        ``local_dir`` is where the local copies go (default: Spark's local dir)."""
        return _spark_datasets().DataFrameDataset(df, feature_cols, label_cols, feature_shapes, batch_size, augment,
                                                  weight_col, streaming=streaming, shuffle_buffer=shuffle_buffer,
                                                  prefetch=prefetch, local_dir=local_dir)

    @staticmethod
    def from_parquet(path, feature_cols, label_cols=None, feature_shapes=None, storage_options=None,
                     batch_size: int | None = None, augment=None, *, shuffle_buffer: int = 2048, prefetch: int = 2):
        """Parquet files (a file or a folder, a local path or any fsspec URI such as ``s3://``), each rank
        reading its share of the rows straight from the files, with no Spark job for the data; see
        :class:`optim.spark.parquet.ParquetDataset`. The arguments are those of :meth:`from_dataframe`;
        ``storage_options`` are fsspec's (endpoint, credentials)."""
        return _spark_datasets().ParquetDataset(path, feature_cols, label_cols, feature_shapes, storage_options,
                                                batch_size, augment, shuffle_buffer=shuffle_buffer, prefetch=prefetch)

    @staticmethod
    def from_rdd(rdd, batch_size: int | None = None):
        """A Spark RDD of ``(features, label)`` records; see :class:`optim.spark.datasets.RDDDataset`."""
        return _spark_datasets().RDDDataset(rdd, batch_size)

    def batches(self, batch_size: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                skip: int = 0, rank: int = 0, size: int = 1) -> Iterator[Batch]:
        raise NotImplementedError  # pragma: no cover

    def num_batches(self, batch_size: int, *, rank: int = 0, size: int = 1) -> int | None:
        """Batches per epoch for this rank, or None when unknown in advance."""
        raise NotImplementedError  # pragma: no cover


def _spark_datasets():
    """:mod:`optim.spark.datasets`, imported when a DataFrame or RDD is wrapped. Deliberately not at
    module level: it subclasses the classes defined here (so the import would be a cycle), and the
    local loop and the ranks import this module without needing the ``optim.spark`` package."""
    from optim.spark import datasets

    return datasets


def _weights(w) -> np.ndarray:
    w = np.asarray(w, np.float32)
    if w.ndim > 2 or (w.ndim == 2 and w.shape[1] != 1) or not np.isfinite(w).all() or (w < 0).any():
        raise DataError(f"Sample weights must be one finite, non-negative number per example. Received: an array of "
                        f"shape {w.shape}" + (" with negative or non-finite values" if w.ndim <= 2 else ""))
    return w.reshape(-1)


def _as_list(x) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)):
        return [np.asarray(a) for a in x]
    if isinstance(x, dict):
        raise DataError("Pass features as an array or a list in the model's input order, not a dict.")
    return [np.asarray(x)]


class ArrayDataset(TFDataset):
    """In-memory arrays."""

    def __init__(self, features: Sequence[np.ndarray], labels: Sequence[np.ndarray] | None,
                 single_label: bool = True, batch_size: int | None = None, presharded: bool = False,
                 augment: Callable | None = None, weights: np.ndarray | None = None):
        self.presharded = presharded  # the rows are this rank's already (a Spark partition)
        self.augment = augment  # fn(features, rng) -> features, for training batches only
        self.weights = None if weights is None else np.asarray(weights, np.float32).reshape(-1)  # one per example
        self.features = list(features)
        self.labels = None if labels is None else list(labels)
        self.single_label = single_label
        self.batch_size = batch_size
        self.has_labels = labels is not None
        sizes = {len(a) for a in self.features + (self.labels or []) + ([self.weights] if self.weights is not None else [])}
        if any(a.ndim == 0 for a in self.features + (self.labels or [])):
            raise DataError("Every feature and label array needs a first (example) dimension; received a scalar.")
        if len(sizes) != 1:
            raise DataError(
                f"Features and labels must have the same number of examples; received lengths "
                f"{[len(a) for a in self.features]} (features) and {[len(a) for a in self.labels or []]} (labels)."
            )
        self.n = sizes.pop()

    @classmethod
    def from_tensors(cls, tensors, batch_size=None) -> ArrayDataset:
        """A 2-tuple is ``(features, labels)``; an array or a list of arrays is features only."""
        if isinstance(tensors, tuple) and len(tensors) == 3:  # (features, labels, sample weights), as Keras takes
            features, labels, weights = tensors
            single = not isinstance(labels, (list, tuple))
            return cls(_as_list(features), _as_list(labels), single, batch_size, weights=_weights(weights))
        if isinstance(tensors, tuple) and len(tensors) == 2:
            features, labels = tensors
            single = not isinstance(labels, (list, tuple))
            return cls(_as_list(features), _as_list(labels), single, batch_size)
        return cls(_as_list(tensors), None, True, batch_size)

    def __len__(self) -> int:
        return self.n

    def subset(self, rows: np.ndarray) -> ArrayDataset:
        """These rows only (features, labels and weights alike)."""
        return ArrayDataset([a[rows] for a in self.features], None if self.labels is None else [a[rows] for a in self.labels],
                            self.single_label, self.batch_size, self.presharded, self.augment,
                            None if self.weights is None else self.weights[rows])

    def shard_indices(self, rank: int, size: int) -> np.ndarray:
        if self.presharded:
            return np.arange(self.n)
        return np.arange(rank, self.n, size)

    def num_batches(self, batch_size, *, rank=0, size=1, drop_remainder=False) -> int:
        n = len(self.shard_indices(rank, size))
        return n // batch_size if drop_remainder else -(-n // batch_size)

    def batches(self, batch_size, *, epoch=0, seed=0, shuffle=True, skip=0, rank=0, size=1,
                drop_remainder=False, steps=None, training=False) -> Iterator[Batch]:
        """This rank's batches for one epoch, shuffled with ``[seed, epoch, rank]``.

        With ``steps``, exactly that many full batches: a shard that runs out of rows continues
        with a fresh shuffle of its rows (the distributed equal-steps rule). With ``training`` and
        an ``augment`` function, each batch's features go through it (seeded by ``[seed, epoch,
        rank, batch]``)."""
        idx = self.shard_indices(rank, size)
        if steps is not None:
            batches = self._fixed_steps(idx, batch_size, steps, epoch, seed, shuffle, skip, rank)
        else:
            if shuffle:
                rng = np.random.default_rng([seed, epoch, rank])
                idx = idx[rng.permutation(len(idx))]
            stop = (len(idx) // batch_size) * batch_size if drop_remainder else len(idx)
            batches = (self._take(idx[start:start + batch_size]) for start in range(skip * batch_size, stop, batch_size))
        if not (training and self.augment is not None):
            yield from batches
            return
        for b, (features, labels) in enumerate(batches, start=skip):
            yield self.augment(features, np.random.default_rng([seed, epoch, rank, b, 7])), labels

    def _fixed_steps(self, idx, batch_size, steps, epoch, seed, shuffle, skip, rank):
        if len(idx) == 0:
            raise DataError(f"Rank {rank} has no rows to train on.")
        need = steps * batch_size
        passes = []
        for p in range(-(-need // len(idx))):
            order = idx
            if shuffle:
                order = idx[np.random.default_rng([seed, epoch, rank, p]).permutation(len(idx))]
            passes.append(order)
        order = np.concatenate(passes)[:need]
        for b in range(skip, steps):
            yield self._take(order[b * batch_size:(b + 1) * batch_size])

    def _take(self, take) -> Batch:
        feats = [a[take] for a in self.features]
        if self.labels is None:
            return feats, None
        labels = [a[take] for a in self.labels]
        labels = labels[0] if self.single_label else labels
        return feats, labels if self.weights is None else SampleWeighted(labels, self.weights[take])


class TFDataDataset(TFDataset):
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

    def checked(self, policy: str, where: str, per_epoch: bool = True) -> TFDataDataset:
        """A copy of this dataset whose batches are checked for NaN or Inf features (``policy``
        "raise" or "skip"); the original is left as it was. ``where`` names the data in messages,
        and ``per_epoch`` (training data) adds the epoch to the batch number. Batches count from
        1, as the progress bar does; rows within a batch from 0, as numpy indexes them."""
        import copy

        out = copy.copy(self)
        out.on_nonfinite, out.nonfinite_where, out.nonfinite_per_epoch = policy, where, per_epoch
        return out

    def batches(self, batch_size, *, epoch=0, seed=0, shuffle=True, skip=0, rank=0, size=1,
                drop_remainder=False, steps=None) -> Iterator[Batch]:
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
        from optim.errors import NonFiniteInputError
        from optim.training.checks import finite_batch

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


DEFAULT_BATCH_SIZE = 32


def in_input_order(features: dict, input_names: list[str]) -> list:
    """Features given as a dict by input name (with or without ``:0``), as a list in input order.

    Raises:
        DataError: a key that names no input, or an input without an array.
    """
    by_input = {}
    for key, value in features.items():
        full = key if ":" in str(key) else f"{key}:0"
        if full not in input_names:
            raise DataError(f"The features name input {key!r}, which the net does not have. Inputs: {input_names}")
        by_input[full] = value
    missing = [n for n in input_names if n not in by_input]
    if missing:
        raise DataError(f"The features dict has no array for the net's inputs {missing}. Inputs: {input_names}")
    return [by_input[n] for n in input_names]


def resolve_batch_size(dataset: TFDataset, batch_size: int | None) -> int:
    """The batch size to use: the one given, else the one the TFDataset was made with, else 32.

    Raises:
        ValueError: both are given and differ.
    """
    own = getattr(dataset, "batch_size", None)
    if batch_size is not None and own is not None and int(batch_size) != int(own):
        raise ValueError(
            f"The TFDataset was made with batch_size={own}, and batch_size={batch_size} was given too; pass only one "
            "(they are the same setting)."
        )
    return int(batch_size if batch_size is not None else own if own is not None else DEFAULT_BATCH_SIZE)


def as_dataset(data, batch_size: int | None = None, *, need_labels: bool = True) -> TFDataset:
    """Turns what ``optimize`` / ``evaluate`` / ``predict`` accept into a TFDataset."""
    if isinstance(data, TFDataset):
        ds = data
    elif isinstance(data, tf.data.Dataset):
        ds = TFDataDataset(data)
    elif isinstance(data, (tuple, list, np.ndarray)):
        ds = ArrayDataset.from_tensors(data, batch_size)
    else:
        raise TypeError(
            "Data must be a tuple of numpy arrays (features, labels), a tf.data.Dataset, or a "
            f"TFDataset. Received: {type(data).__name__}"
        )
    if need_labels and not ds.has_labels:
        raise DataError("Training and evaluation need labels: pass (features, labels).")
    return ds
