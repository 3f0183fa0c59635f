"""Distributed training data: a Spark DataFrame or RDD, one shard per rank. Driver side.

Each object describes how a rank turns its partition into arrays (:mod:`optim.training.shard` does
it in the worker, through the one Arrow reader :mod:`optim.arrow`). Rows are balanced across ranks
before training when partitions are uneven or empty (see
:func:`optim.spark.driver.launcher.balance_dataframe`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from optim.errors import ColumnError
from optim.spark.vectors import vectors_as_arrays
from optim.training.datasets import ArrayDataset, TFDataset
from optim.training.shard import TensorColumns, arrow_to_arrays, records_to_arrays
from tfnet.errors import closest_names


def _shapes_by_column(cols, shapes) -> dict:
    """``feature_shapes`` as ``{column: shape}``: given as a dict, or as a list of shapes in the
    order of ``feature_cols`` (None for a column that needs none)."""
    if shapes is None:
        return {}
    if isinstance(shapes, Mapping):
        return dict(shapes)
    names = [cols] if isinstance(cols, str) else list(cols or [])
    if isinstance(shapes, (list, tuple)) and len(shapes) == len(names) and all(
        s is None or (isinstance(s, (list, tuple)) and all(isinstance(d, (int, np.integer)) for d in s)) for s in shapes
    ):
        return {n: s for n, s in zip(names, shapes) if isinstance(n, str) and s is not None}
    raise TypeError(
        "`feature_shapes` must be a dict {column: per-row shape} or a list of per-row shapes in the order of "
        f"`feature_cols` ({len(names)} of them, e.g. [(8, 8, 1)]). Received: feature_shapes={shapes!r}"
    )


def _specs(cols, shapes: Mapping[str, Sequence[int]] | None, what: str) -> list[TensorColumns]:
    if cols is None:
        return []
    if isinstance(cols, str):
        cols = [cols]
    shapes = dict(shapes or {})
    out = []
    for entry in cols:
        if isinstance(entry, str):
            shape = shapes.get(entry)
            out.append(TensorColumns((entry,), tuple(int(d) for d in shape) if shape is not None else None))
        elif isinstance(entry, (list, tuple)) and entry and all(isinstance(c, str) for c in entry):
            out.append(TensorColumns(tuple(entry), (len(entry),)))
        else:
            raise TypeError(
                f"`{what}` entries are column names, or lists of scalar column names to stack into one "
                f"tensor. Received: {entry!r}"
            )
    return out


def _through(spec: TensorColumns, mapping: dict[str, str]) -> TensorColumns:
    import dataclasses

    return dataclasses.replace(spec, columns=tuple(mapping.get(c, c) for c in spec.columns))


def _warm_up(spark) -> None:
    """The workers start importing TensorFlow now, while the driver prepares the rest (once per
    Spark application; :func:`~optim.spark.driver.preflight.ensure_warm_up`)."""
    from optim.spark.driver.preflight import ensure_warm_up

    ensure_warm_up(spark)


class DataFrameDataset(TFDataset):
    """``TFDataset.from_dataframe(df, feature_cols, label_cols, feature_shapes)``.

    Args:
        df: A Spark DataFrame.
        feature_cols: One entry per model input, in input order: a column name (numbers, or arrays
            of numbers reshaped to ``feature_shapes[col]`` per row), or a list of scalar columns
            stacked into one vector.
        label_cols: The label column (or a list, for several labels). None for prediction.
        feature_shapes: ``{column: per-row shape}`` for array columns, or a list of shapes in the
            order of ``feature_cols``. Default: 1-D, as stored.
        batch_size: The global batch ``optimize`` uses by default. Default: none (32).
        augment: ``fn(features, rng) -> features`` applied on the ranks to training batches only,
            e.g. :class:`optim.training.augment.RandomCropFlip`. Default: none.
    """

    distributed = True

    def __init__(self, df, feature_cols, label_cols=None, feature_shapes=None, batch_size: int | None = None,
                 augment=None):
        self.batch_size = batch_size
        self.augment = augment
        #: input names, when feature_cols is a dict by input name (TFOptimizer puts them in the net's order)
        self.input_keys = list(feature_cols) if isinstance(feature_cols, Mapping) else None
        if isinstance(feature_cols, Mapping):
            feature_cols = list(feature_cols.values())
        shapes = _shapes_by_column(feature_cols, feature_shapes)
        self.features = _specs(feature_cols, shapes, "feature_cols")
        self.labels = _specs(label_cols, shapes, "label_cols")
        named = [c for spec in self.features + self.labels for c in spec.columns]
        unknown = [k for k in shapes if k not in named]
        if unknown:
            close = closest_names(str(unknown[0]), named)
            raise ColumnError(
                f"feature_shapes names column {unknown[0]!r}, which is not among feature_cols or label_cols {named}"
                + (f"; closest: {close}" if close else "") + ". Its shape would be ignored: fix the name.")
        # Spark ML Vector columns are read through a hidden array column (vector_to_array)
        self.df, self.vectors = vectors_as_arrays(df, [c for s in self.features + self.labels for c in s.columns])
        if self.vectors:
            self.features = [_through(s, self.vectors) for s in self.features]
            self.labels = [_through(s, self.vectors) for s in self.labels]
        self.has_labels = bool(self.labels)
        if not self.features:
            raise ValueError("`feature_cols` must name at least one column.")
        self.single_label = isinstance(label_cols, str) or len(self.labels) == 1
        existing = list(self.df.columns)
        for spec in self.features + self.labels:
            for c in spec.columns:
                if c not in existing:
                    close = closest_names(c, existing)
                    raise ColumnError(
                        f"Column {c!r} is not in the DataFrame. Columns: {existing}"
                        + (f"; closest: {close}" if close else "")
                    )
        _warm_up(getattr(df, "sparkSession", None))

    def arrange_inputs(self, input_names: list[str]) -> None:
        """Puts the feature columns in the net's input order, when they were given as a dict by
        input name (with or without ``:0``).

        Raises:
            ColumnError: a key that names no input, or an input without a column.
        """
        if self.input_keys is None:
            return
        by_input = {}
        for key, spec in zip(self.input_keys, self.features):
            full = key if ":" in key else f"{key}:0"
            if full not in input_names:
                close = closest_names(full, input_names)
                raise ColumnError(f"feature_cols names input {key!r}, which the net does not have. Inputs: "
                                  f"{input_names}" + (f"; closest: {close}" if close else ""))
            by_input[full] = spec
        missing = [n for n in input_names if n not in by_input]
        if missing:
            raise ColumnError(f"feature_cols has no column for the net's inputs {missing}. Inputs: {input_names}")
        self.features = [by_input[n] for n in input_names]
        self.input_keys = None

    def check_inputs(self, input_names: list[str], input_specs) -> None:
        """Before any Spark job: each per-row shape given (``feature_shapes``, or stacked scalar
        columns) against its input's, and a flat array column, or a column of encoded images,
        feeding an input of rank 3 or more needs its per-row shape in ``feature_shapes``.

        Raises:
            InputSpecError: the column, the input's shape, and the ``feature_shapes`` to pass.
        """
        from pyspark.sql.types import ArrayType, BinaryType

        from tfnet.errors import InputSpecError

        if len(self.features) != len(input_names):
            raise InputSpecError(f"feature_cols gives {len(self.features)} input(s) "
                                 f"{[self._shown(s.name) for s in self.features]}; the net takes {len(input_names)}: "
                                 f"{input_names}.")
        for spec, name, tensor in zip(self.features, input_names, input_specs):
            if spec.shape is None or tensor.shape.rank is None:
                continue
            row = tuple(tensor.shape.as_list()[1:])
            fits = len(spec.shape) == len(row) and all(d is None or d == g for d, g in zip(row, spec.shape))
            if not fits:
                what = (f"feature_shapes gives column {self._shown(spec.columns[0])!r} rows of shape {tuple(spec.shape)}"
                        if len(spec.columns) == 1 else
                        f"the {len(spec.columns)} stacked columns {[self._shown(c) for c in spec.columns]} make rows of "
                        f"shape {tuple(spec.shape)}")
                raise InputSpecError(f"{what}, and input {name!r} takes rows of shape {row} (the net's input is "
                                     f"{tuple(tensor.shape.as_list())}, the batch first).")
        types = {f.name: f.dataType for f in self.df.schema.fields}
        for spec, name, tensor in zip(self.features, input_names, input_specs):
            if spec.shape is not None or len(spec.columns) != 1 or tensor.shape.rank is None or tensor.shape.rank < 3:
                continue
            column = spec.columns[0]
            kind = types.get(column)
            flat = isinstance(kind, ArrayType) and not isinstance(kind.elementType, ArrayType)
            if flat or isinstance(kind, BinaryType):
                row = tuple(tensor.shape.as_list()[1:])
                shown = {hidden: c for c, hidden in self.vectors.items()}.get(column, column)
                raise InputSpecError(
                    f"Column {shown!r} holds {'flat arrays' if flat else 'encoded images'}, and input {name!r} takes "
                    f"rows of shape {row}: pass feature_shapes={{{shown!r}: {tuple(d or 0 for d in row)}}} (the per-row "
                    "shape), so that the ranks can reshape or decode it."
                )

    def _shown(self, column: str) -> str:
        """The user's name for a column (not the hidden array column of a Vector column)."""
        return {hidden: c for c, hidden in self.vectors.items()}.get(column, column)

    def label_kinds(self) -> list[tuple[str, str]]:
        """``(column, Spark type)`` of each label, for checks against the loss on the driver."""
        types = {f.name: f.dataType for f in self.df.schema.fields}
        return [(self._shown(s.name), types[s.columns[0]].simpleString() if len(s.columns) == 1 else "stacked")
                for s in self.labels]

    def columns(self) -> list[str]:
        seen = []
        for spec in self.features + self.labels:
            for c in spec.columns:
                if c not in seen:
                    seen.append(c)
        return seen

    def shard_reader(self):
        """A picklable function ``(arrow_batches, partition) -> ArrayDataset`` for the workers."""
        return _ArrowShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment)

    def to_local(self) -> ArrayDataset:
        """Collects the whole DataFrame to the driver (for validation data)."""
        table = self.df.select(*self.columns()).toArrow()
        return self.shard_reader()(table.to_batches(), 0, presharded=False)

    def num_batches(self, batch_size, **kw):
        return None


class _ArrowShard:
    def __init__(self, features, labels, single_label, augment=None):
        self.features, self.labels, self.single_label, self.augment = features, labels, single_label, augment

    def __call__(self, batches, partition: int, presharded: bool = True) -> ArrayDataset:
        batches = list(batches)
        arrays = arrow_to_arrays(batches, list(self.features) + list(self.labels), partition)
        feats, labels = arrays[: len(self.features)], arrays[len(self.features):]
        return ArrayDataset(feats, labels or None, self.single_label, presharded=presharded, augment=self.augment)


#: The column that marks validation rows in a stage that carries both (see :func:`with_validation`).
SPLIT_COLUMN = "__tfnet_validation"


def with_validation(train: DataFrameDataset, validation: DataFrameDataset, n: int):
    """One DataFrame of the training and the validation rows, marked by :data:`SPLIT_COLUMN` and
    spread round robin over ``n`` partitions, and the reader that splits a partition back into
    ``(training shard, validation shard)``: validation then runs on the ranks, each on its own
    rows, with no row collected to the driver. The validation columns pair with the training
    columns in order (their names may differ).

    Raises:
        ColumnError: the validation data has another number of feature or label columns.
    """
    from pyspark.sql import functions as F

    t_cols, v_cols = train.columns(), validation.columns()
    if len(train.features) != len(validation.features) or len(train.labels) != len(validation.labels) or \
            len(t_cols) != len(v_cols):
        raise ColumnError(f"The validation DataFrame's columns {v_cols} do not pair with the training columns {t_cols} "
                          "(the same number of feature and label columns, in the same order).")
    t_df = train.df.select(*t_cols, F.lit(False).alias(SPLIT_COLUMN))
    v_df = validation.df.select(*[F.col(v).alias(t) for v, t in zip(v_cols, t_cols)], F.lit(True).alias(SPLIT_COLUMN))
    return t_df.unionByName(v_df).repartition(n), _SplitShard(train.shard_reader())


class _SplitShard:
    """``(batches, partition) -> (training ArrayDataset, validation ArrayDataset or None)``, split by
    :data:`SPLIT_COLUMN`; only the training shard is augmented."""

    def __init__(self, reader: _ArrowShard):
        self.reader = reader

    def __call__(self, batches, partition: int, presharded: bool = True):
        import pyarrow.compute as pc

        train, val = [], []
        for batch in batches:
            mask = batch.column(batch.schema.get_field_index(SPLIT_COLUMN))
            train.append(batch.filter(pc.invert(mask)))
            val.append(batch.filter(mask))
        shard = self.reader(train, partition, presharded)
        if not sum(b.num_rows for b in val):  # no validation rows here: an empty shard (the others' sums still meet)
            labels = None if shard.labels is None else [a[:0] for a in shard.labels]
            return shard, ArrayDataset([a[:0] for a in shard.features], labels, shard.single_label, presharded=True)
        plain = _ArrowShard(self.reader.features, self.reader.labels, self.reader.single_label)
        return shard, plain(val, partition, presharded)


class RDDDataset(TFDataset):
    """``TFDataset.from_rdd(rdd)``: an RDD of ``(features, label)`` records, ``features`` an array
    (or a tuple of arrays, one per model input)."""

    distributed = True

    def __init__(self, rdd, batch_size: int | None = None):
        self.rdd = rdd
        self.batch_size = batch_size
        self.has_labels = True
        _warm_up(getattr(rdd, "context", None))

    def shard_reader(self):
        return _RecordShard()

    def to_local(self) -> ArrayDataset:
        """Collects the records to the driver (validation data of a distributed run)."""
        return _RecordShard()(self.rdd.collect(), 0, presharded=False)

    def num_batches(self, batch_size, **kw):
        return None


class _RecordShard:
    def __call__(self, records, partition: int, presharded: bool = True) -> ArrayDataset:
        feats, labels = records_to_arrays(records, partition)
        if not feats:
            return _empty()
        return ArrayDataset(feats, [labels], True, presharded=presharded)


def _empty() -> ArrayDataset:
    return ArrayDataset([np.zeros((0,), np.float32)], [np.zeros((0,), np.float32)], True, presharded=True)
