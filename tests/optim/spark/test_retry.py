"""Errors cross the Spark boundary as data, and the retry policy decides from that data."""

import pytest

from optim.errors import (
    BadRowError,
    DistributedTrainingError,
    NonFiniteLossError,
    RendezvousError,
    SparkSetupError,
    WorkerError,
)
from optim.spark.driver.retry import RetryPolicy, stage_error
from optim.spark.failures import WorkerFailure, from_exception, pick_root, to_exception


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
    assert type(err) is NonFiniteLossError and str(err) == "Step 3: the loss is nan"
    assert "raise exc" in err.worker_traceback and "NonFiniteLossError" in err.worker_traceback
    assert any("Traceback on rank 1" in note for note in getattr(err, "__notes__", []))


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


def test_retry_policy():
    retryable = DistributedTrainingError("lost")
    policy = RetryPolicy(max_retries=2)
    assert policy.should_retry(retryable, 0) and policy.should_retry(retryable, 1)
    assert not policy.should_retry(retryable, 2), "no attempts left"
    assert not policy.should_retry(retryable, 0, spark_stopped=True)
    assert not policy.should_retry(ValueError("x"), 0)
    with pytest.raises(ValueError, match=r"`max_retries` must be a non-negative integer. Received: max_retries=-1"):
        RetryPolicy(-1)
