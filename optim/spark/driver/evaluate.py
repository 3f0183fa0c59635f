"""``TFOptimizer.evaluate`` and ``predict`` on distributed data (a DataFrame, an RDD, or
``from_tf_data``). Driver side (or a Spark Connect client).

Evaluation runs one Spark task per partition (:mod:`optim.spark.worker.evaluate`), with the net and
its hooks shipped as for training (:func:`optim.spark.driver.launcher.backend_for`), and sums the loss
and metric accumulators here: metric states are sums, so the result equals an evaluation of the
collected data (counts exactly; the loss to float64 rounding). Prediction is TFPredictor's.
"""

from __future__ import annotations

import json

import numpy as np

from optim.errors import DistributedTrainingError
from optim.spark.connect import plan_limit, session_of
from optim.spark.driver.jobs import run_job
from optim.spark.driver.launcher import backend_for
from optim.spark.driver.stage import Cleanup, shipped_hooks
from optim.spark.session import get_spark, small_arrow_batches
from optim.spark.worker.evaluate import EvalJob, evaluate_partition
from optim.training.datasets import TFDataDataset
from optim.training.evaluation import logs_from_states, metrics_copy
from tfnet.serialize import net_to_bytes

__all__ = ["evaluate_distributed", "predict_distributed"]


def evaluate_distributed(opt, dataset, batch_size: int, num_partitions: int | None = None) -> dict[str, float]:
    """Loss and metrics of ``opt.net`` (with its hooks) over a distributed ``dataset``. Under Spark
    Connect the net travels in the plan (up to :func:`optim.spark.connect.plan_limit` bytes)."""
    from optim.spark import typed_errors

    typed_errors.install()  # a rank's bad row raises its BadRowError, not Spark's PythonException
    backend = backend_for(session_of(dataset) or get_spark())
    with backend.quiet(1, own_bar=False), small_arrow_batches(backend.spark, getattr(dataset, "arrow_batch_rows", None)):
        # Spark's bar shows the job: tfnet shows none of its own
        return _evaluate(backend, opt, dataset, batch_size, num_partitions)


def _evaluate(backend, opt, dataset, batch_size: int, num_partitions: int | None) -> dict[str, float]:
    from optim.spark.datasets import DataFrameDataset, ParquetDataset, RDDDataset

    cleanup = Cleanup()
    try:
        net = _ship_net(backend, net_to_bytes(opt.net), cleanup)
        job = EvalJob(net, opt.loss, metrics_copy(opt.metrics), batch_size, hooks=shipped_hooks(opt.net))
        if isinstance(dataset, DataFrameDataset):
            job.reader = dataset.shard_reader()
            rows = _arrow_states(backend.spark, dataset.df.select(*dataset.columns()), job)
        elif isinstance(dataset, RDDDataset) and backend.mode == "classic":
            job.reader = dataset.shard_reader()
            action = dataset.rdd.mapPartitionsWithIndex(lambda i, it, job=job: [evaluate_partition(job, i, it)]).collect
            rows = run_job(backend.spark, "evaluating", action, kind="evaluate")
        elif isinstance(dataset, (TFDataDataset, ParquetDataset)):  # each task reads its share itself
            n = backend.partitions(num_partitions)
            job.data, job.size = dataset, n
            rows = _arrow_states(backend.spark, backend.spark.range(n, numPartitions=n), job)
        else:
            raise TypeError(f"Cannot evaluate {type(dataset).__name__} over Spark"
                            + (" Connect (it has no RDDs: pass a DataFrame)." if backend.mode == "connect" else "."))
    finally:
        cleanup.run()
    parts = [[np.asarray(s, np.float64) for s in json.loads(r)] for r in rows]
    shapes = [np.shape(s.state) for s in [_mean()] + metrics_copy(opt.metrics)]
    total = [sum(p[i] for p in parts).reshape(shapes[i]) for i in range(len(shapes))]
    return logs_from_states(opt.metrics, total)


def _ship_net(backend, data: bytes, cleanup: Cleanup):
    """The net's bytes as the tasks get them: a broadcast, or (Spark Connect) in the plan."""
    if backend.mode == "connect":
        limit = plan_limit(backend.spark)
        if len(data) > limit:
            raise DistributedTrainingError(
                f"The net ({len(data) / 2**20:.0f} MiB) exceeds what a Spark Connect plan carries "
                f"({limit / 2**20:.0f} MiB, spark.tfnet.connect.maxPlanBytes); evaluate it from a classic SparkSession, "
                "or raise that setting.")
    return backend.ship(data, cleanup)


def _arrow_states(spark, df, job: EvalJob) -> list[str]:
    """Each partition's accumulator states (JSON), through ``mapInArrow``."""

    def per_partition(batches, job=job):
        import pyarrow as pa
        from pyspark import TaskContext

        out = evaluate_partition(job, TaskContext.get().partitionId(), batches)
        yield pa.RecordBatch.from_pydict({"states": [out]})

    action = df.mapInArrow(per_partition, "states string").collect
    return [r["states"] for r in run_job(spark, "evaluating", action, kind="evaluate")]


def _mean():
    from optim.metrics import Mean

    return Mean()


def predict_distributed(net, dataset, batch_size: int):
    """The net's outputs for a distributed dataset, aligned with it: the DataFrame with an
    ``output`` column (or one per output, named after it) added, or an RDD of outputs."""
    from optim.predict.predictor import TFPredictor
    from optim.spark.datasets import DataFrameDataset, RDDDataset

    predictor = TFPredictor(net, batch_per_thread=batch_size)
    if isinstance(dataset, DataFrameDataset):
        cols = []
        for spec in dataset.features:
            if len(spec.columns) != 1:
                raise TypeError(f"predict() over a DataFrame takes one column per input; {list(spec.columns)} is a "
                                "stack of scalar columns: assemble it into an array column first.")
            cols.append(spec.columns[0])
        out = predictor.predict(dataset.df, feature_cols=cols if len(cols) > 1 else cols[0])
        return out.drop(*dataset.vectors.values()) if dataset.vectors else out
    if isinstance(dataset, RDDDataset):
        return predictor.predict(dataset.rdd.map(lambda record: record[0] if isinstance(record, tuple) else record))
    raise TypeError(f"Cannot predict on {type(dataset).__name__} over Spark.")
