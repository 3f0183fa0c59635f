"""The driver<->rank protocol (optim.protocol) and the launcher's states (optim.launch.states), without
Spark: rank 0's payload read back whole, a local run's result and a distributed one's alike, jobs that pickle,
entry points that resolve, and every state's place on the run's path."""

import pickle

import numpy as np
import pytest

from optim.launch.states import RunStateType
from optim.protocol import (
    EVALUATE_ENTRY,
    RESULT_FORMAT,
    TRAIN_ENTRY,
    Channels,
    Limits,
    RankJob,
    RunResult,
    TrainSpec,
    entry,
    pack_result,
    unpack_result,
)
from tfnet.container import ContainerError


def test_rank_zeros_payload_comes_back_whole():
    state = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int64)]
    server = (np.ones(4, np.float32),)
    result = RunResult({"loss": [0.5, 0.25]}, 16, state, start_step=8, resumed_from="ckpt-8.npz",
                       exchange_state=server, stopped=True)
    weights = {"dense/kernel:0": np.full((3, 2), 0.5, np.float32), "dense/bias:0": np.zeros(2, np.float32)}
    back = unpack_result(pack_result(weights, result, {"rows": [100, 98], "steps_per_epoch": 4, "attempt": 2}))
    assert list(back.weights) == list(weights) and all(np.array_equal(back.weights[k], v) for k, v in weights.items())
    assert len(back.state) == 2 and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(back.state, state))
    assert len(back.exchange_state) == 1 and np.array_equal(back.exchange_state[0], server[0])
    assert (back.history, back.step, back.start_step, back.resumed_from, back.stopped) == \
        ({"loss": [0.5, 0.25]}, 16, 8, "ckpt-8.npz", True)
    assert (back.rows, back.steps_per_epoch, back.run) == ([100, 98], 4, {"attempt": 2})


def test_a_payload_of_something_else_is_refused():
    from tfnet.container import pack

    with pytest.raises(ContainerError):
        unpack_result(pack("tfnet-net-1", {}, {}))
    with pytest.raises(ContainerError):
        unpack_result(b"not a payload")
    assert RESULT_FORMAT == "tfnet-rank-result-1"


def test_last_run_is_the_summary_with_where_the_run_started():
    result = RunResult({}, 10, [], start_step=4, resumed_from="x", run={"attempts": 1, "mode": "classic"})
    assert result.last_run() == {"attempts": 1, "mode": "classic", "start_step": 4, "resumed_from": "x"}


def test_a_rank_job_pickles_and_its_entry_points_resolve():
    job = RankJob(TrainSpec(net=b"net", hooks=None, loss="mse", method=None, metrics=[], config=None),
                  data=None, channels=Channels(rendezvous=None, rendezvous_key=b"k"), limits=Limits(timeout_s=5.0),
                  size=2, attempt=1)
    back = pickle.loads(pickle.dumps(job))
    assert back == job and back.limits.long_s == 600.0 and Limits(timeout_s=900.0).long_s == 900.0
    assert entry(TRAIN_ENTRY).__name__ == "run_task" and entry(EVALUATE_ENTRY).__name__ == "evaluate_task"


def test_every_state_says_whether_the_run_is_over_and_whether_an_attempt_starts():
    terminal = {s.label for s in RunStateType if s.terminal}
    new_attempt = {s.label for s in RunStateType if s.new_attempt}
    assert terminal == {"finished", "failed"}
    assert new_attempt == {"retrying", "shrinking", "growing"}
