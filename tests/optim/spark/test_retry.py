"""Errors cross the Spark boundary as data, and the retry policy decides from that data; the
driver's stuck-rank rule and the ranks' watchdog."""

import os
import re

import pytest

from optim.errors import (
    BadRowError,
    DistributedTrainingError,
    NonFiniteLossError,
    RendezvousError,
    SparkSetupError,
    StorageError,
    WorkerError,
)
from optim.launch.retry import RetryPolicy, stage_error
from optim.transport.failures import WorkerFailure, from_exception, pick_root, to_exception


def raised(exc):
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001
        return caught


def test_an_optim_error_round_trips_with_its_traceback():
    failure = from_exception(raised(NonFiniteLossError("Step 3: the loss is nan")), rank=1)
    again = WorkerFailure.from_json(failure.to_json())
    assert again == failure and not again.retryable
    err = to_exception(again)
    assert type(err) is NonFiniteLossError and str(err) == "Step 3: the loss is nan (rank 1)"
    assert "raise exc" in err.worker_traceback and "NonFiniteLossError" in err.worker_traceback
    # one line on the console says where; the whole traceback with TFNET_VERBOSE=1
    assert len(err.__notes__) == 1 and re.fullmatch(
        r"Raised on rank 1 at \S*test_retry.py:\d+ \(raised\); the rank's traceback is in the error's "
        r"`worker_traceback` \(TFNET_VERBOSE=1 prints it\).", err.__notes__[0]), err.__notes__


def test_the_whole_rank_traceback_is_a_note_when_verbose(monkeypatch):
    monkeypatch.setenv("TFNET_VERBOSE", "1")
    err = to_exception(from_exception(raised(NonFiniteLossError("Step 3: the loss is nan")), rank=1))
    assert err.__notes__[0].startswith("Traceback on rank 1:\nTraceback (most recent call last):")


@pytest.mark.parametrize("exc, cls, retryable", [
    (ValueError("bad"), ValueError, False),
    (TypeError("bad"), TypeError, False),
    (BadRowError("row 3"), BadRowError, False),
    (ModuleNotFoundError("No module named 'tfnet'"), SparkSetupError, False),
    (AttributeError("'NoneType' object has no attribute 'x'"), WorkerError, False),
    (ConnectionResetError("peer gone"), WorkerError, True),
    (RendezvousError("late"), RendezvousError, True),
    # what TensorFlow raises on a rank whose peer was killed mid-allreduce
    (RuntimeError("Graph execution error: ... Horovod has been shut down. This was caused by an exception on one "
                  "of the ranks ..."), WorkerError, True),
])
def test_classes_and_retryability(exc, cls, retryable):
    err = to_exception(from_exception(raised(exc), rank=0))
    assert type(err) is cls and err.retryable is retryable


def test_a_programming_error_is_not_retried_and_names_the_original_class():
    err = to_exception(from_exception(raised(AttributeError("no attribute 'x'")), rank=1))
    assert str(err) == "Rank 1 failed with AttributeError: no attribute 'x'"
    assert not RetryPolicy(2).should_retry(err, attempt=0)


def test_the_rank_that_failed_first_on_its_own_is_the_root():
    peer = WorkerFailure("HorovodInternalError", "peer gone", True, "tb", rank=0, time=2.0)
    own = WorkerFailure("ValueError", "bad label", False, "tb", rank=1, time=3.0)
    assert pick_root([peer, own]) is own
    assert pick_root([peer]) is peer and pick_root([]) is None


def test_stage_error_without_reports_comes_from_spark():
    err = stage_error(RuntimeError("Python worker exited unexpectedly (crashed)"), [])
    assert type(err) is DistributedTrainingError and err.retryable
    assert "no report from a rank (Python worker exited unexpectedly (crashed))" in str(err)
    err = stage_error(RuntimeError("java.lang.OutOfMemoryError: Java heap space at awaitResult"), [])
    assert not err.retryable and "spark.driver.memory" in str(err)
    own = WorkerFailure("ValueError", "bad label", False, "tb", rank=1, time=3.0)
    assert type(stage_error(RuntimeError("whatever Py4J says"), [own])) is ValueError


@pytest.mark.parametrize("spark_says, fix", [
    ("An error occurred while calling o1237.collectToPython.\n: org.apache.spark.scheduler."
     "BarrierJobRunWithDynamicAllocationException: [SPARK-24942]: Barrier execution mode does not support dynamic "
     "resource allocation for now.", "spark.dynamicAllocation.enabled=false"),
    ("org.apache.spark.scheduler.BarrierJobSlotsNumberCheckFailed: [SPARK-24819]: Barrier execution mode does not "
     "allow run a barrier stage that requires more slots than the total number of slots in the cluster currently.",
     "fewer ranks (num_workers)"),
    ("org.apache.spark.scheduler.BarrierJobUnsupportedRDDChainException: [SPARK-24820][SPARK-24821]", "repartition"),
    ("java.lang.ClassNotFoundException: com.example.Missing", "spark.jars"),
    ("Could not serialize object: TypeError: cannot pickle '_thread.RLock' object", "picklable"),
])
def test_sparks_deterministic_refusals_are_not_retried(spark_says, fix):
    err = stage_error(RuntimeError(spark_says), [])
    assert type(err) is DistributedTrainingError and not err.retryable
    assert str(err).startswith("Training failed: Spark refused the training stage, and would again: ")
    assert fix in str(err) and len(str(err).splitlines()) <= 5
    assert not RetryPolicy(max_retries=5).should_retry(err, 0)


def test_a_job_the_workers_cannot_unpickle_is_not_retried():
    """Spark's text when a worker's Python cannot unpickle the stage's function (a class of the user's own that only
    the driver has), as local[2] gave it: the error line from the worker's traceback, and no retry."""
    spark_says = (
        "An error occurred while calling o668.collectToPython.\n: org.apache.spark.SparkException: Job aborted due to "
        "stage failure: Could not recover from a failed barrier ResultStage.\n"
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the Python "
        "worker: Traceback (most recent call last):\n"
        '  File "/venv/pyspark.zip/pyspark/worker.py", line 598, in read_single_udf\n'
        "    f, return_type = read_command(pickleSer, udf)\n"
        '  File "/venv/pyspark.zip/pyspark/worker_util.py", line 75, in read_command\n'
        "    command = serializer.loads(file)\n"
        '  File "/venv/pyspark.zip/pyspark/serializers.py", line 483, in loads\n'
        "    return cloudpickle.loads(obj, encoding=encoding)\n"
        "TypeError: Could not locate class 'HalfSquares'. Make sure custom classes and functions are decorated\n"
        " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException")
    err = stage_error(RuntimeError(spark_says), [])
    assert type(err) is DistributedTrainingError and not err.retryable
    assert str(err).startswith("Training failed: the workers could not unpickle the training job (TypeError: Could not "
                               "locate class 'HalfSquares'.")
    assert not RetryPolicy(max_retries=5).should_retry(err, 0)
    # a worker's error after the job was read (a rank's own code) is not this
    assert stage_error(RuntimeError(spark_says.replace("in read_command", "in main")), []).retryable


def test_retry_policy():
    retryable = DistributedTrainingError("lost")
    policy = RetryPolicy(max_retries=2)
    assert policy.should_retry(retryable, 0) and policy.should_retry(retryable, 1)
    assert not policy.should_retry(retryable, 2), "no attempts left"
    assert not policy.should_retry(retryable, 0, spark_stopped=True)
    assert not policy.should_retry(ValueError("x"), 0)
    with pytest.raises(ValueError, match=r"`max_retries` must be a non-negative integer. Received: max_retries=-1"):
        RetryPolicy(-1)


def test_a_full_disk_or_read_only_folder_is_not_retried():
    import errno

    for code in (errno.ENOSPC, errno.EROFS, errno.EACCES):
        err = to_exception(from_exception(raised(OSError(code, os.strerror(code), "/data/run/ckpt.npz")), rank=0))
        assert type(err) is StorageError and not err.retryable and isinstance(err, OSError)
        assert "a rerun would fail the same way" in str(err) and "/data/run/ckpt.npz" in str(err)
        assert not RetryPolicy(2).should_retry(err, attempt=0)
    # the same through a cause (a checkpoint write wraps it)
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("writing failed") from inner
    except RuntimeError as outer:
        assert from_exception(outer).cls == "StorageError"
    # a connection reset still retries
    assert from_exception(raised(ConnectionResetError(errno.ECONNRESET, "reset"))).retryable


def test_a_result_too_large_for_the_driver_is_not_retried():
    text = ("Job aborted due to stage failure: Total size of serialized results of 1 tasks (1100.0 MiB) is bigger "
            "than spark.driver.maxResultSize (1024.0 MiB)")
    err = stage_error(RuntimeError(text), [])
    assert type(err) is DistributedTrainingError and not err.retryable
    assert "spark.driver.maxResultSize" in str(err) and "model_dir" in str(err)


def test_stuck_rank_reads_the_heartbeats():
    from optim.transport.store import STUCK_GRACE_S, stuck_rank

    now = 1000.0
    assert stuck_rank({}, 2, now, started=now - 10, startup_timeout=60) is None
    assert "rank 0 sent no heartbeat within 60 s" in stuck_rank({}, 2, now, now - 100, 60)
    fresh = {"phase": "training", "idle": 1.0, "bound": 5.0, "received": now - 1}
    assert stuck_rank({0: fresh, 1: fresh}, 2, now, now - 500, 60) is None
    # a long validation: idle between kicks is short, the heartbeat keeps changing
    assert stuck_rank({0: fresh, 1: dict(fresh, phase="validation")}, 2, now, now - 500, 60) is None
    # a checkpoint write in the long phase: idle 100 s, bound 600 s
    assert stuck_rank({0: fresh, 1: dict(fresh, idle=100.0, bound=600.0)}, 2, now, now - 500, 60) is None
    # a frozen process: its heartbeat stopped changing
    frozen = dict(fresh, received=now - 5.0 - STUCK_GRACE_S - 1)
    why = stuck_rank({0: fresh, 1: frozen}, 2, now, now - 500, 60)
    assert why.startswith("rank 1 made no progress for") and "while training (its bound: 5 s)" in why


def test_watchdog_phases_have_their_own_bound(monkeypatch):
    """A bound of 1 s, and 6 s inside a phase: 2.5 s in the phase is within it; after it, kicks
    every 0.3 s keep the short bound; 1.5 s without one is past it (the process would end); so is
    6.5 s in a phase. The watchdog's thread, which ends the process when this says so, is
    tests/optim/spark/test_distributed_units.py's."""
    from optim.rank import watchdog
    from tests.clock import VirtualClock

    clock = VirtualClock()
    monkeypatch.setattr(watchdog, "time", clock)
    dog = watchdog.Watchdog(1.0, "test", long_timeout_s=6.0)  # not started: its thread would read the real clock
    with dog.phase("a long phase"):
        clock.sleep(2.5)  # past the short bound, inside the long one
        assert dog.overdue() is None and dog.bound == 6.0
    assert dog.bound == 1.0 and dog.overdue() is None  # leaving the phase counts as progress
    dog.kick("short")
    for _ in range(5):
        clock.sleep(0.3)
        assert dog.overdue() is None
        dog.kick()
    clock.sleep(1.5)
    assert dog.overdue() == ("test: nothing happened for 2 s (bound 1 s) while short; ending this task so the stage "
                             "fails and can be retried.")
    dog.kick()
    with dog.phase("a long phase"):
        clock.sleep(6.5)
        assert dog.overdue().startswith("test: nothing happened for 6 s (bound 6 s) while a long phase")


def test_watchdog_heartbeat_says_phase_and_bound():
    import json

    from optim.rank.watchdog import Watchdog

    dog = Watchdog(5.0, long_timeout_s=50.0)
    with dog.phase("writing a checkpoint"):
        beat = json.loads(dog.heartbeat())
    assert beat["phase"] == "writing a checkpoint" and beat["bound"] == 50.0 and beat["seq"] == 1
    after = json.loads(dog.heartbeat())
    assert after["bound"] == 5.0 and after["seq"] == 2


def test_retry_warning_keeps_a_graph_error_on_one_line():
    from optim.launch.launcher import one_line

    graph_error = ("Rank 0 failed with UnknownError: Graph execution error:\n\nDetected at node tfnet_loss defined at"
                   " (most recent call last):\n  File \"<frozen runpy>\", line 198\n\nHorovod has been shut down.")
    assert one_line(graph_error) == ("Rank 0 failed with UnknownError: Graph execution error: ... "
                                     "Horovod has been shut down.")
    assert one_line("x" * 400, limit=20) == "x" * 17 + "..."
    assert one_line("  only line \n") == "only line"


def test_a_spark_exception_carrying_a_tfnet_error_becomes_both():
    """What a lazy result's action raises: pyspark's exception, retyped as the worker's tfnet error."""
    from optim.errors import typed_spark_error

    class PythonException(Exception):  # stands in for pyspark's, whose text holds the worker's traceback
        def __str__(self):
            return ("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
                    '  File "optim/predict/worker.py", line 130, in _predict_chunk\n'
                    "optim.errors.BadRowError: Column 'x', row 4 of partition 1: the value is null.\n\nJVM stacktrace: ...")

    original = PythonException()
    err = typed_spark_error(original)
    assert isinstance(err, BadRowError) and isinstance(err, PythonException) and isinstance(err, ValueError)
    assert str(err) == "Column 'x', row 4 of partition 1: the value is null."
    assert err.spark_error is original and "JVM stacktrace" in err.worker_traceback
    assert typed_spark_error(err) is err
    plain = RuntimeError("no tfnet error named here")
    assert typed_spark_error(plain) is plain


def test_a_stage_error_without_reports_that_names_a_tfnet_error_is_that_error():
    text = ("Job aborted due to stage failure: ... Traceback (most recent call last):\n"
            "optim.errors.BadRowError: Column 'x' is null at row 3 of partition 1; every training row needs a value.")
    err = stage_error(RuntimeError(text), [])
    assert isinstance(err, BadRowError) and not err.retryable and not RetryPolicy(2).should_retry(err, attempt=0)
    assert str(err) == "Column 'x' is null at row 3 of partition 1; every training row needs a value."
