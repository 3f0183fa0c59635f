"""A ``tf.data`` input (``TFDataset.from_tf_data``): a batched ``tf.data.Dataset``, or a function building each
rank's. Both sides: on Spark it goes with the job (over a placeholder stage) and each rank builds its shard; a
dataset given travels as its serialized graph (:meth:`TFDataDataset.portable`) and is sharded on the rank.

The driver's checks read the dataset's ``element_spec`` (no element is read): its features against the net's inputs
and its labels' types against the loss, as numpy arrays of those dtypes and per-row shapes would be checked
(:mod:`optim.data.checks`), with the same errors. A function's dataset exists only where it is called: its
``element_spec`` is checked there, when it is built (on each rank, or here for a run in this process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from optim.carriers import Carrier, InPlan
from optim.data.arrays import ArrayDataset
from optim.data.base import Batch, DataAdapter, Staged
from optim.data.checks import Feed, array_type, check_feeds
from optim.data.names import in_input_order, in_output_order, weights_in_output_order
from optim.data.values import check_label_types, finite_batch
from optim.errors import DataError, NonFiniteInputError
from optim.losses import SampleWeighted
from optim.shares import Opened, RankData, RankEnv

__all__ = ["TFDataDataset"]


class TFDataDataset(DataAdapter):
    """A batched ``tf.data.Dataset`` of ``(features, labels)``, or ``fn(rank, size)`` building one.

    A plain dataset is sharded across ranks with ``Dataset.shard(size, rank)``; a function builds
    its own shard. Shuffle inside the dataset (with a seed, for reproducible runs). On resume,
    the batches already seen in the current epoch are skipped with ``Dataset.skip``.

    ``optimize`` checks each batch for NaN or Inf features as it is read, on whichever process
    reads it (:meth:`checked`, :func:`optim.data.values.finite_batch`): a NonFiniteInputError
    that names the batch, the row in it and the rank, or, with ``on_nonfinite="skip"``, the batch
    without those rows. A batch left with no rows is not a step: the next batch takes its place
    (with the equal-steps rule of distributed training, from the rank's repeated input), so every
    rank still takes the same number of steps.
    """

    #: NaN and Inf checks of each batch: None (none; evaluate and predict), "raise" or "skip"
    on_nonfinite: str | None = None
    road = "a tf.data input"
    #: what the data is called in a check's message ("the training data")
    nonfinite_where: str = "the data"
    #: the net's ``(input names, input specs)`` once bound; a function's dataset is checked against them when built
    bound_inputs: tuple | None = None
    #: the net's output names once bound: a dict of labels is read in their order
    bound_outputs: list | None = None
    #: ``(loss, output names, where)`` once checked; a function's dataset's labels are checked with them when built
    bound_labels: tuple | None = None
    nonfinite_per_epoch: bool = True
    #: wholly non-finite batches in a row after which a repeated input is taken as all bad
    MAX_EMPTY_BATCHES = 1000

    def __init__(self, dataset_or_fn):
        #: the ``tf.data.Dataset`` given (None: a function, which builds each rank's)
        self.given = dataset_or_fn if isinstance(dataset_or_fn, tf.data.Dataset) else None
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

    # ------------------------------------------------------------ to the ranks

    def __getstate__(self) -> dict:
        """What goes to the ranks: a dataset given travels as its serialized graph (``tf.data``'s own, with its
        in-memory tensors), rebuilt on the rank and sharded there; a function travels as itself.

        Raises:
            TypeError: a dataset whose graph cannot be serialized (one from a Python generator or a
                ``tf.py_function``): :meth:`portable` says so before any job.
        """
        state = dict(self.__dict__)
        if self.given is not None:
            state["given"] = (self.portable(), self.given.element_spec)
            state.pop("_fn", None)
        return state

    def __copy__(self) -> TFDataDataset:  # a copy here holds the same dataset; only pickling serializes it
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        return out

    def __setstate__(self, state: dict) -> None:
        given = state.pop("given")
        self.__dict__.update(state)
        self.given = None
        if given is not None:
            graph, spec = given
            self.given = tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=graph), spec)
            self._fn = lambda rank, size, ds=self.given: ds if size == 1 else ds.shard(size, rank)

    def portable(self) -> bytes:
        """The given dataset's serialized graph, as it goes to the ranks.

        Raises:
            TypeError: the graph holds state that cannot travel (a Python generator, a ``tf.py_function``); the
                message says to pass ``from_tf_data(fn)`` instead.
        """
        try:
            graph = self.given._as_serialized_graph(  # tf.data's own serialization (tf.distribute's, too)
                external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL)
        except (tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError) as exc:
            reason = str(exc).split("Failed to serialize the input pipeline graph:")[-1].split("[Op:")[0].strip()
            raise TypeError(
                f"This tf.data.Dataset cannot go to the Spark ranks: its pipeline holds state that stays in this "
                f"process ({reason}; a Python generator or a tf.py_function). Pass TFDataset.from_tf_data(fn) with "
                "fn(rank, size) building each rank's dataset there, or numpy arrays.") from None
        return graph.numpy()

    def dataset(self, rank: int = 0, size: int = 1) -> tf.data.Dataset:
        ds = self._fn(rank, size)
        if not isinstance(ds, tf.data.Dataset):
            raise DataError(f"The function given to from_tf_data must return a tf.data.Dataset; it returned {type(ds).__name__}.")
        if self.given is None:  # a function's dataset: checked as it is built
            self._check_spec(ds.element_spec)
        return ds

    def num_batches(self, batch_size, *, rank=0, size=1, drop_remainder=False):
        n = int(self.dataset(rank, size).cardinality())
        return n if n >= 0 else None

    def bind(self, input_names, input_specs, output_names=None) -> None:
        """The features of the ``element_spec`` against the net's inputs (here for a dataset given; for a function,
        where it builds one); an element's dicts are read by the inputs' and the outputs' names from then on."""
        self.bound_inputs = (list(input_names), list(input_specs))
        self.bound_outputs = None if output_names is None else list(output_names)
        if self.given is not None:
            self._check_spec(self.given.element_spec)

    def checked(self, loss, net, on_nonfinite: str, where: str, training: bool = True) -> TFDataDataset:
        """A copy of this dataset whose labels' types are checked against the loss from the ``element_spec`` (here
        for a dataset given; for a function, where it builds one), and whose batches are checked for NaN or Inf
        features (``on_nonfinite`` "raise" or "skip") as they are read; the original is left as it was. ``where``
        names the data in messages, and ``training`` adds the epoch to the batch number. Batches count from 1, as
        the progress bar does; rows within a batch from 0, as numpy indexes them."""
        import copy

        out = copy.copy(self)
        out.on_nonfinite, out.nonfinite_where, out.nonfinite_per_epoch = on_nonfinite, where, training
        if net is not None and loss is not None:
            out.bound_labels = (loss, _Outputs(list(net.output_names)), where)
            if out.given is not None:
                out._check_spec(out.given.element_spec)
        return out

    def _check_spec(self, element_spec) -> None:
        """The checks :meth:`bind` and :meth:`checked` arranged, on an ``element_spec``."""
        features, labels = self.split(element_spec)
        if self.bound_inputs is not None:
            check_feeds(spec_feeds(features, "features"), *self.bound_inputs)
        if self.bound_labels is not None and labels is not None:
            loss, outputs, where = self.bound_labels
            labels = labels.labels if isinstance(labels, SampleWeighted) else labels
            parts = list(labels.values()) if isinstance(labels, dict) else list(labels) if isinstance(
                labels, (tuple, list)) else [labels]
            names = ["labels"] if len(parts) == 1 else [f"labels[{i}]" for i in range(len(parts))]
            check_label_types([(n, spec_type(p, label=True)) for n, p in zip(names, parts)], loss, outputs, where)

    # ------------------------------------------------------------ over Spark

    def stage(self, host, n, per_rank, *, cleanup, validation=None, timeout_s=600.0) -> Staged:
        if self.given is not None:  # a pipeline that cannot travel, or too large to: said here, before any job
            graph, limit = self.portable(), host.validation_limit()
            if len(graph) > limit:
                raise TypeError(
                    f"The tf.data.Dataset given holds more than {limit / 2**20:.0f} MiB in its graph (its in-memory "
                    "tensors), too much to send to every rank. Give TFDataset.from_tf_data(fn) instead, with fn(rank, "
                    "size) building each rank's shard of it (for example from files every host reads), or a DataFrame.")
        shipped = None if validation is None else validation.for_ranks(host, cleanup)
        return Staged(TFDataRankData(self, shipped), frame=host.placeholder(n))

    def for_ranks(self, host, cleanup) -> Carrier:
        """Itself when it can be pickled (``from_tf_data(fn)``: each rank builds its shard); a
        ``tf.data.Dataset`` object is collected here to numpy arrays of at most
        ``host.validation_limit()`` bytes and shipped as those (every rank validates on its share of them).

        Raises:
            TypeError: the collected arrays would exceed the limit; the message says how to use
                ``TFDataset.from_tf_data(fn)`` instead.
        """
        import cloudpickle

        if self.given is None:
            try:
                cloudpickle.dumps(self)
                return InPlan(self)
            except Exception:  # noqa: BLE001 - a function that cannot be pickled: collect its dataset instead
                pass
        return _collected(self, host.validation_limit()).for_ranks(host, cleanup)

    def evaluation(self, host, partitions) -> Staged:
        if self.given is not None:
            self.portable()
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
                yield self.split(element)
            return
        yield from self._checked_batches(ds, None if steps is None else steps - skip, epoch, skip, rank, size)

    def split(self, element) -> Batch:
        """:func:`_split_element` in the bound net's input and output order."""
        inputs = self.bound_inputs[0] if self.bound_inputs is not None else None
        return _split_element(element, inputs, self.bound_outputs)

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
            batch = finite_batch(*self.split(element), self.on_nonfinite, where)
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


class _Outputs(NamedTuple):
    """What the label checks read of the net (picklable: it goes with a function's dataset to the ranks)."""

    output_names: list


def spec_type(spec, label: bool = False) -> str:
    """A ``tf.TensorSpec`` of batches in Spark's words, as :func:`optim.data.checks.array_type` names numpy arrays
    of the same dtype and per-row shape (a label of one value per row, ``(None, 1)``, as a scalar:
    :func:`optim.data.arrays.label_type`).

    >>> spec_type(tf.TensorSpec((None, 8, 8), tf.float32))
    'array<array<float>>'
    """
    dtype = tf.dtypes.as_dtype(spec.dtype)
    if dtype == tf.string:
        base = "string"
    elif dtype.is_floating:
        base = "double" if dtype == tf.float64 else "float"
    else:
        base = array_type(np.zeros((0,), dtype.as_numpy_dtype))
    row = _row_shape(spec)
    depth = 0 if row is None or (label and row == (1,)) else len(row)
    for _ in range(depth):
        base = f"array<{base}>"
    return base


def _row_shape(spec) -> tuple | None:
    """A batched spec's per-row shape (its unknown dimensions None), or None where its rank is unknown."""
    shape = tf.TensorShape(spec.shape)
    if shape.rank is None or shape.rank == 0:
        return None
    return tuple(shape.as_list()[1:])


def spec_feeds(specs: list, what: str) -> list[Feed]:
    """A :class:`~optim.data.checks.Feed` per ``tf.TensorSpec`` of batched features: named ``what`` (one) or
    ``what[i]``, as :func:`optim.data.arrays.array_feeds` names numpy arrays."""
    names = [what] if len(specs) == 1 else [f"{what}[{i}]" for i in range(len(specs))]
    return [Feed(n, spec_type(s), _row_shape(s), declared=_row_shape(s) is not None) for n, s in zip(names, specs)]


def _split_element(element, inputs: list | None = None, outputs: list | None = None) -> Batch:
    """``(features, labels)`` of one element (or its spec): features given as a dict by input name in ``inputs``'
    order, labels given as a dict by output name in ``outputs``' order, as Keras's ``fit`` reads a dataset's dicts
    (without names, a dict in its own order)."""
    if isinstance(element, (tuple, list)) and len(element) == 2:
        features, labels = element
    elif isinstance(element, (tuple, list)) and len(element) == 3:  # (x, y, sample_weight), as Keras takes it
        features, labels = element[0], SampleWeighted(element[1], element[2])
    else:
        features, labels = element, None
    if isinstance(features, dict):
        features = in_input_order(features, inputs) if inputs else list(features.values())
    features = list(features) if isinstance(features, (tuple, list)) else [features]
    if outputs:
        weighted = isinstance(labels, SampleWeighted)
        by_name, weights = (labels.labels, labels.weights) if weighted else (labels, None)
        if isinstance(by_name, dict):
            by_name = in_output_order(by_name, outputs)
        if isinstance(weights, dict):  # each output's own, as fit takes them
            weights = weights_in_output_order(weights, outputs)
        labels = SampleWeighted(by_name, weights) if weighted else by_name
    return features, labels


class TFDataRankData(RankData):
    """A rank's ``tf.data`` input: the dataset itself (each rank builds its shard). The ranks agree on the
    largest count of batches, or on ``steps_per_epoch``."""

    counts_rows = False

    def __init__(self, data: TFDataDataset, validation: Carrier | None = None):
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
        parts.append(val.split(element))  # dicts by input or output name in the net's order
    if not parts:
        raise TypeError("The tf.data.Dataset given as distributed validation_data is empty.")
    features = [np.concatenate(xs, axis=0) for xs in zip(*(f for f, _ in parts))]
    labels = [y for _, y in parts]
    if labels[0] is None:
        return ArrayDataset.from_tensors(features)
    weights = None
    if isinstance(labels[0], SampleWeighted):  # one array, or one per output
        weights = tf.nest.map_structure(lambda *ws: np.concatenate([np.asarray(w) for w in ws], axis=0),
                                        *[y.weights for y in labels])
        labels = [y.labels for y in labels]
    joined = tf.nest.map_structure(lambda *xs: np.concatenate(xs, axis=0), *labels)
    return ArrayDataset.from_tensors((features, joined) if weights is None else (features, joined, weights))
