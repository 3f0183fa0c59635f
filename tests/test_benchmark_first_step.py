"""benchmarks/bench_first_step.py's two cases, small and in this process: the benchmark's ratio compares like with
like only while both sides train the same model from the same weights with batch norm on the batch's statistics
(Keras's ``train_on_batch`` does; tfnet's step does with ``from_keras(train_batch_norm=True)``), so the first step's
loss is the same on both sides; and each case times its first step and the later ones."""

import sys

import pytest

from tests.benchmark_files import load


def test_both_cases_start_from_the_same_loss_and_time_their_steps(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the benchmarks put their folder first; not for later tests
    bench = load("bench_first_step")
    keras_case = bench.run_case("keras", "small", 8, 4, 2)
    tfnet_case = bench.run_case("tfnet", "small", 8, 4, 2)
    assert tfnet_case["first_loss"] == pytest.approx(keras_case["first_loss"], rel=1e-5), (keras_case, tfnet_case)
    for found in (keras_case, tfnet_case):
        assert found["first_s"] > 0 and found["first_cpu_s"] > 0 and found["later_s"] > 0, found
    assert tfnet_case["from_keras_s"] > 0
