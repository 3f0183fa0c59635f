"""Turning one Spark partition into numpy arrays. Runs on the ranks (and on the driver for collected data).

A :class:`TensorColumns` says how to read one model input (or the labels) from Arrow columns: one
column (numbers, arrays of numbers, flat or nested, reshaped to a declared per-row shape, or
encoded images decoded to a ``(height, width, channels)`` shape), or several scalar columns stacked
into a vector. Each column goes through :func:`optim.arrow.read_column`, which raises
:class:`~optim.errors.BadRowError` at the first bad row, naming the partition and the row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from optim.arrow import ColumnRead, read_column
from optim.errors import BadRowError


@dataclass(frozen=True)
class TensorColumns:
    """One tensor made of ``columns``: a single column reshaped to ``shape`` per row, or several
    scalar columns stacked (then ``shape`` is ``(len(columns),)``)."""

    columns: tuple[str, ...]
    shape: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return self.columns[0] if len(self.columns) == 1 else "[" + ", ".join(self.columns) + "]"


def _read(batch, column: str, shape, partition: int, row_offset: int) -> np.ndarray:
    """One column of a batch; raises at the first bad row (every training row must be usable)."""
    col = batch.column(batch.schema.get_field_index(column))
    return read_column(col, ColumnRead(shape=shape), on_bad="raise", column=column, partition=partition,
                       row_offset=row_offset).values


def arrow_to_arrays(batches: Iterable, specs: Sequence[TensorColumns], partition: int) -> list[np.ndarray]:
    """Reads every batch of a partition into one array per spec."""
    parts: list[list[np.ndarray]] = [[] for _ in specs]
    offset = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        for i, spec in enumerate(specs):
            if len(spec.columns) == 1:
                parts[i].append(_read(batch, spec.columns[0], spec.shape, partition, offset))
            else:
                cols = [_read(batch, c, None, partition, offset) for c in spec.columns]
                parts[i].append(np.stack(cols, axis=1))
        offset += batch.num_rows
    return [np.concatenate(p) if p else np.zeros((0,) + (spec.shape or ()), np.float32)
            for p, spec in zip(parts, specs)]


def records_to_arrays(records: Iterable, partition: int) -> tuple[list[np.ndarray], np.ndarray | list | None]:
    """An RDD partition of ``(features, label)`` records (features: an array or a tuple of
    arrays, one per input) into stacked arrays."""
    feats: list[list] | None = None
    labels: list = []
    multi = False
    for row, record in enumerate(records):
        if not isinstance(record, (tuple, list)) or len(record) != 2:
            raise BadRowError(
                f"RDD record {row} of partition {partition} is {type(record).__name__}; expected a "
                "(features, label) pair."
            )
        x, y = record
        if x is None or y is None:
            raise BadRowError(f"RDD record {row} of partition {partition} has a None {'features' if x is None else 'label'}.")
        if feats is None:
            multi = isinstance(x, (tuple, list)) and len(x) > 0 and hasattr(x[0], "__len__")
            feats = [[] for _ in (x if multi else [x])]
        xs = list(x) if multi else [x]
        if len(xs) != len(feats):
            raise BadRowError(f"RDD record {row} of partition {partition} has {len(xs)} feature arrays; expected {len(feats)}.")
        for acc, value in zip(feats, xs):
            acc.append(np.asarray(value))
        labels.append(np.asarray(y))
    if feats is None:
        return [], None
    try:
        arrays = [np.stack(a) for a in feats]
        label_arr = np.stack(labels)
    except ValueError as exc:
        raise BadRowError(f"Records of partition {partition} have features or labels of different shapes: {exc}") from None
    return arrays, label_arr


def row_weights(values: np.ndarray, column: str, partition: int, first=0, where=None) -> np.ndarray:
    """A weight column's values as float32, one per row (``first``: the partition's row of the first, or
    an array of each row's row in the partition; ``where(row)``: how errors name a row, by default ``"row R of
    partition P"``).

    Raises:
        BadRowError: a value that is not one finite, non-negative number (naming the row).
    """
    if values.dtype.kind not in "fiub" or values.ndim != 1:
        raise BadRowError(f"Weight column {column!r} of partition {partition} must hold one number per row; it holds "
                          f"{values.dtype} values of per-row shape {values.shape[1:]}.")
    w = values.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        row = int(first[bad[0]]) if isinstance(first, np.ndarray) else first + int(bad[0])
        at = where(row) if where is not None else f"row {row} of partition {partition}"
        raise BadRowError(f"Weight column {column!r} {at} holds "
                          f"{float(values[bad[0]])!r}; a sample weight must be a finite, non-negative number "
                          f"({bad.size} such row(s)).")
    return w
