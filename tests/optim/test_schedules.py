"""Learning-rate schedules against keras.optimizers.schedules."""

import keras
import numpy as np
import pytest

from optim import schedules as S

KS = keras.optimizers.schedules
STEPS = [0, 1, 2, 5, 9, 10, 11, 37, 100, 250]

TABLE = [
    ("exponential", S.exponential(0.1, 10, 0.5), KS.ExponentialDecay(0.1, 10, 0.5)),
    ("exponential staircase", S.exponential(0.1, 10, 0.5, staircase=True), KS.ExponentialDecay(0.1, 10, 0.5, staircase=True)),
    ("step decay", S.step_decay(0.1, 10, 0.5), KS.ExponentialDecay(0.1, 10, 0.5, staircase=True)),
    ("polynomial", S.polynomial(0.1, 100, 0.001, power=2.0), KS.PolynomialDecay(0.1, 100, 0.001, power=2.0)),
    ("polynomial cycle", S.polynomial(0.1, 30, 0.01, cycle=True), KS.PolynomialDecay(0.1, 30, 0.01, cycle=True)),
    ("cosine", S.cosine(0.1, 100, alpha=0.05), KS.CosineDecay(0.1, 100, alpha=0.05)),
    ("cosine with warm-up", S.warmup(S.cosine(0.2, 100, alpha=0.1), 10, start_learning_rate=0.01),
     KS.CosineDecay(0.01, 100, alpha=0.1, warmup_target=0.2, warmup_steps=10)),
]


@pytest.mark.parametrize("name,ours,theirs", TABLE, ids=[t[0] for t in TABLE])
def test_schedule_matches_keras(name, ours, theirs):
    for step in STEPS:
        np.testing.assert_allclose(float(ours(step)), float(theirs(step)), rtol=1e-5, err_msg=f"step {step}")


def test_constant_and_linear_warmup_of_any_schedule():
    assert float(S.constant(0.3)(1000)) == pytest.approx(0.3)
    sched = S.warmup(S.exponential(0.1, 10, 0.5), warmup_steps=4)
    assert [round(float(sched(s)), 6) for s in range(4)] == [0.0, 0.025, 0.05, 0.075]
    assert float(sched(4)) == pytest.approx(0.1)
    assert float(sched(14)) == pytest.approx(0.05)
    poly = S.warmup(S.polynomial(0.2, 10, 0.0), warmup_steps=5, start_learning_rate=0.1)
    assert float(poly(0)) == pytest.approx(0.1)
    assert float(poly(15)) == pytest.approx(0.0, abs=1e-7)
