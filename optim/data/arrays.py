"""In-memory arrays (``TFDataset.from_ndarrays``, numpy data given to ``optimize``), and a Spark partition
read whole into arrays on a rank. Both sides: the driver checks them and ships them with the job (over a
placeholder stage, each rank taking every ``size``-th row); a rank batches its share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from optim.carriers import Carrier
from optim.data.base import Batch, DataAdapter, Staged
from optim.data.checks import Feed, array_type, check_feeds
from optim.data.shards import held_shards, joined
from optim.data.values import check_label_types, check_labels, finite_rows_only
from optim.errors import DataError
from optim.losses import SampleWeighted
from optim.shares import Opened, RankData, RankEnv

__all__ = ["ArrayDataset", "array_feeds", "label_type"]


def _weights(w) -> np.ndarray:
    """One weight per example (an array of ``n``), or, given as a list of such arrays, one per output: ``(n,
    outputs)``, as Keras's ``fit`` takes a list or a dict of them for a model of several outputs."""
    if isinstance(w, (list, tuple)):
        return np.stack([_weights(one) for one in w], axis=1) if len(w) > 1 else _weights(w[0])
    w = np.asarray(w, np.float32)
    if w.ndim > 2 or (w.ndim == 2 and w.shape[1] != 1) or not np.isfinite(w).all() or (w < 0).any():
        raise DataError(f"Sample weights must be one finite, non-negative number per example. Received: an array of "
                        f"shape {w.shape}" + (" with negative or non-finite values" if w.ndim <= 2 else ""))
    return w.reshape(-1)


def _per_example_or_output(w: np.ndarray) -> np.ndarray:
    return w if w.ndim == 2 and w.shape[1] > 1 else w.reshape(-1)


def _as_list(x) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)):
        return [np.asarray(a) for a in x]
    if isinstance(x, dict):
        raise DataError("Pass features as an array or a list in the model's input order, not a dict.")
    return [np.asarray(x)]


class ArrayDataset(DataAdapter):
    """In-memory arrays: ``TFDataset.from_ndarrays``, and a partition read whole on a rank."""

    road = "numpy arrays"
    holds_out = "driver"

    def __init__(self, features: Sequence[np.ndarray], labels: Sequence[np.ndarray] | None,
                 single_label: bool = True, batch_size: int | None = None, presharded: bool = False,
                 augment: Callable | None = None, weights: np.ndarray | None = None):
        self.presharded = presharded  # the rows are this rank's already (a Spark partition)
        self.augment = augment  # fn(features, rng) -> features, for training batches only
        # one per example, or a column per output (n, outputs)
        self.weights = None if weights is None else _per_example_or_output(np.asarray(weights, np.float32))
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

    def rows_on(self, rank: int, size: int) -> int:
        """The rows rank ``rank`` of ``size`` trains on."""
        return len(self.shard_indices(rank, size))

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

    @property
    def gives_shards(self) -> bool:
        """Whether :meth:`shard_batches` can give other ranks' shards: the arrays are whole here."""
        return not self.presharded

    def shard_batches(self, batch_size, *, shards, rank, size, **kwargs) -> Iterator[Batch]:
        """Rank ``rank`` of ``size``'s batches of an epoch that ``shards`` ranks began (an epoch resumed on fewer
        ranks: :mod:`optim.data.virtual_shards`): the batches of each shard it takes, as that shard's rank would have
        trained on them, put together. Arrays every rank holds whole only (a partition's rows hold one shard)."""
        if self.presharded:
            raise ValueError("A partition's rows are one rank's shard; another rank's shard is not here.")
        held = held_shards(shards, rank, size)
        per_shard = batch_size // len(held)
        return joined([self.batches(per_shard, rank=v, size=shards, **kwargs) for v in held])

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
        if self.weights is None:
            return feats, labels
        w = self.weights[take]
        return feats, SampleWeighted(labels, w if w.ndim == 1 else [np.ascontiguousarray(c) for c in w.T])


    # ------------------------------------------------------------ the driver's side

    def feeds(self) -> list[Feed]:
        """What feeds each input: ``features`` (or ``features[i]``), its type and per-row shape."""
        return array_feeds(self.features, "features")

    def bind(self, input_names, input_specs, output_names=None) -> None:
        check_feeds(self.feeds(), list(input_names), list(input_specs))

    def label_kinds(self) -> list[tuple[str, str]]:
        """``(name, type)`` of each label array (``labels``, or ``labels[i]``), for the checks against the loss."""
        names = ["labels"] if len(self.labels or []) == 1 else [f"labels[{i}]" for i in range(len(self.labels or []))]
        return [(n, label_type(a)) for n, a in zip(names, self.labels or [])]

    def checked(self, loss, net, on_nonfinite: str, where: str, training: bool = True) -> ArrayDataset:
        """Labels against the loss (their type, then their values: class ids in range) and NaN or Inf
        features (an error naming the row, or the rows left out with ``on_nonfinite="skip"``)."""
        if self.labels is None:
            return finite_rows_only(self, on_nonfinite, where)
        check_label_types(self.label_kinds(), loss, net, where)
        check_labels(self.labels[0] if self.single_label else self.labels, loss, net, where)
        return finite_rows_only(self, on_nonfinite, where)

    def stage(self, host, n, per_rank, *, cleanup, validation=None, timeout_s=600.0) -> Staged:
        if len(self) < n:
            raise ValueError(f"The training data has {len(self)} rows, fewer than the {n} workers.")
        return Staged(ArrayRankData(host.ship(self, cleanup), _validation(host, validation, cleanup)),
                      frame=host.placeholder(n))

    def for_ranks(self, host, cleanup) -> Carrier:
        return host.ship(self, cleanup)

    def hold_out(self, holdout):
        """The rows ``holdout`` keeps for validation, split off here: ``(training rows, validation rows)``."""
        held = holdout.mask(list(self.features) + list(self.labels or []))
        return self.subset(np.flatnonzero(~held)), self.subset(np.flatnonzero(held))

    def carried_bytes(self) -> int:
        return sum(int(np.asarray(a).nbytes) for a in list(self.features) + list(self.labels or []))


def _validation(host, validation, cleanup) -> Carrier | None:
    return None if validation is None else validation.for_ranks(host, cleanup)


def array_feeds(arrays: Sequence[np.ndarray], what: str) -> list[Feed]:
    """A :class:`~optim.data.checks.Feed` per array: named ``what`` (one array) or ``what[i]``."""
    names = [what] if len(arrays) == 1 else [f"{what}[{i}]" for i in range(len(arrays))]
    out = []
    for n, a in zip(names, arrays):
        kind = array_type(a)
        # encoded images: their per-row shape is what they decode to, unknown here
        shape = None if kind == "binary" else tuple(int(d) for d in a.shape[1:])
        out.append(Feed(n, kind, shape, declared=shape is not None))
    return out


def label_type(labels: np.ndarray) -> str:
    """A label array's type in Spark's words; a column of one value per row (shape ``(n, 1)``) counts as a
    scalar, as Keras's losses take it."""
    a = np.asarray(labels)
    return array_type(a[:, 0] if a.ndim == 2 and a.shape[1] == 1 else a)


class ArrayRankData(RankData):
    """A rank's share of arrays shipped with the job: every ``size``-th row from ``rank`` (the driver checked
    them)."""

    def __init__(self, data: Carrier, validation: Carrier | None = None):
        self.data, self.validation = data, validation

    def open(self, rows: Iterable, rank: int, size: int, env: RankEnv) -> Opened:
        for _ in rows:  # the placeholder partition carries nothing
            pass
        return Opened(self.data.read(), self.open_validation())
