"""The factory above the adapters: :class:`TFDataset` (``TFDataset.from_ndarrays / from_tf_data /
from_dataframe / from_rdd / from_parquet``) and :func:`as_dataset`, which turns what ``optimize``,
``evaluate`` and ``predict`` accept into an adapter. Both sides (the factories themselves run on the driver).
"""

from __future__ import annotations

import abc

import numpy as np
import tensorflow as tf

from optim.data import stream
from optim.data.arrays import ArrayDataset
from optim.data.base import DataAdapter
from optim.data.dataframe import DataFrameDataset
from optim.data.delta import DeltaDataset
from optim.data.names import in_input_order, in_output_order
from optim.data.parquet import ParquetDataset
from optim.data.rdd import RDDDataset
from optim.data.tf_data import TFDataDataset
from optim.errors import DataError

__all__ = ["DEFAULT_BATCH_SIZE", "TFDataset", "as_dataset", "in_input_order", "in_output_order", "resolve_batch_size"]

DEFAULT_BATCH_SIZE = 32


class TFDataset(abc.ABC):  # noqa: B024 - a virtual base: the adapters register under it
    """Training, validation and evaluation data, as Analytics Zoo's TFDataset made it: the factories below
    return one adapter per kind of data (:mod:`optim.data`), and every adapter is a ``TFDataset``
    (``isinstance(TFDataset.from_ndarrays(...), TFDataset)``)."""

    @staticmethod
    def from_ndarrays(tensors, batch_size: int | None = None) -> ArrayDataset:
        """``tensors`` is ``(features, labels)`` or ``features`` alone (for prediction); features
        and labels are arrays or lists/tuples of arrays, all with the same first dimension."""
        return ArrayDataset.from_tensors(tensors, batch_size)

    @staticmethod
    def from_tf_data(dataset_or_fn) -> TFDataDataset:
        """A batched ``tf.data.Dataset``, or ``fn(rank, size) -> tf.data.Dataset``."""
        return TFDataDataset(dataset_or_fn)

    @staticmethod
    def from_dataframe(df, feature_cols, label_cols=None, feature_shapes=None, batch_size: int | None = None,
                       augment=None, weight_col: str | None = None, *, streaming: bool = True,
                       shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER, prefetch: int = stream.DEFAULT_PREFETCH,
                       local_dir: str | None = None, decode_once: bool = True) -> DataFrameDataset:
        """A Spark DataFrame; see :class:`optim.data.dataframe.DataFrameDataset`. ``batch_size``, as
        Analytics Zoo's TFDataset took it, is the global batch ``optimize`` uses by default;
        ``augment`` runs on the ranks, on training batches only; ``weight_col`` names a column of
        sample weights (default: none). With ``streaming`` (the default) each
        rank keeps its partition on local disk, still encoded, and decodes it a batch at a time, so its
        memory does not grow with its rows; ``streaming=False`` decodes the whole partition into memory
        first. ``shuffle_buffer`` (rows of a shuffle window, default 2048) and ``prefetch`` (decoded
        batches made ahead of the step, small ones in groups of about 4 MiB; default 2) set a streaming rank's memory with the batch;
        ``local_dir`` is where the local copies go (default: Spark's local dir). With ``decode_once`` (the
        default) a streamed rank decodes encoded images once, as it stores its partition, and every epoch reads
        their pixels from the local copy."""
        return DataFrameDataset(df, feature_cols, label_cols, feature_shapes, batch_size, augment, weight_col,
                                streaming=streaming, shuffle_buffer=shuffle_buffer, prefetch=prefetch,
                                local_dir=local_dir, decode_once=decode_once)

    @staticmethod
    def from_parquet(path, feature_cols, label_cols=None, feature_shapes=None, storage_options=None,
                     batch_size: int | None = None, augment=None, *, shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
                     prefetch: int = stream.DEFAULT_PREFETCH) -> ParquetDataset:
        """Parquet files (a file or a folder, Hive-style partition folders included, a local path or any
        fsspec URI such as ``s3://``), each rank reading its share of the rows straight from the files, with
        no Spark job for the data; see :class:`optim.data.parquet.ParquetDataset`. The arguments are those of
        :meth:`from_dataframe`; ``storage_options`` are fsspec's (endpoint, credentials)."""
        return ParquetDataset(path, feature_cols, label_cols, feature_shapes, storage_options, batch_size, augment,
                              shuffle_buffer=shuffle_buffer, prefetch=prefetch)

    @staticmethod
    def from_delta(path, feature_cols, label_cols=None, feature_shapes=None, version: int | None = None,
                   timestamp=None, storage_options=None, batch_size: int | None = None, augment=None, *,
                   shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
                   prefetch: int = stream.DEFAULT_PREFETCH) -> DeltaDataset:
        """A Delta Lake table (a local path or a URI such as ``s3://``) as of ``version`` or ``timestamp`` (default:
        the newest), its partition columns readable like any other, each rank reading its share of that version's
        files as :meth:`from_parquet` does, with the same checks; see :class:`optim.data.delta.DeltaDataset`. Needs
        the ``deltalake`` package (``pip install tfnet[delta]``); ``storage_options`` are fsspec's."""
        return DeltaDataset.open(path, feature_cols, label_cols, feature_shapes, version, timestamp, storage_options,
                                 batch_size, augment, shuffle_buffer=shuffle_buffer, prefetch=prefetch)

    @staticmethod
    def from_rdd(rdd, batch_size: int | None = None) -> RDDDataset:
        """A Spark RDD of ``(features, label)`` records; see :class:`optim.data.rdd.RDDDataset`."""
        return RDDDataset(rdd, batch_size)


TFDataset.register(DataAdapter)


def resolve_batch_size(dataset: DataAdapter, batch_size: int | None) -> int:
    """The batch size to use: the one given, else the one the TFDataset was made with, else 32.

    Raises:
        ValueError: both are given and differ.
    """
    own = dataset.batch_size
    if batch_size is not None and own is not None and int(batch_size) != int(own):
        raise ValueError(
            f"The TFDataset was made with batch_size={own}, and batch_size={batch_size} was given too; pass only one "
            "(they are the same setting)."
        )
    return int(batch_size if batch_size is not None else own if own is not None else DEFAULT_BATCH_SIZE)


def as_dataset(data, batch_size: int | None = None, *, need_labels: bool = True) -> DataAdapter:
    """Turns what ``optimize`` / ``evaluate`` / ``predict`` accept into a TFDataset: a TFDataset as it is, a
    ``tf.data.Dataset``, or numpy arrays (``(features, labels)``, ``(features, labels, sample weights)`` or
    features alone).

    Raises:
        TypeError: anything else.
        DataError: no labels where they are needed.
    """
    if isinstance(data, DataAdapter):
        ds = data
    elif isinstance(data, tf.data.Dataset):
        ds = TFDataDataset(data)
    elif isinstance(data, (tuple, list, np.ndarray)):
        ds = ArrayDataset.from_tensors(data, batch_size)
    else:
        raise TypeError(
            "Data must be a tuple of numpy arrays (features, labels), a tf.data.Dataset, or a "
            f"TFDataset. Received: {type(data).__name__}"
        )
    if need_labels and not ds.has_labels:
        raise DataError("Training and evaluation need labels: pass (features, labels).")
    return ds
