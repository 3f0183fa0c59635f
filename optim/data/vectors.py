"""Spark ML ``Vector`` columns (what ``VectorAssembler`` and the feature transformers produce) as
array columns, so that training, evaluation and prediction read them like any array column.
Driver side: the conversion is ``pyspark.ml.functions.vector_to_array``, run by Spark itself,
lazily, into a hidden column; the user's own column is left as it is."""

from __future__ import annotations

__all__ = ["HIDDEN_PREFIX", "is_vector", "vectors_as_arrays"]

HIDDEN_PREFIX = "__tfnet_array_"


def is_vector(data_type) -> bool:
    """True for ``pyspark.ml.linalg.VectorUDT`` (and the older ``pyspark.mllib`` one)."""
    return type(data_type).__name__ == "VectorUDT"


def vectors_as_arrays(df, columns) -> tuple[object, dict[str, str]]:
    """``df`` with a float32 array column added for each Vector column among ``columns`` (dense or
    sparse alike), and ``{vector column: its array column}``."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    vectors = [c for c in dict.fromkeys(columns) if c in fields and is_vector(fields[c])]
    if not vectors:
        return df, {}
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    mapping = {c: HIDDEN_PREFIX + c for c in vectors}
    for c, hidden in mapping.items():
        df = df.withColumn(hidden, vector_to_array(F.col(c), "float32"))
    return df, mapping
