"""optim.data: every kind of data tfnet trains on, one adapter per kind, behind one protocol.

* :mod:`~optim.data.base`: the TFDataset protocol (:class:`~optim.data.base.DataAdapter`): what the driver
  asks of data (its columns and checks, how it is staged for ``n`` ranks) and what a rank asks (open its
  share, batch it, resume at batch k);
* the adapters: :mod:`~optim.data.arrays` (numpy arrays), :mod:`~optim.data.tf_data` (a ``tf.data`` input),
  :mod:`~optim.data.dataframe` (a Spark DataFrame; its partitions read by :mod:`~optim.data.partition`),
  :mod:`~optim.data.rdd` (an RDD of records), :mod:`~optim.data.parquet` (Parquet files, read by
  :mod:`~optim.data.parquet_read`), and the streamed form of the last three (:mod:`~optim.data.stream`, over
  a local copy, :mod:`~optim.data.spool`);
* the checks every road takes: :mod:`~optim.data.checks` (columns against the net and the loss, on the
  driver) and :mod:`~optim.data.values` (labels, NaN and Inf, wherever the rows are);
* :mod:`~optim.data.factory`: :class:`TFDataset` and :func:`as_dataset`, above the adapters.

Outside this package no code asks which kind of data it holds.
"""

from optim.data.base import DataAdapter, Staged, StageHost
from optim.data.factory import DEFAULT_BATCH_SIZE, TFDataset, as_dataset, in_input_order, in_output_order, resolve_batch_size
from optim.shares import Opened, RankData, RankEnv

__all__ = ["DEFAULT_BATCH_SIZE", "DataAdapter", "Opened", "RankData", "RankEnv", "StageHost", "Staged",
           "TFDataset", "as_dataset", "in_input_order", "in_output_order", "resolve_batch_size"]
