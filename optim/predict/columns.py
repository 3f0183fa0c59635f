"""Driver side: matching DataFrame columns to a model's inputs and outputs.

:func:`plan_columns` checks every choice against the DataFrame's schema before any job runs, and
returns a :class:`ColumnPlan`: plain data that the workers receive with the job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optim.arrow import ColumnRead, is_image_shape
from optim.errors import ColumnError
from optim.predict.snapshot import TensorInfo
from tfnet.errors import unknown_name_message

__all__ = ["InputColumn", "OutputColumn", "ColumnPlan", "plan_columns", "ColumnSpec", "OUTPUT_COLUMN",
           "default_output_columns"]

ColumnSpec = str | Sequence[str] | Mapping[str, str] | None

# numpy dtype of a model output -> (numpy dtype the column holds, Spark type name)
_OUTPUT_TYPES = {
    "float16": ("float32", "float"), "bfloat16": ("float32", "float"), "float32": ("float32", "float"),
    "float64": ("float64", "double"), "int8": ("int8", "byte"), "int16": ("int16", "short"),
    "int32": ("int32", "integer"), "int64": ("int64", "long"), "uint8": ("int16", "short"),
    "uint16": ("int32", "integer"), "uint32": ("int64", "long"), "bool": ("bool", "boolean"),
    "string": ("object", "binary"),
}


@dataclass(frozen=True)
class InputColumn:
    """One feature column and the graph input it feeds.

    Attributes:
        column: The column name.
        input: The graph input.
        kind: ``"array"``, ``"scalar"``, ``"image"`` or ``"bytes"`` (the kinds of
            :mod:`optim.arrow`).
        depth: For arrays: 1 for a flat array (reshaped to the input's per-row shape), or the
            input's rank for nested arrays.
    """

    column: str
    input: TensorInfo
    kind: str
    depth: int = 0

    @property
    def reading(self) -> ColumnRead:
        """How :func:`optim.arrow.read_column` reads this column for the input: images (and raw pixels) for a float
        input as decoded, uint8 unless one was resized, for the engine to cast (inside the graph: ``TFNet.input_dtypes``);
        anything else as the input's dtype."""
        as_decoded = self.input.dtype == "string" or (self.kind == "image" and "float" in self.input.dtype)
        dtype = None if as_decoded else self.input.dtype
        shape = tuple(self.input.row_shape) if self.input.row_shape is not None else None
        return ColumnRead(self.kind, shape, dtype, self.input.name)


@dataclass(frozen=True)
class OutputColumn:
    """One output column: the graph output it holds, and the numpy dtype of its values."""

    column: str
    output: TensorInfo
    dtype: str


@dataclass(frozen=True)
class ColumnPlan:
    inputs: tuple[InputColumn, ...]
    outputs: tuple[OutputColumn, ...]
    error_col: str | None

    def output_fields(self) -> list:
        """The Spark fields the prediction adds, after the input columns."""
        from pyspark.sql import types as T

        _SPARK_TYPES = {"float": T.FloatType, "double": T.DoubleType, "byte": T.ByteType, "short": T.ShortType,
                        "integer": T.IntegerType, "long": T.LongType, "boolean": T.BooleanType,
                        "binary": T.BinaryType}
        fields = []
        for out in self.outputs:
            spark_type = _SPARK_TYPES[_OUTPUT_TYPES.get(out.output.dtype, ("object", "binary"))[1]]()
            for _ in range(len(out.output.row_shape)):
                spark_type = T.ArrayType(spark_type, containsNull=False)
            fields.append(T.StructField(out.column, spark_type, nullable=True))
        if self.error_col:
            fields.append(T.StructField(self.error_col, T.StringType(), nullable=True))
        return fields


def default_column(tensor: TensorInfo) -> str:
    """``"img:0"`` -> ``"img"``; characters other than letters, digits and ``_`` become ``_``."""
    return re.sub(r"[^0-9A-Za-z_]", "_", tensor.short_name)


#: The raw output column of a one-output model. (``"prediction"`` is Spark ML's double: a class index
#: or a value; see :mod:`optim.predict.classification`.)
OUTPUT_COLUMN = "output"


def default_output_columns(outputs: Sequence[TensorInfo]) -> list[str]:
    """``["output"]`` for one output, else the output names (``"y1:0"`` -> ``"y1"``)."""
    return [OUTPUT_COLUMN] if len(outputs) == 1 else [default_column(t) for t in outputs]


def input_columns(inputs, feature_cols: ColumnSpec) -> list[str]:
    """The column of each input, in input order (``feature_cols`` given, or the default names);
    names that are not strings are returned as they are, for :func:`plan_columns` to refuse."""
    cols = feature_cols if feature_cols is not None else [default_column(t) for t in inputs]
    try:
        return [c for c in _arrange(cols, inputs, "feature_cols") if isinstance(c, str)]
    except (TypeError, ValueError, KeyError):
        return []


def plan_columns(schema, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
                 feature_cols: ColumnSpec = None, output_cols: ColumnSpec = None,
                 error_col: str | None = None) -> ColumnPlan:
    """Checks the column choices against ``schema`` (a ``StructType``) and the model.

    Args:
        schema: The DataFrame's schema.
        inputs: The graph inputs.
        outputs: The graph outputs.
        feature_cols: One column per input: a name (one input), a list in input order, or a dict
            ``{input name: column}``. Default: the columns named like the inputs (``"img:0"`` ->
            ``"img"``).
        output_cols: One new column per output, the same forms. Default: ``"output"`` for one
            output, else the output names (``"y1:0"`` -> ``"y1"``).
        error_col: A new string column for per-row errors (``on_error="null"``), or None.

    Raises:
        ColumnError: a missing column, a column the input cannot take, an output column that
            already exists, or the wrong number of columns.
    """
    names = list(schema.names)
    if feature_cols is None:
        feature_cols = [default_column(t) for t in inputs]
        missing = [c for c in feature_cols if c not in names]
        if missing:
            raise ColumnError(
                f"feature_cols was not given, and the DataFrame has no column {missing[0]!r} for input "
                f"{_input_for(missing[0], inputs, feature_cols)}. Pass feature_cols (one column per input, "
                f"in the order {[t.name for t in inputs]}). Columns: {names}."
            )
    columns = _arrange(feature_cols, inputs, "feature_cols")
    plan_in = []
    for column, tensor in zip(columns, inputs):
        if column not in names:
            raise ColumnError(
                unknown_name_message("column", column, names) + f" (feature_cols, for input {tensor.name!r})")
        plan_in.append(_input_column(column, schema[column].dataType, tensor))

    if output_cols is None:
        output_cols = default_output_columns(outputs)
    out_names = _arrange(output_cols, outputs, "output_cols")
    taken = set(names)
    plan_out = []
    for column, tensor in zip(out_names + ([error_col] if error_col else []), list(outputs) + [None]):
        if column in taken:
            what = "already exists in the DataFrame" if column in names else "is used twice"
            raise ColumnError(
                f"Output column {column!r} {what}; every input column is kept, so choose new names "
                f"(output_cols, or error_col for the error column). Columns: {names}."
            )
        taken.add(column)
        if tensor is not None:
            if tensor.row_shape is None:
                raise ColumnError(f"Output {tensor.name!r} has an unknown rank; a column needs a fixed nesting depth.")
            plan_out.append(OutputColumn(column, tensor, _OUTPUT_TYPES.get(tensor.dtype, ("object", "binary"))[0]))
    return ColumnPlan(tuple(plan_in), tuple(plan_out), error_col)


def _input_for(column: str, inputs: Sequence[TensorInfo], defaults: list[str]) -> str:
    return repr(inputs[defaults.index(column)].name)


def _arrange(spec: ColumnSpec, tensors: Sequence[TensorInfo], what: str) -> list[str]:
    """Column names in graph order from a name, a list, or a dict keyed by tensor name."""
    wanted = [t.name for t in tensors]
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, Mapping):
        by_name = {}
        for key, column in spec.items():
            full = key if ":" in str(key) else f"{key}:0"
            if full not in wanted:
                raise ColumnError(unknown_name_message(f"{what} key (tensor name)", str(key), wanted))
            by_name[full] = column
        missing = [w for w in wanted if w not in by_name]
        if missing:
            raise ColumnError(f"{what} names no column for {missing}; the graph has {wanted}.")
        spec = [by_name[w] for w in wanted]
    if not isinstance(spec, (list, tuple)) or not all(isinstance(c, str) for c in spec):
        raise ColumnError(
            f"`{what}` must be a column name, a list of names or a dict by tensor name. Received: {spec!r}")
    if len(spec) != len(tensors):
        raise ColumnError(
            f"`{what}` must name {len(tensors)} column(s), one per tensor {wanted}; received {len(spec)}: {list(spec)}."
        )
    return list(spec)


def _dtype_kind(dtype: str) -> str:
    if dtype == "string":
        return "string"
    if dtype == "bool":
        return "bool"
    return "float" if "float" in dtype else "int"


_ACCEPTS = {"float": ("float", "int", "bool"), "int": ("int", "bool"), "bool": ("bool",), "string": ()}


def _leaf_kind(spark_type) -> str | None:
    from pyspark.sql import types as T

    if isinstance(spark_type, (T.FloatType, T.DoubleType, T.DecimalType)):
        return "float"
    if isinstance(spark_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return "int"
    if isinstance(spark_type, T.BooleanType):
        return "bool"
    return None


def _input_column(column: str, spark_type, tensor: TensorInfo) -> InputColumn:
    from pyspark.sql import types as T

    shape, want = tensor.row_shape, _dtype_kind(tensor.dtype)
    takes = _what_it_takes(tensor)

    def refuse(reason: str):
        raise ColumnError(
            f"Column {column!r} ({spark_type.simpleString()}) cannot feed input {tensor.describe()}: "
            f"{reason}. That input takes {takes}."
        )

    known = shape is not None and all(d is not None for d in shape)
    if isinstance(spark_type, T.ArrayType):
        depth, leaf = 0, spark_type
        while isinstance(leaf, T.ArrayType):
            depth, leaf = depth + 1, leaf.elementType
        if want == "string" or _leaf_kind(leaf) not in _ACCEPTS[want]:
            refuse(f"its elements are {leaf.simpleString()}")
        if not known:
            refuse("the input's per-row shape is not fully known, so an array cannot be reshaped to it")
        if depth not in (1, len(shape)):
            refuse(f"it is nested {depth} deep; use a flat array or one nested {len(shape)} deep")
        return InputColumn(column, tensor, "array", depth)
    if isinstance(spark_type, T.BinaryType):
        if want == "string":
            return InputColumn(column, tensor, "bytes")
        if is_image_shape(shape) and want in ("float", "int"):
            return InputColumn(column, tensor, "image")
        refuse("binary columns hold encoded images, which need an input of per-row shape "
               "(height, width, channels) with known sizes and 1, 3 or 4 channels")
    if isinstance(spark_type, T.StringType):
        if want == "string":
            return InputColumn(column, tensor, "bytes")
        refuse("strings feed string inputs only")
    if _leaf_kind(spark_type) is not None:
        if want != "string" and _leaf_kind(spark_type) in _ACCEPTS[want] and known and math.prod(shape) == 1:
            return InputColumn(column, tensor, "scalar")
        refuse("a number per row feeds only an input with one value per row")
    refuse("this column type is not supported (for ML vectors, convert with "
           "pyspark.ml.functions.vector_to_array first)")


def _what_it_takes(tensor: TensorInfo) -> str:
    kind = _dtype_kind(tensor.dtype)
    if kind == "string":
        return "a string or binary column"
    n = "?" if tensor.row_shape is None or None in tensor.row_shape else math.prod(tensor.row_shape)
    text = f"an array column of {n} numbers per row (flat, or nested to the per-row shape)"
    if n == 1:
        text += ", or a numeric column"
    if is_image_shape(tensor.row_shape):
        text += ", or a binary column of encoded images (JPEG, PNG, GIF or BMP) or of raw uint8 pixels"
    return text
