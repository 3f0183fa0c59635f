"""Training data described by columns (a Spark DataFrame, Parquet files): which columns feed which input,
with which per-row shape. Pure: no PySpark (each subclass says how it reads its column types).

A model input (or the labels) comes from one column, reshaped to a declared per-row shape (or decoded, for
encoded images), or from several scalar columns stacked into a vector: a
:class:`~optim.training.shard.TensorColumns`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from optim.errors import ColumnError
from optim.training.datasets import TFDataset
from optim.training.shard import TensorColumns
from tfnet.errors import closest_names

__all__ = ["ColumnDataset", "shapes_by_column", "tensor_specs"]


def shapes_by_column(cols, shapes) -> dict:
    """``feature_shapes`` as ``{column: shape}``: given as a dict, or as a list of shapes in the
    order of ``feature_cols`` (None for a column that needs none).

    >>> shapes_by_column(["a", "b"], [(8, 8, 1), None])
    {'a': (8, 8, 1)}
    """
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


def tensor_specs(cols, shapes: Mapping[str, Sequence[int]] | None, what: str) -> list[TensorColumns]:
    """One :class:`~optim.training.shard.TensorColumns` per entry of ``cols`` (a name, or a list of scalar
    columns to stack); ``what`` names the argument in errors."""
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


class ColumnDataset(TFDataset):
    """Features and labels read from named columns.

    Subclasses set ``features`` and ``labels`` (lists of TensorColumns), ``input_keys`` (input names,
    when ``feature_cols`` was a dict by input name, else None) and ``vectors`` (``{shown column: the
    column read}``), and implement :meth:`column_kinds`.
    """

    distributed = True
    features: list[TensorColumns]
    labels: list[TensorColumns]
    input_keys: list[str] | None = None
    vectors: dict[str, str] = {}
    #: the column of sample weights (None: unweighted)
    weight: TensorColumns | None = None

    def _set_columns(self, feature_cols, label_cols, feature_shapes) -> object:
        """Parses ``feature_cols`` and ``label_cols``; returns ``feature_cols`` as a list or a name."""
        self.input_keys = list(feature_cols) if isinstance(feature_cols, Mapping) else None
        if isinstance(feature_cols, Mapping):
            feature_cols = list(feature_cols.values())
        shapes = shapes_by_column(feature_cols, feature_shapes)
        self.features = tensor_specs(feature_cols, shapes, "feature_cols")
        self.labels = tensor_specs(label_cols, shapes, "label_cols")
        named = [c for spec in self.features + self.labels for c in spec.columns]
        unknown = [k for k in shapes if k not in named]
        if unknown:
            close = closest_names(str(unknown[0]), named)
            raise ColumnError(
                f"feature_shapes names column {unknown[0]!r}, which is not among feature_cols or label_cols {named}"
                + (f"; closest: {close}" if close else "") + ". Its shape would be ignored: fix the name.")
        if not self.features:
            raise ValueError("`feature_cols` must name at least one column.")
        self.has_labels = bool(self.labels)
        self.single_label = isinstance(label_cols, str) or len(self.labels) == 1
        return feature_cols

    def _set_weight(self, weight_col, label_cols) -> None:
        """Sets :attr:`weight` from ``weight_col`` (a column name or None), checked against the other columns."""
        if weight_col is None:
            self.weight = None
            return
        if not isinstance(weight_col, str):
            raise TypeError(f"`weight_col` must be the name of one column of numbers. Received: weight_col={weight_col!r}")
        if label_cols is None:
            raise ValueError(f"`weight_col` weights the loss of each row; it needs `label_cols`. Received: "
                             f"weight_col={weight_col!r} without label columns")
        if weight_col in {c for s in self.features + self.labels for c in s.columns}:
            raise ColumnError(f"The weight column {weight_col!r} is also a feature or label column; sample weights "
                              "need a column of their own.")
        self.weight = TensorColumns((weight_col,), None)

    def _weights(self) -> list[TensorColumns]:
        return [] if self.weight is None else [self.weight]

    def _shown(self, column: str) -> str:
        """The user's name for a column (not the hidden array column of a Vector column)."""
        return {hidden: c for c, hidden in self.vectors.items()}.get(column, column)

    def _check_present(self, existing: list[str], where: str) -> None:
        """Raises ColumnError for a column that is not in ``existing`` (naming the closest)."""
        for spec in self.features + self.labels + self._weights():
            for c in spec.columns:
                if c not in existing:
                    close = closest_names(c, existing)
                    raise ColumnError(f"Column {c!r} is not in {where}. Columns: {existing}"
                                      + (f"; closest: {close}" if close else ""))

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

    def column_kinds(self) -> dict[str, str]:
        """``{column: "flat" | "image" | "other"}``: flat arrays of numbers, binary (encoded images), or else."""
        raise NotImplementedError  # pragma: no cover

    def check_inputs(self, input_names: list[str], input_specs) -> None:
        """Before any Spark job: each per-row shape given (``feature_shapes``, or stacked scalar
        columns) against its input's, and a flat array column, or a column of encoded images,
        feeding an input of rank 3 or more needs its per-row shape in ``feature_shapes``.

        Raises:
            InputSpecError: the column, the input's shape, and the ``feature_shapes`` to pass.
        """
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
        kinds = self.column_kinds()
        for spec, name, tensor in zip(self.features, input_names, input_specs):
            if spec.shape is not None or len(spec.columns) != 1 or tensor.shape.rank is None or tensor.shape.rank < 3:
                continue
            column = spec.columns[0]
            kind = kinds.get(column)
            if kind in ("flat", "image"):
                row = tuple(tensor.shape.as_list()[1:])
                shown = {hidden: c for c, hidden in self.vectors.items()}.get(column, column)
                raise InputSpecError(
                    f"Column {shown!r} holds {'flat arrays' if kind == 'flat' else 'encoded images'}, and input {name!r} "
                    f"takes rows of shape {row}: pass feature_shapes={{{shown!r}: {tuple(d or 0 for d in row)}}} (the "
                    "per-row shape), so that the ranks can reshape or decode it."
                )

    def columns(self) -> list[str]:
        """Every column the ranks read: :meth:`data_columns`, then the weight column."""
        return self.data_columns() + [c for spec in self._weights() for c in spec.columns]

    def data_columns(self) -> list[str]:
        """The feature and label columns, each once, in order."""
        seen = []
        for spec in self.features + self.labels:
            for c in spec.columns:
                if c not in seen:
                    seen.append(c)
        return seen
