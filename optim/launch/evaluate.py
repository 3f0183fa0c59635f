"""``TFOptimizer.evaluate`` and ``predict`` on distributed data (a DataFrame, an RDD, Parquet files, or
``from_tf_data``). Driver side (or a Spark Connect client).

Evaluation runs one Spark task per partition (:data:`optim.protocol.EVALUATE_ENTRY`, over what the data
adapter's :meth:`~optim.data.base.DataAdapter.evaluation` stages), with the net and
its hooks shipped as for training (:func:`optim.launch.launcher.backend_for`), and sums the loss
and metric accumulators here: metric states are sums, so the result equals an evaluation of the
collected data (counts exactly; the loss to float64 rounding). Prediction is TFPredictor's.
"""

from __future__ import annotations

import json

import numpy as np

from optim.launch.launcher import backend_for
from optim.launch.stage import Cleanup, shipped_hooks
from optim.metrics import Mean
from optim.predict.predictor import TFPredictor
from optim.protocol import EVALUATE_ENTRY, STATES_SCHEMA, EvalJob, entry
from optim.spark import typed_errors
from optim.spark.jobs import run_job
from optim.spark.session import get_spark, small_arrow_batches
from optim.training.evaluation import logs_from_states, metrics_copy
from tfnet.serialize import net_to_bytes

__all__ = ["evaluate_distributed", "predict_distributed"]


def evaluate_distributed(opt, dataset, batch_size: int, num_partitions: int | None = None) -> dict[str, float]:
    """Loss and metrics of ``opt.net`` (with its hooks) over a distributed ``dataset``. Under Spark
    Connect the net travels in the plan (up to :func:`optim.spark.connect.plan_limit` bytes)."""
    typed_errors.install()  # a rank's bad row raises its BadRowError, not Spark's PythonException
    backend = backend_for(dataset.session() or get_spark())
    with backend.quiet(1, own_bar=False), small_arrow_batches(backend.spark, dataset.arrow_batch_rows):
        # Spark's bar shows the job: tfnet shows none of its own
        return _evaluate(backend, opt, dataset, batch_size, num_partitions)


def _evaluate(backend, opt, dataset, batch_size: int, num_partitions: int | None) -> dict[str, float]:
    cleanup = Cleanup()
    try:
        net = backend.ship_evaluated_net(net_to_bytes(opt.net), cleanup)
        staged = dataset.evaluation(backend, num_partitions)
        job = EvalJob(net, opt.loss, metrics_copy(opt.metrics), batch_size, staged.rank_data,
                      hooks=shipped_hooks(opt.net), size=staged.size or 1)

        def task(rows, job=job):
            return entry(EVALUATE_ENTRY)(job, rows)

        rows = run_job(backend.spark, "evaluating", lambda: staged.collect(task, STATES_SCHEMA, barrier=False),
                       kind="evaluate")
    finally:
        cleanup.run()
    parts = [[np.asarray(s, np.float64) for s in json.loads(r[0])] for r in rows]
    shapes = [np.shape(s.state) for s in [Mean()] + metrics_copy(opt.metrics)]
    total = [sum(p[i] for p in parts).reshape(shapes[i]) for i in range(len(shapes))]
    return logs_from_states(opt.metrics, total)


def predict_distributed(net, dataset, batch_size: int):
    """The net's outputs for a distributed dataset, aligned with it: the DataFrame with an ``output`` column (or
    one per output, named after it) added, or an RDD of outputs (the adapter's
    :meth:`~optim.data.base.DataAdapter.predict_with`)."""
    return dataset.predict_with(TFPredictor(net, batch_per_thread=batch_size), batch_size)
