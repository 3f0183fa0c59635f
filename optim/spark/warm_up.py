"""Warming the workers up: one small background job per application (or Connect session) that imports
TensorFlow, Horovod and tfnet in the Spark Python workers while the driver prepares the model and the
data. Driver side (or a Spark Connect client).

The first distributed ``optimize()`` otherwise waits for every worker to import TensorFlow (most of
its start-up: about 12 s on 2 cores). The warmed workers serve tfnet's later jobs because every job
tfnet runs reads its whole input (a Python worker that leaves input unread is not reused) and, in a
classic session, its DataFrame jobs share the RDD jobs' worker pool
(:func:`optim.spark.session.shared_python_workers`).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext

from optim.logs import paused_console_progress
from optim.spark.connect import is_connect, spark_context
from optim.spark.jobs import run_job
from optim.spark.jvm_threads import release_connection
from optim.spark.probe import REPORT_SCHEMA, arrow_report_fn, import_report_fn
from optim.spark.slots import connect_slots, task_slots

__all__ = ["WarmUp", "ensure_warm_up", "probe_job", "started", "warm_up_workers"]


def probe_job(spark, n: int, report_fn):
    """The action (``collect``) that runs ``report_fn`` in ``n`` tasks: an RDD job in a classic
    session, a DataFrame job of JSON reports under Spark Connect (no RDDs there)."""
    if is_connect(spark):
        return spark.range(n, numPartitions=n).mapInArrow(arrow_report_fn(report_fn), REPORT_SCHEMA).collect
    sc = spark if hasattr(spark, "parallelize") else spark.sparkContext
    return sc.parallelize(range(n), n).mapPartitions(report_fn).collect


class WarmUp:
    """A running :func:`warm_up_workers` job: ``wait(timeout)`` blocks until it is done and returns
    the workers' reports (``{"python": executable, module: error, ...}``), or None if it is still
    running."""

    def __init__(self, spark, n: int):
        self.reports: list[dict] = []
        self.error: BaseException | None = None
        self._action = probe_job(spark, n, import_report_fn())
        self._spark = spark
        self._thread = threading.Thread(target=self._run, name="tfnet-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import json

        try:
            # not shown as a stage of Spark's console progress bar: the user started no such job
            with nullcontext() if is_connect(self._spark) else paused_console_progress(spark_context(self._spark)):
                rows = run_job(self._spark, "warming up the workers' Python", self._action, kind="warm-up")
            self.reports = [r if isinstance(r, dict) else json.loads(r["report"]) for r in rows]
        except Exception as exc:  # noqa: BLE001 - optimize() checks the workers and says what is wrong
            self.error = exc
        finally:
            release_connection()  # this thread's py4j connection, closed without py4j's INFO line

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float = 600.0) -> list[dict] | None:
        """The reports, or None when the job is still running after ``timeout`` seconds (default 600)."""
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self.reports


def warm_up_workers(spark=None, num_workers: int | None = None) -> WarmUp:
    """Starts, in the background, one small Spark job per task slot that imports TensorFlow,
    Horovod and tfnet in the Python workers, and returns at once.

    The first distributed ``optimize()`` of a Spark application otherwise waits for every
    worker to import TensorFlow (most of its start-up time: about 12 s on 2 cores). Call this
    right after making the session and go on preparing data or a model on the driver;
    ``optimize()`` then finds the workers warm (with Spark's default
    ``spark.python.worker.reuse``). Errors are not raised here: ``optimize()`` checks the
    workers and reports them.

    Args:
        spark: A SparkSession (classic or Spark Connect) or a SparkContext. Default: the active session.
        num_workers: Tasks to run. Default: the cluster's task slots (under Spark Connect, the
            ``N`` of a ``local[N]`` master; pass it for another master).

    Raises:
        ValueError: no session is active, or a Connect session's slots are unknown and
            ``num_workers`` was not given.

    Example:
        >>> session = SparkSession.builder.getOrCreate()        # doctest: +SKIP
        >>> optim.warm_up_workers(session)                      # doctest: +SKIP
        >>> ...  # build the model and the data on the driver
        >>> opt.optimize(data, num_workers=2)                   # doctest: +SKIP
    """
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ValueError("warm_up_workers() needs a Spark session: none is active. Pass the session.")
    n = num_workers or _slots(spark)
    if not n:
        raise ValueError("The client of this Spark Connect session cannot count the cluster's task slots: pass "
                         "num_workers=N.")
    warm = WarmUp(spark, n)
    _STARTED[_key(spark)] = warm
    return warm


#: The warm-up started for each Spark application (by its id) or Connect session (by its id), so that
#: tfnet starts one at most.
_STARTED: dict[str, WarmUp] = {}


def _slots(spark) -> int | None:
    if is_connect(spark):
        return connect_slots(spark)
    return task_slots(spark_context(spark))


def _key(spark) -> str:
    try:
        if is_connect(spark):
            return f"connect:{spark.session_id}"
        return str(spark_context(spark).applicationId)
    except Exception:  # noqa: BLE001 - a stopped context has none
        return ""


def started(spark) -> WarmUp | None:
    """The warm-up tfnet started for ``spark``'s application (or Connect session), if any."""
    return _STARTED.get(_key(spark))


def ensure_warm_up(spark) -> WarmUp | None:
    """Starts :func:`warm_up_workers` for ``spark``'s application (or Connect session) unless it ran
    already: tfnet does it as soon as it creates a session (``build_session``) and as soon as an
    ``optimize``, ``evaluate`` or ``predict`` call has distributed data (the launcher's
    :func:`optim.launch.preflight.warm_up_for`), so the workers import TensorFlow while the driver
    checks and stages the model and the data. Nothing when the cluster has no task slot yet, or the slots of
    a Connect session's cluster are unknown. Never raises: ``optimize()`` checks the workers itself."""
    try:
        if spark is None:
            return None
        key = _key(spark)
        if not key or key in _STARTED:
            return _STARTED.get(key)
        slots = _slots(spark)
        if not slots or slots < 1:
            return None
        return warm_up_workers(spark, slots)
    except Exception:  # noqa: BLE001 - warming up is an optimisation only
        return None
