"""One optimiser state: local and distributed optimize() calls on one TFOptimizer continue from
each other as if every step had run in one mode."""

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests import digits
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_opt():
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    # Adam's moments and the schedule's step count are both in the state
    return TFOptimizer(net, SCE, optim.Adam(optim.schedules.exponential(0.01, 2, 0.5)))


def test_local_distributed_local_equals_one_mode(spark):
    x, y = digits.load()
    x, y = x[:128], y[:128]
    kw = dict(epochs=1, batch_size=32, shuffle=False, verbose=0)
    reference = make_opt()
    for _ in range(3):
        reference.optimize((x, y), **kw)
    mixed = make_opt()
    mixed.optimize((x, y), **kw)
    mixed.optimize((x, y), num_workers=2, **kw)  # two ranks of 16 rows see the same rows as one of 32
    assert mixed.last_run["num_workers"] == 2
    mixed.optimize((x, y), **kw)
    assert mixed.global_step == reference.global_step == 12
    assert int(mixed.state[0]) == int(reference.state[0]) == 12
    for a, b in zip(mixed.state, reference.state):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for name, w in reference.net.get_weights().items():
        got = mixed.net.get_weights()[name]
        assert np.linalg.norm(got - w) <= 1e-4 * max(np.linalg.norm(w), 1e-12), name
