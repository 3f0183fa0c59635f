"""Running one Spark action so that it can always be stopped. Driver side (or a Spark Connect client).

Every Spark job tfnet starts (the row counts, the workers' probe, the training stage, the warm-up)
runs here: the action (a ``collect``) in a thread of its own, inside a job group of its own (a
classic session) or under a tag of its own (a Connect client), while the caller waits. The job is
cancelled, and the waiting caller gets an error, when it runs past its bound, when ``watch`` names a
reason (a stuck rank), and when the caller is interrupted (Ctrl-C): in both modes the stage's tasks
are killed, so no rank outlives its ``optimize()``; the caller goes on once they have ended (or after
a bound), so that Spark's lines about the killed tasks do not follow it onto the console. The other half
of Ctrl-C is at the public call (:class:`optim.training.interrupts.Interruptible`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from optim.errors import DistributedTrainingError
from optim.logs import wait_for_running_tasks
from optim.spark.connect import is_connect
from optim.spark.jvm_threads import release_connection

__all__ = ["run_job", "CANCEL_GRACE_S"]

#: Seconds a cancelled job gets to end its tasks before the caller goes on.
CANCEL_GRACE_S = 30.0
#: Of those, the most the caller waits for the scheduler to run no task (which counts other jobs' tasks too).
TASKS_END_S = 10.0


class _Job:
    """One action under a group (classic) or a tag (Connect)."""

    def __init__(self, spark, description: str, kind: str):
        self.connect = is_connect(spark)
        self.spark = spark
        self.sc = None if self.connect else (spark if hasattr(spark, "setJobGroup") else spark.sparkContext)
        self.group = f"tfnet-{kind}-{uuid.uuid4().hex[:8]}"
        self.description = description

    def enter(self) -> None:
        if self.connect:
            self.spark.addTag(self.group)
        else:
            self.sc.setJobGroup(self.group, f"tfnet: {self.description}", interruptOnCancel=True)
            self.sc.addJobTag(self.group)  # cancelled by its tag: quiet when pyspark's Ctrl-C handler was first

    def leave(self) -> None:
        if self.connect:
            self.spark.removeTag(self.group)
        else:
            self.sc.removeJobTag(self.group)

    def cancel(self) -> None:
        try:
            if self.connect:
                self.spark.interruptTag(self.group)
            else:  # (cancelJobGroup warns "Failed to cancel job group" when the job is gone already)
                self.sc.cancelJobsWithTag(self.group)
        except Exception:  # noqa: BLE001 - a stopped session has nothing left to cancel
            pass

    def wait_for_tasks(self, timeout_s: float) -> None:
        """Waits (bounded) until the scheduler runs no task: a cancelled job's tasks are killed after its
        action has failed, and each kill is logged (classic; a Connect client does not see the scheduler)."""
        if not self.connect:
            wait_for_running_tasks(self.sc, timeout_s)


def run_job(spark, description: str, action: Callable, *, kind: str = "job", timeout_s: float | None = None,
            watch: Callable[[], str | None] | None = None, poll_s: float = 1.0, timeout_message: str | None = None):
    """Runs the Spark action ``action()`` and returns its result (see the module's notes).

    Args:
        spark: A SparkSession (classic or Connect) or a SparkContext.
        description: What the job does, for Spark's UI and the errors ("counting the training rows").
        kind: The job group's (or tag's) name is ``tfnet-<kind>-<random>``: ``train``, ``warm-up``,
            ``probe``, ``count``, ``evaluate``, ``slots``; Spark's UI and its REST API show it. Default "job".
        timeout_s: Seconds before the job is cancelled. Default: no bound (``watch`` decides).
        watch: Called every ``poll_s`` seconds while the job runs; a returned reason cancels it.
        timeout_message: The error's text when ``timeout_s`` passes. Default: "Spark did not finish
            <description> within <timeout_s> s; cancelled."

    Raises:
        DistributedTrainingError: the bound passed or ``watch`` gave a reason; the job was cancelled.
        KeyboardInterrupt: the caller was interrupted; the job was cancelled first.
        Whatever the action raised.
    """
    job = _Job(spark, description, kind)
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            job.enter()
            results.append(action())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            errors.append(exc)
        finally:
            try:
                job.leave()
            except Exception:  # noqa: BLE001 - a stopped session
                pass
            release_connection()  # py4j's "Closing down clientserver connection" stays out of the user's log

    thread = threading.Thread(target=run, name=f"tfnet-job-{job.group}", daemon=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    why = None
    thread.start()
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if not thread.is_alive():
                break
            if deadline is not None and time.monotonic() > deadline:
                why = timeout_message or f"Spark did not finish {description} within {timeout_s:.0f} s; cancelled."
                break
            reason = watch() if watch is not None else None
            if reason:
                why = f"The stage was cancelled: {reason}."
                break
    except BaseException:  # Ctrl-C (or any error while waiting): the job goes too, and its tasks end first
        deadline = time.monotonic() + CANCEL_GRACE_S
        job.cancel()
        thread.join(CANCEL_GRACE_S)
        job.wait_for_tasks(min(TASKS_END_S, max(0.0, deadline - time.monotonic())))
        raise
    if why is not None:
        job.cancel()
        thread.join(CANCEL_GRACE_S)
        raise DistributedTrainingError(why)
    if errors:
        raise errors[0]
    return results[0]
