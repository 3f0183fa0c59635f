"""What :meth:`TFPredictor.predict <optim.predict.predictor.TFPredictor.predict>` takes: one road per kind of input,
picked once, as :func:`optim.data.factory.as_dataset` picks a data adapter. Driver side.

* a Spark DataFrame (classic or Connect): the DataFrame with the output columns added;
* an RDD of elements: an RDD of outputs;
* a TFDataset (:mod:`optim.data`) that predicts over Spark (``from_dataframe``, ``from_rdd``, ``from_parquet``,
  ``from_delta``): its own :meth:`~optim.data.base.DataAdapter.predict_with` (Parquet files and a Delta table are
  read as a DataFrame of every column of the files: :mod:`optim.data.parquet_frame`), with its own feature columns;
* numpy arrays (one array, a list in input order or a dict by input name; anything array-like): run here.

Anything else is a TypeError naming these kinds, before any Spark job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from optim.errors import ColumnError

__all__ = ["KINDS", "Road", "road_for"]

#: The kinds of input, as errors name them.
KINDS = ("a Spark DataFrame", "an RDD", "a TFDataset (from_dataframe, from_rdd, from_parquet, from_delta)",
         "numpy arrays (one array, a list in input order or a dict by input name)")


@dataclass(frozen=True)
class Road:
    """One kind of input: what it is called, and whether it takes ``feature_cols`` and ``output_cols``."""

    name: str
    feature_cols: bool
    output_cols: bool
    #: ``run(predictor, data, feature_cols, output_cols)``: the predictor's method for this kind.
    run: Callable[..., Any]

    def check_columns(self, data, feature_cols, output_cols) -> None:
        """Raises ColumnError for columns given to a kind that does not take them."""
        if (feature_cols is not None and not self.feature_cols) or (output_cols is not None and not self.output_cols):
            raise ColumnError(_columns_message(self, data))


def _columns_message(road: Road, data) -> str:
    if road.output_cols:  # a TFDataset: it names its own feature columns
        return (f"{type(data).__name__} names its feature columns itself (feature_cols when it was made); "
                "predict() takes only output_cols for it.")
    return (f"feature_cols and output_cols apply to DataFrames; received a {type(data).__name__}. "
            "Pass RDD elements and numpy inputs in input order, or as a dict by input name.")


def _dataframe(predictor, data, feature_cols, output_cols):
    return predictor.predict_frame(data, feature_cols, output_cols)


def _rdd(predictor, data, feature_cols, output_cols):
    return predictor.predict_records(data)


def _dataset(predictor, data, feature_cols, output_cols):
    if not data.supports("predict_with"):
        raise data.unsupported("predict_with", "TFPredictor.predict takes " + ", ".join(KINDS))
    data.bind(predictor.input_names, predictor.snapshot.input_specs())  # its columns against the inputs, first
    return data.predict_with(predictor, predictor.batch_per_thread, output_cols=output_cols)


def _arrays(predictor, data, feature_cols, output_cols):
    return predictor.predict_local(data)


DATAFRAME = Road("a Spark DataFrame", True, True, _dataframe)
RDD = Road("an RDD", False, False, _rdd)
DATASET = Road("a TFDataset", False, True, _dataset)
ARRAYS = Road("numpy arrays", False, False, _arrays)


def road_for(data) -> Road:
    """The road for ``data``.

    Raises:
        TypeError: a kind of input none of the roads takes (naming those it takes).
    """
    from pyspark import RDD as SparkRDD
    from pyspark.sql import DataFrame

    from optim.data.base import DataAdapter

    if isinstance(data, DataFrame):  # classic and Connect DataFrames alike
        return DATAFRAME
    if isinstance(data, SparkRDD):
        return RDD
    if isinstance(data, DataAdapter):
        return DATASET
    if _array_like(data):
        return ARRAYS
    raise TypeError(f"TFPredictor.predict takes {', '.join(KINDS[:-1])} or {KINDS[-1]}. Received: "
                    f"{type(data).__module__}.{type(data).__qualname__}")


def _array_like(data) -> bool:
    """Numpy arrays as ``TFNet.forward`` takes them: arrays, tensors, lists, tuples and dicts of them, numbers,
    strings, and anything with ``__array__`` (a pandas frame)."""
    if isinstance(data, (np.ndarray, np.generic, list, tuple, Mapping, int, float, complex, str, bytes)):
        return True
    if hasattr(data, "__array__"):
        return True
    import tensorflow as tf

    return tf.is_tensor(data)
