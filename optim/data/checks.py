"""The checks every road of data takes on the driver, before any training stage: the same mistake gives the same
typed error and message from numpy arrays, a ``tf.data`` input (its ``element_spec``), a DataFrame, an RDD (its
first record), Parquet files and a Delta table. Pure: pyarrow, numpy and tfnet.

Each road describes what it feeds as :class:`Feed` objects (a column, or stacked scalar columns, or an array:
its name as the user gave it, its type in Spark's words (``double``, ``string``, ``array<float>``,
``binary``), and its per-row shape where it is known); :func:`check_feeds` compares them with the net's
inputs, :func:`label_kinds` with the loss (:func:`optim.data.values.check_label_types`), and
:func:`check_present` the columns named with the columns there are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from optim.errors import ColumnError
from tfnet.errors import InputSpecError, closest_names

__all__ = ["Feed", "array_type", "check_feeds", "check_present", "spark_type"]

_INTS = {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}


def spark_type(t: pa.DataType) -> str:
    """An Arrow type in Spark's words (``simpleString``), so that a Parquet file's columns read as the
    DataFrame it was written from.

    >>> spark_type(pa.list_(pa.float32()))
    'array<float>'
    """
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    if pa.types.is_integer(t):
        return _INTS.get(t.bit_width, "bigint") if pa.types.is_signed_integer(t) else _INTS.get(
            min(t.bit_width * 2, 64), "bigint")
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"array<{spark_type(t.value_type)}>"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{spark_type(f.type)}" for f in t) + ">"
    return str(t)


def array_type(a: np.ndarray) -> str:
    """A numpy array's rows in Spark's words: a row of shape ``()`` is a scalar type, a row of rank k an
    ``array<...>`` k deep; strings are ``string`` and byte strings (encoded images) ``binary``.

    >>> array_type(np.zeros((4, 3), np.float32))
    'array<float>'
    """
    kind = a.dtype.kind
    if kind in "US":
        base = "string" if kind == "U" else "binary"
    elif kind == "O":
        first = next((v for v in a.ravel()[:64] if v is not None), None)
        base = "binary" if isinstance(first, (bytes, bytearray)) else "string" if isinstance(first, str) else "other"
    elif kind == "b":
        base = "boolean"
    elif kind in "iu":
        base = _INTS.get(a.dtype.itemsize * 8 if kind == "i" else min(a.dtype.itemsize * 16, 64), "bigint")
    elif kind == "f":
        base = "double" if a.dtype.itemsize == 8 else "float"
    else:
        base = str(a.dtype)
    for _ in range(max(a.ndim - 1, 0)):
        base = f"array<{base}>"
    return base


@dataclass(frozen=True)
class Feed:
    """What feeds one input (or one label): ``name`` as the user gave it, ``type`` in Spark's words, and
    ``shape`` (the per-row shape given or known, a dimension None where only a ``tf.data`` input's rows know it;
    None: unknown until a row is read). ``declared``: the shape was given (``feature_shapes``, or stacked scalar columns)."""

    name: str
    type: str
    shape: tuple[int, ...] | None = None
    declared: bool = False

    @property
    def base(self) -> str:
        """The type of the values: ``float`` for ``array<array<float>>``."""
        t = self.type
        while t.startswith("array<") and t.endswith(">"):
            t = t[len("array<"):-1]
        return t

    @property
    def kind(self) -> str:
        """``"numbers"`` (a number, or arrays of numbers), ``"image"`` (binary: encoded images), ``"strings"``
        (strings, or arrays of them), ``"vector"`` (a Spark ML vector, read as an array) or ``"other"``."""
        if self.type == "vector":
            return "numbers"
        base = self.base
        if base in ("tinyint", "smallint", "int", "bigint", "float", "double", "boolean") or base.startswith("decimal"):
            return "numbers"
        if base == "binary":
            return "image" if self.type == "binary" else "other"
        if base == "string":
            return "strings"
        return "other"

    @property
    def flat(self) -> bool:
        """One array of numbers per row (whose per-row shape is its length unless given)."""
        return self.type.startswith("array<") and not self.type.startswith("array<array<") or self.type == "vector"


def check_present(needed: list[str], existing: list[str]) -> None:
    """Every column named is among the data's columns.

    Raises:
        ColumnError: the first one missing, with the columns there are and the closest names.
    """
    for c in needed:
        if c not in existing:
            close = closest_names(c, existing)
            raise ColumnError(f"Column {c!r} is not among the data's columns {existing}"
                              + (f"; closest: {close}" if close else "") + ".")


def check_feeds(feeds: list[Feed], input_names: list[str], input_specs) -> None:
    """What feeds each input against the input: their number, the type of the values (numbers for a number
    input, strings or encoded images for a string input), a column of flat arrays or encoded images feeding
    an input of rank 3 or more without a per-row shape, and a per-row shape that differs from the input's.

    Raises:
        InputSpecError: the number of inputs, a missing per-row shape, or a per-row shape that does not fit.
        ColumnError: values of a type the input cannot take (strings for a number input).
    """
    if len(feeds) != len(input_names):
        raise InputSpecError(f"The data gives {len(feeds)} feature column(s) {[f.name for f in feeds]}; the net takes "
                             f"{len(input_names)} input(s): {input_names}.")
    for feed, name, spec in zip(feeds, input_names, input_specs):
        _check_type(feed, name, spec)
        _check_shape(feed, name, spec)


def _check_type(feed: Feed, name: str, spec) -> None:
    wants_strings = getattr(spec, "dtype", None) is not None and spec.dtype.name == "string"
    kind = feed.kind
    if wants_strings:
        if kind not in ("strings", "image"):
            raise ColumnError(f"Column {feed.name!r} holds {feed.type} values, and input {name!r} takes strings.")
        return
    if kind in ("numbers", "image"):
        return
    dtype = getattr(getattr(spec, "dtype", None), "name", "numbers")
    fix = ("turn the strings into numbers first (e.g. pyspark.ml.feature.StringIndexer, or a lookup inside the "
           "model)" if kind == "strings" else "give a column of numbers, arrays of numbers, or encoded images")
    raise ColumnError(f"Column {feed.name!r} holds {feed.type} values, and input {name!r} takes {dtype} numbers: "
                      f"{fix}.")


def _check_shape(feed: Feed, name: str, spec) -> None:
    shape = getattr(spec, "shape", None)
    if shape is None or shape.rank is None:
        return
    row = tuple(shape.as_list()[1:])
    if feed.shape is None:
        if len(row) >= 2 and (feed.kind == "image" or feed.flat):
            shape = tuple(d or 0 for d in row)
            if feed.kind == "image":
                raise InputSpecError(
                    f"Column {feed.name!r} holds encoded images, and input {name!r} takes rows of shape {row}: pass "
                    f"feature_shapes={{{feed.name!r}: {shape}}} (the per-row shape) to TFDataset.from_dataframe or "
                    "from_parquet, so that the ranks can decode them; numpy arrays must hold the decoded pixels.")
            raise InputSpecError(
                f"Column {feed.name!r} holds flat arrays, and input {name!r} takes rows of shape {row}: pass "
                f"feature_shapes={{{feed.name!r}: {shape}}} (the per-row shape), so that the ranks can reshape it.")
        return
    if feed.kind == "image" and len(feed.shape) == 3 and not feed.declared:
        return
    if feed.shape == () and row == (1,):
        return  # one number per row for a (None, 1) input, as Keras takes it
    fits = len(feed.shape) == len(row) and all(d is None or g is None or d == g for d, g in zip(row, feed.shape))
    if not fits:
        want = tuple(d or 0 for d in row)
        if feed.shape == ():
            fix = ("the column holds one value per row: make it an array column (pyspark.sql.functions.array, or "
                   "Spark ML's VectorAssembler), or give several scalar columns as a list, stacked into one input")
        else:
            fix = (f"if its rows hold {_size(want)} values, pass feature_shapes={{{feed.name!r}: {want}}} (a DataFrame "
                   f"or Parquet files) or reshape the array to (n, {', '.join(str(d) for d in want)})")
        raise InputSpecError(f"Column {feed.name!r} has rows of shape {tuple(feed.shape)}, and input {name!r} takes "
                             f"rows of shape {row} (the net's input is {tuple(shape.as_list())}, the batch first): "
                             f"{fix}.")


def _size(shape: tuple) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
