"""How TFPredictor's model reaches the executors, by the kind of session the data lives in. Driver side (or a
Spark Connect client).

:func:`shipping_for` picks it once per call from the DataFrame's session (or an RDD's SparkContext); the predictor
only asks it for the tasks' :class:`~optim.predict.worker.WorkerJob`, its statistics and its clean-up:

- :class:`BroadcastShipping` (a classic session): the model goes out once as a Spark broadcast, reused while the
  SparkContext lives, and the workers' statistics come back through an accumulator; :meth:`close` destroys the
  broadcast.
- :class:`PlanShipping` (Spark Connect: no SparkContext, no broadcast, no accumulator): the model travels in each
  plan, up to :func:`optim.spark.connect.plan_limit` bytes; the workers still load it once per Python worker (the
  cache is keyed by the model's checksum). No statistics come back, and nothing is kept between calls.
"""

from __future__ import annotations

import dataclasses

from optim.carriers import InBroadcast, InPlan
from optim.errors import BackendError
from optim.predict.backends import Payload
from optim.predict.columns import ColumnPlan
from optim.predict.worker import StatsParam, WorkerJob
from optim.spark.connect import is_connect, spark_context

__all__ = ["BroadcastShipping", "PlanShipping", "Shipping", "shipping_for"]


class Shipping:
    """The model on its way to one session's executors."""

    #: Whether the predictor keeps it for its next call (it holds a broadcast and the statistics).
    kept = False

    def serves(self, spark) -> bool:
        """Whether this shipping still serves ``spark`` (a session, or a SparkContext)."""
        return False

    def job(self, plan: ColumnPlan | None, batch_size: int, on_error: str) -> WorkerJob:
        """What every task gets: the model as shipped, the column ``plan`` (None: an RDD), its batch and
        ``on_error``."""
        raise NotImplementedError

    def stats(self) -> dict:
        """What the workers reported (:class:`~optim.predict.worker.StatsParam`'s keys); empty where nothing comes
        back."""
        return {}

    def close(self) -> None:
        """Takes the model away from the executors (where it was left there)."""


def _threaded(payload: Payload, num_threads: int | None, task_cpus: str | None) -> Payload:
    """``payload`` with its threads per model: ``num_threads``, else ``spark.task.cpus`` (the model id says which)."""
    threads = num_threads or int(task_cpus or 1)
    return dataclasses.replace(payload, num_threads=threads, model_id=f"{payload.model_id}-t{threads}")


class BroadcastShipping(Shipping):
    """A classic session: the model as a broadcast, the workers' statistics in an accumulator."""

    kept = True

    def __init__(self, sc, payload: Payload, num_threads: int | None):
        self.sc = sc
        payload = _threaded(payload, num_threads, sc.getConf().get("spark.task.cpus", "1"))
        self.model_id = payload.model_id
        self.broadcast = sc.broadcast(payload)
        self.accumulator = sc.accumulator({}, StatsParam())

    def serves(self, spark) -> bool:
        return spark_context(spark) is self.sc and self.sc._jsc is not None

    def job(self, plan: ColumnPlan | None, batch_size: int, on_error: str) -> WorkerJob:
        return WorkerJob(self.model_id, InBroadcast(self.broadcast), plan, batch_size, on_error, self.accumulator)

    def stats(self) -> dict:
        return dict(self.accumulator.value)

    def close(self) -> None:
        try:
            self.broadcast.destroy()
        except Exception:  # noqa: BLE001 - the SparkContext may be gone already
            pass


class PlanShipping(Shipping):
    """Spark Connect: the model in the plan itself.

    Raises:
        BackendError: the model, pickled, exceeds what a plan carries."""

    def __init__(self, spark, payload: Payload, num_threads: int | None):
        import cloudpickle

        from optim.spark.connect import plan_limit

        self.payload = _threaded(payload, num_threads, spark.conf.get("spark.task.cpus", "1"))
        size, limit = len(cloudpickle.dumps(self.payload)), plan_limit(spark)
        if size > limit:
            raise BackendError(
                f"The model ({size / 2**20:.0f} MiB as it runs) exceeds what a Spark Connect plan carries "
                f"({limit / 2**20:.0f} MiB, spark.tfnet.connect.maxPlanBytes). Raise that setting if the Connect "
                "server's spark.connect.grpc.maxInboundMessageSize and the executors' heap allow it, or predict "
                "from a classic SparkSession, which broadcasts the model.")

    def job(self, plan: ColumnPlan | None, batch_size: int, on_error: str) -> WorkerJob:
        return WorkerJob(self.payload.model_id, InPlan(self.payload), plan, batch_size, on_error, None)


def shipping_for(spark, payload: Payload, num_threads: int | None, held: Shipping | None = None) -> Shipping:
    """How ``payload`` reaches the executors of ``spark`` (a SparkSession of either kind, or a classic
    SparkContext): ``held`` (what the predictor kept from an earlier call) while it still serves that session,
    else a new shipping for the session's kind. ``num_threads``: threads per model (None: ``spark.task.cpus``)."""
    if is_connect(spark):
        return PlanShipping(spark, payload, num_threads)
    if held is not None and held.serves(spark):
        return held
    return BroadcastShipping(spark_context(spark), payload, num_threads)
