"""The retry policy of the distributed training stage. Driver side, pure.

A failed stage is retried (from the run's own newest checkpoint) when the failure is one a rerun
can fix: a lost task or executor, a timeout, a peer that went away. Errors in the data, the model or
the code, a full disk or a read-only folder, a checkpoint that cannot be written and a result too
large for the driver are raised at once, with the worker's traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

from optim.errors import DistributedTrainingError, typed_spark_error
from optim.transport.failures import WorkerFailure, pick_root, to_exception
from tfnet.errors import TFNetError

__all__ = ["Decision", "RetryPolicy", "one_line", "stage_error"]


def stage_error(exc: BaseException, failures: list[WorkerFailure], prefix: str = "Training failed") -> Exception:
    """The error for a failed stage: rebuilt from the ranks' reports when they sent one, else the
    tfnet error Spark's text names (retryable as its class says), else from what Spark says (a task
    or executor lost, out of memory), which is retryable unless the JVM ran out of heap."""
    root = pick_root(failures)
    if root is not None:
        return to_exception(root)
    exc = typed_spark_error(exc)  # no report, but Spark's text names a tfnet error: that error, typed
    if isinstance(exc, TFNetError) and hasattr(exc, "retryable"):
        return exc  # type: ignore[return-value]
    text = str(exc)
    unpickled = _unpickling_failure(text)
    if unpickled:
        return _error(f"{prefix}: the workers could not unpickle the training job ({unpickled[:300]}), and would not "
                      "again: a loss, metric, callback or hook in it refers to a class or function their Python "
                      "cannot find. Define it in a module the workers import, or register it with Keras "
                      "(@keras.saving.register_keras_serializable()).", retryable=False)
    for marks, reason in _REFUSALS:
        if any(mark in text for mark in marks):
            return _error(f"{prefix}: Spark refused the training stage, and would again: {reason}", retryable=False)
    if "spark.driver.maxResultSize" in text or "bigger than local result size limit" in text:
        return _error(f"{prefix}: rank 0's result is larger than the driver accepts (spark.driver.maxResultSize); a "
                      "rerun would fail the same way. Give model_dir shared storage (the result then moves as a file), "
                      "or raise spark.driver.maxResultSize (set before the session starts).", retryable=False)
    if "OutOfMemoryError" in text:
        where = "driver" if "executor driver" in text or "awaitResult" in text else "executor"
        return _error(f"{prefix}: a Spark JVM ran out of heap (java.lang.OutOfMemoryError, {where}). Give Spark room "
                      "for a few copies of the model: e.g. spark.driver.memory=4g (set before the session starts), "
                      "spark.executor.memory and spark.driver.maxResultSize.", retryable=False)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return _error(f"{prefix}: the stage failed with no report from a rank ({first[:500]})", retryable=True)


def _unpickling_failure(text: str) -> str | None:
    """The Python error a worker met unpickling the stage's function (PySpark's ``read_command``, before any of
    tfnet's code runs there), or None: the line that ends that traceback."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if line.rstrip().endswith("in read_command")), None)
    if at is None:
        return None
    return next((line.strip() for line in lines[at + 1:] if line and not line[0].isspace()), None)


#: Spark's deterministic refusals of a stage: (what its error says, why and the fix). A rerun meets the same refusal,
#: so none is retried.
_REFUSALS = (
    (("BarrierJobRunWithDynamicAllocationException", "SPARK-24942"),
     "barrier execution mode does not run with dynamic allocation on (SPARK-24942). Turn it off for this "
     "application (spark.dynamicAllocation.enabled=false, set before the session starts)."),
    (("BarrierJobSlotsNumberCheckFailed",),
     "the stage needs all its ranks at once and the cluster has fewer task slots than ranks "
     "(BarrierJobSlotsNumberCheckFailed). Give fewer ranks (num_workers) or more executors and cores."),
    (("BarrierJobUnsupportedRDDChainException",),
     "barrier mode does not run on this RDD chain (BarrierJobUnsupportedRDDChainException: a union, or a "
     "coalesce, before the stage); repartition the data first."),
    (("Could not serialize object",),
     "the job holds something that cannot be pickled to the ranks (Could not serialize object), so it cannot be sent "
     "at all. Make what the job carries picklable: a TFNet, numpy arrays, a DataFrame, or TFDataset.from_tf_data(fn) "
     "with fn(rank, size) building each rank's dataset."),
    (("java.lang.ClassNotFoundException", "java.lang.NoClassDefFoundError"),
     "a class the job needs is missing from the cluster's classpath (ClassNotFoundException): add its jar "
     "(spark.jars) or remove the setting that names it."),
)


def _error(message: str, retryable: bool) -> DistributedTrainingError:
    err = DistributedTrainingError(message)
    err.retryable = retryable  # type: ignore[attr-defined]
    return err


def one_line(text: str, limit: int = 300) -> str:
    """An error in one line for a warning: its first line, and its last when they differ (a TF
    graph error's first line says where, its last says what), cut to ``limit`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    short = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return short if len(short) <= limit else short[:limit - 3] + "..."


@dataclass(frozen=True)
class Decision:
    """What to do after a failed attempt of the stage (:meth:`RetryPolicy.decide`): ``retry`` it,
    or raise ``error``. ``failure`` is the attempt's failure to record (None when it is not one a
    rerun could mend)."""

    retry: bool
    error: Exception
    failure: str | None = None

@dataclass
class RetryPolicy:
    """Whether to run the stage again.

    Args:
        max_retries: Reruns after the first attempt. Default 2.
    """

    max_retries: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.max_retries, int) or isinstance(self.max_retries, bool) or self.max_retries < 0:
            raise ValueError(f"`max_retries` must be a non-negative integer. Received: max_retries={self.max_retries!r}")

    def should_retry(self, error: BaseException, attempt: int, spark_stopped: bool = False) -> bool:
        """True to rerun after ``error`` on attempt ``attempt`` (0-based)."""
        return bool(getattr(error, "retryable", False)) and not spark_stopped and attempt < self.max_retries

    def decide(self, exc: BaseException, reports: list[WorkerFailure], attempt: int, *, stopped: bool,
               failures: list[str]) -> Decision:
        """The decision after attempt ``attempt`` (0-based) failed with ``exc``, the ranks having sent
        ``reports``; ``stopped``: the session is gone; ``failures``: the failures recorded so far.
        Pure: the launcher carries the decision out."""
        err = stage_error(exc, reports)
        if not getattr(err, "retryable", False):
            return Decision(False, err)
        if stopped:
            return Decision(False, DistributedTrainingError(
                f"The SparkContext stopped during training, so the stage cannot be retried: {err}"))
        told = [*failures, str(err)]
        if not self.should_retry(err, attempt):
            return Decision(False, DistributedTrainingError(
                f"Distributed training failed {len(told)} time(s), the last time with: {told[-1]}"), str(err))
        return Decision(True, err, str(err))
