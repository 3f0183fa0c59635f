"""Distributed training data: a Spark DataFrame or RDD, one shard per rank. Driver side.

Each object describes how a rank turns its partition into arrays (:mod:`optim.training.shard` does
it in the worker, through the one Arrow reader :mod:`optim.arrow`). Rows are balanced across ranks
before training when partitions are uneven or empty (see
:func:`optim.spark.driver.backends.classic.balance_dataframe`).
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
    Spark application or Connect session; :func:`~optim.spark.driver.warm_up.ensure_warm_up`)."""
    from optim.spark.driver.warm_up import ensure_warm_up

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
        weight_col: A column of sample weights, one finite, non-negative number per row (Spark
            ML's ``weightCol``): the loss and the ``weighted_metrics`` weight each row by it, as
            ``optimize(..., sample_weight=w)`` does for numpy data. Default: none (every row counts
            alike).
    """

    distributed = True

    def __init__(self, df, feature_cols, label_cols=None, feature_shapes=None, batch_size: int | None = None,
                 augment=None, weight_col: str | None = None):
        self.batch_size = batch_size
        self.augment = augment
        if weight_col is not None and not isinstance(weight_col, str):
            raise TypeError(f"`weight_col` must be the name of one column of numbers. Received: weight_col={weight_col!r}")
        if weight_col is not None and label_cols is None:
            raise ValueError(f"`weight_col` weights the loss of each row; it needs `label_cols`. Received: "
                             f"weight_col={weight_col!r} without label columns")
        #: the column of sample weights (None: unweighted)
        self.weight = None if weight_col is None else TensorColumns((weight_col,), None)
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
        if weight_col is not None and weight_col in {c for s in self.features + self.labels for c in s.columns}:
            raise ColumnError(f"The weight column {weight_col!r} is also a feature or label column; sample weights "
                              "need a column of their own.")
        existing = list(self.df.columns)
        for spec in self.features + self.labels + self._weights():
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

    def _weights(self) -> list[TensorColumns]:
        return [] if self.weight is None else [self.weight]

    def data_columns(self) -> list[str]:
        """The feature and label columns, each once, in order."""
        seen = []
        for spec in self.features + self.labels:
            for c in spec.columns:
                if c not in seen:
                    seen.append(c)
        return seen

    def columns(self) -> list[str]:
        """Every column the ranks read: :meth:`data_columns`, then the weight column."""
        return self.data_columns() + [c for spec in self._weights() for c in spec.columns]

    def shard_reader(self):
        """A picklable function ``(arrow_batches, partition) -> ArrayDataset`` for the workers."""
        return _ArrowShard(tuple(self.features), tuple(self.labels), self.single_label, self.augment, self.weight)

    def to_local(self) -> ArrayDataset:
        """Collects the whole DataFrame to the driver (for validation data)."""
        table = self.df.select(*self.columns()).toArrow()
        return self.shard_reader()(table.to_batches(), 0, presharded=False)

    def num_batches(self, batch_size, **kw):
        return None


class _ArrowShard:
    def __init__(self, features, labels, single_label, augment=None, weight: TensorColumns | None = None):
        self.features, self.labels, self.single_label, self.augment = features, labels, single_label, augment
        self.weight = weight

    def __call__(self, batches, partition: int, presharded: bool = True) -> ArrayDataset:
        batches = list(batches)
        weights = [] if self.weight is None else [self.weight]
        arrays = arrow_to_arrays(batches, list(self.features) + list(self.labels) + weights, partition)
        n_feats, n_labels = len(self.features), len(self.labels)
        feats, labels = arrays[:n_feats], arrays[n_feats:n_feats + n_labels]
        w = None
        if weights:
            w = _row_weights(arrays[-1], self.weight.columns[0], partition)
        return ArrayDataset(feats, labels or None, self.single_label, presharded=presharded, augment=self.augment,
                            weights=w)


def _row_weights(values: np.ndarray, column: str, partition: int) -> np.ndarray:
    """The weight column's values as float32, one per row.

    Raises:
        BadRowError: a value that is not one finite, non-negative number (naming the row).
    """
    from optim.errors import BadRowError

    if values.dtype.kind not in "fiub" or values.ndim != 1:
        raise BadRowError(f"Weight column {column!r} of partition {partition} must hold one number per row; it holds "
                          f"{values.dtype} values of per-row shape {values.shape[1:]}.")
    w = values.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        raise BadRowError(f"Weight column {column!r} row {int(bad[0])} of partition {partition} holds "
                          f"{float(values[bad[0]])!r}; a sample weight must be a finite, non-negative number "
                          f"({bad.size} such row(s)).")
    return w


#: The column that marks validation rows in a stage that carries both (see :func:`with_validation`).
SPLIT_COLUMN = "__tfnet_validation"


def with_validation(train: DataFrameDataset, validation: DataFrameDataset, n: int):
    """One DataFrame of the training and the validation rows, marked by :data:`SPLIT_COLUMN` and
    spread round robin over ``n`` partitions, and the reader that splits a partition back into
    ``(training shard, validation shard)``: validation then runs on the ranks, each on its own
    rows, with no row collected to the driver. The validation columns pair with the training
    columns in order (their names may differ). Each side keeps its own sample weights
    (``weight_col``), or none.

    Raises:
        ColumnError: the validation data has another number of feature or label columns.
    """
    from pyspark.sql import functions as F

    t_cols, v_cols = train.data_columns(), validation.data_columns()
    if len(train.features) != len(validation.features) or len(train.labels) != len(validation.labels) or \
            len(t_cols) != len(v_cols):
        raise ColumnError(f"The validation DataFrame's columns {v_cols} do not pair with the training columns {t_cols} "
                          "(the same number of feature and label columns, in the same order).")
    # the union's weight column: the training one's name, filled with 1.0 on the side that has none
    weight = None
    if train.weight is not None or validation.weight is not None:
        weight = train.weight.columns[0] if train.weight is not None else WEIGHT_COLUMN

    def weights_of(data: DataFrameDataset) -> list:
        if weight is None:
            return []
        value = F.col(data.weight.columns[0]) if data.weight is not None else F.lit(1.0)
        return [value.cast("double").alias(weight)]

    t_df = train.df.select(*t_cols, *weights_of(train), F.lit(False).alias(SPLIT_COLUMN))
    v_df = validation.df.select(*[F.col(v).alias(t) for v, t in zip(v_cols, t_cols)], *weights_of(validation),
                                F.lit(True).alias(SPLIT_COLUMN))
    val_weight = TensorColumns((weight,), None) if validation.weight is not None else None
    val_reader = _ArrowShard(tuple(train.features), tuple(train.labels), train.single_label, weight=val_weight)
    return t_df.unionByName(v_df).repartition(n), _SplitShard(train.shard_reader(), val_reader)


#: The union's weight column when only the validation data has sample weights.
WEIGHT_COLUMN = "__tfnet_weight"


class _SplitShard:
    """``(batches, partition) -> (training ArrayDataset, validation ArrayDataset or None)``, split by
    :data:`SPLIT_COLUMN`; only the training shard is augmented."""

    def __init__(self, reader: _ArrowShard, val_reader: _ArrowShard):
        self.reader, self.val_reader = reader, val_reader

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
            weights = None if self.val_reader.weight is None else np.zeros(0, np.float32)
            return shard, ArrayDataset([a[:0] for a in shard.features], labels, shard.single_label, presharded=True,
                                       weights=weights)
        return shard, self.val_reader(val, partition, presharded)


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
