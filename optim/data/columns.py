"""Training data described by columns (a Spark DataFrame, Parquet files): which columns feed which input,
with which per-row shape, checked on the driver against the net and the loss (:mod:`optim.data.checks`)
before any Spark job. Pure: no PySpark (each subclass says what its columns' types are).

A model input (or the labels) comes from one column, reshaped to a declared per-row shape (or decoded, for
encoded images), or from several scalar columns stacked into a vector: a
:class:`~optim.data.decode.TensorColumns`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from optim.data.base import DataAdapter
from optim.data.checks import Feed, check_feeds, check_present
from optim.data.decode import TensorColumns
from optim.data.names import by_output
from optim.data.values import check_label_types
from optim.errors import ColumnError
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
    """One :class:`~optim.data.decode.TensorColumns` per entry of ``cols`` (a name, or a list of scalar
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


class ColumnDataset(DataAdapter):
    """Features and labels read from named columns.

    Subclasses set ``features`` and ``labels`` (lists of TensorColumns), ``input_keys`` (input names,
    when ``feature_cols`` was a dict by input name, else None) and ``vectors`` (``{shown column: the
    column read}``), and implement :meth:`column_types`.
    """

    distributed = True
    features: list[TensorColumns]
    labels: list[TensorColumns]
    input_keys: list[str] | None = None
    #: output names, when ``label_cols`` was a dict by output name (put in output order by :meth:`bind`)
    output_keys: list[str] | None = None
    vectors: dict[str, str] = {}
    #: the column of sample weights (None: unweighted)
    weight: TensorColumns | None = None

    def set_columns(self, feature_cols, label_cols, feature_shapes) -> object:
        """Parses ``feature_cols`` and ``label_cols``; returns ``feature_cols`` as a list or a name."""
        self.input_keys = list(feature_cols) if isinstance(feature_cols, Mapping) else None
        if isinstance(feature_cols, Mapping):
            feature_cols = list(feature_cols.values())
        self.output_keys = [str(k) for k in label_cols] if isinstance(label_cols, Mapping) else None
        if isinstance(label_cols, Mapping):
            label_cols = list(label_cols.values())
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

    def set_weight(self, weight_col, label_cols) -> None:
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

    def require_columns(self, existing: list[str]) -> None:
        """Raises ColumnError for a column that is not in ``existing`` (naming the closest)."""
        check_present([c for spec in self.features + self.labels + self._weights() for c in spec.columns], existing)

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

    def arrange_outputs(self, output_names: list[str]) -> None:
        """Puts the label columns in the net's output order, when they were given as a dict by output name (a Keras
        model's dict keys or output layers' names, with or without ``:0``), as Keras's ``fit`` takes labels.

        Raises:
            ColumnError: a key that names no output, or an output without a column.
        """
        if self.output_keys is None:
            return
        self.labels = by_output(zip(self.output_keys, self.labels), output_names, "label_cols",
                                "label_cols has no column for the net's outputs {missing}.", ColumnError)
        self.output_keys = None

    def column_types(self) -> dict[str, str]:
        """``{column: type}`` in Spark's words (``double``, ``array<float>``, ``binary``, ``vector``), by the
        user's column names."""
        raise NotImplementedError  # pragma: no cover

    def feeds(self) -> list[Feed]:
        """What feeds each input (:class:`~optim.data.checks.Feed`): the column (or stacked columns), its type
        and the per-row shape given."""
        types = self.column_types()
        out = []
        for spec in self.features:
            names = [self._shown(c) for c in spec.columns]
            if len(names) == 1:
                kind = types.get(names[0], "other")
                shape = spec.shape
                if shape is None and Feed(names[0], kind).kind in ("numbers", "strings") and "<" not in kind \
                        and kind != "vector":
                    shape = ()  # one number or one string per row
                out.append(Feed(names[0], kind, shape, declared=spec.shape is not None))
                continue
            kinds = [Feed(n, types.get(n, "other")) for n in names]
            odd = next((k for k in kinds if k.kind != "numbers" or k.type.startswith("array<")), None)
            if odd is not None:
                raise ColumnError(f"Column {odd.name!r} holds {odd.type} values; columns stacked into one input "
                                  f"{names} must each hold one number per row.")
            out.append(Feed(spec.name if len(names) > 1 else names[0], "array<double>", spec.shape, declared=True))
        return out

    def label_kinds(self) -> list[tuple[str, str]]:
        """``(column, type)`` of each label, for the checks against the loss before any job."""
        types = self.column_types()
        return [(self._shown(s.name), types.get(self._shown(s.columns[0]), "other") if len(s.columns) == 1
                 else "stacked") for s in self.labels]

    def bind(self, input_names, input_specs, output_names=None) -> None:
        """The feature columns in the net's input order (when given by input name), checked against the
        net's inputs (:func:`~optim.data.checks.check_feeds`); the label columns in its output order (when given by
        output name)."""
        self.arrange_inputs(list(input_names))
        if output_names is not None:
            self.arrange_outputs(list(output_names))
        check_feeds(self.feeds(), list(input_names), list(input_specs))

    def checked(self, loss, net, on_nonfinite: str, where: str, training: bool = True):
        """The label columns' types against the loss (before any job); the values are checked on the ranks
        as they read them."""
        if self.has_labels:
            check_label_types(self.label_kinds(), loss, net, where)
        return self

    def predict_columns(self) -> str | list[str]:
        """The column of each input, as ``TFPredictor.predict`` takes ``feature_cols`` (a name for one input).

        Raises:
            TypeError: an input stacked from scalar columns (prediction reads one column per input).
        """
        cols = []
        for spec in self.features:
            if len(spec.columns) != 1:
                raise TypeError(f"predict() over {self.road} takes one column per input; {list(spec.columns)} is a "
                                "stack of scalar columns: assemble it into an array column first.")
            cols.append(spec.columns[0])
        return cols if len(cols) > 1 else cols[0]

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
