"""The optax-style parts: each ``scale_by_*`` chained with ``scale_by_learning_rate`` (and ``trace``
for momentum) equals the Keras 3 optimiser over 10 steps; the rate is read at the step count;
``chain`` and ``partition`` refuse a state made by another optimiser; groups train apart."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import schedules as S
from optim import transforms as T
from optim.errors import OptimizerStateError
from tests.optim.test_methods import RTOL, problem, rel, run_keras, run_ours
from tfnet import TFNetError

KS = keras.optimizers.schedules

PARTS_TABLE = [
    ("adam", lambda: T.chain(T.scale_by_adam(), T.scale_by_learning_rate(0.01)), lambda: keras.optimizers.Adam(0.01)),
    ("adam amsgrad custom", lambda: T.chain(T.scale_by_adam(0.8, 0.99, 1e-5, amsgrad=True), T.scale_by_learning_rate(0.02)),
     lambda: keras.optimizers.Adam(0.02, beta_1=0.8, beta_2=0.99, epsilon=1e-5, amsgrad=True)),
    ("adam schedule", lambda: T.chain(T.scale_by_adam(), T.scale_by_learning_rate(S.cosine(0.01, 10, alpha=0.1))),
     lambda: keras.optimizers.Adam(KS.CosineDecay(0.01, 10, alpha=0.1))),
    ("adamw", lambda: T.chain(T.scale_by_adam(), T.add_decayed_weights(0.1), T.scale_by_learning_rate(0.01)),
     lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)),
    ("rmsprop schedule", lambda: T.chain(T.scale_by_rms(), T.scale_by_learning_rate(S.exponential(0.01, 3, 0.5))),
     lambda: keras.optimizers.RMSprop(KS.ExponentialDecay(0.01, 3, 0.5))),
    ("rmsprop centered momentum",
     lambda: T.chain(T.scale_by_rms(rho=0.8, centered=True), T.scale_by_learning_rate(0.01), T.trace(0.5)),
     lambda: keras.optimizers.RMSprop(0.01, rho=0.8, momentum=0.5, centered=True)),
    ("adagrad", lambda: T.chain(T.scale_by_adagrad(0.5, 1e-5), T.scale_by_learning_rate(0.05)),
     lambda: keras.optimizers.Adagrad(0.05, initial_accumulator_value=0.5, epsilon=1e-5)),
    ("sgd", lambda: T.chain(T.scale_by_learning_rate(0.1)), lambda: keras.optimizers.SGD(0.1)),
    ("sgd momentum schedule", lambda: T.chain(T.scale_by_learning_rate(S.exponential(0.1, 3, 0.5)), T.trace(0.9)),
     lambda: keras.optimizers.SGD(KS.ExponentialDecay(0.1, 3, 0.5), momentum=0.9)),
    ("sgd nesterov", lambda: T.chain(T.scale_by_learning_rate(0.05), T.trace(0.8, nesterov=True)),
     lambda: keras.optimizers.SGD(0.05, momentum=0.8, nesterov=True)),
    ("sgd momentum decoupled decay",
     lambda: T.chain(T.scale_by_learning_rate(0.1), T.trace(0.9), T.decoupled_weight_decay(0.05, 0.1)),
     lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.05)),
    ("clip then sgd", lambda: T.chain(T.clip_by_global_norm(1.0), T.scale_by_learning_rate(0.1), T.trace(0.5)),
     lambda: keras.optimizers.SGD(0.1, momentum=0.5, global_clipnorm=1.0)),
]


@pytest.mark.parametrize("name,ours,theirs", PARTS_TABLE, ids=[t[0] for t in PARTS_TABLE])
def test_parts_equal_keras(name, ours, theirs):
    params, grads = problem(5)
    a = run_ours(ours(), params, grads)
    b = run_keras(theirs(), params, grads)
    for k in params:
        assert rel(a[k], b[k]) <= RTOL, (k, rel(a[k], b[k]))
        assert not np.array_equal(a[k], params[k]), "the weights moved"


DECAY_TABLE = [
    ("sgd momentum", lambda: optim.SGD(S.exponential(0.1, 3, 0.5), momentum=0.9, weight_decay=0.05),
     lambda: keras.optimizers.SGD(KS.ExponentialDecay(0.1, 3, 0.5), momentum=0.9, weight_decay=0.05)),
    ("rmsprop momentum", lambda: optim.RMSprop(0.01, momentum=0.5, weight_decay=0.1),
     lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, weight_decay=0.1)),
    ("adamw schedule", lambda: optim.AdamW(S.cosine(0.01, 10), weight_decay=0.1),
     lambda: keras.optimizers.AdamW(KS.CosineDecay(0.01, 10), weight_decay=0.1)),
    ("adagrad", lambda: optim.Adagrad(0.1, weight_decay=0.1), lambda: keras.optimizers.Adagrad(0.1, weight_decay=0.1)),
]


@pytest.mark.parametrize("name,ours,theirs", DECAY_TABLE, ids=[t[0] for t in DECAY_TABLE])
def test_weight_decay_stays_out_of_the_momentum_as_in_keras(name, ours, theirs):
    """Methods put decoupled decay before the rate (optax's AdamW) or, with momentum, last with its
    own reading of the rate; both equal Keras' ``weight_decay``, schedules included."""
    params, grads = problem(10)
    a = run_ours(ours(), params, grads)
    b = run_keras(theirs(), params, grads)
    for k in params:
        assert rel(a[k], b[k]) <= RTOL, (k, rel(a[k], b[k]))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: T.scale_by_adam(beta_2=1.0), r"`beta_2` must be a float in \[0, 1\). Received: beta_2=1.0"),
        (lambda: T.scale_by_rms(rho=-0.1), r"`rho` must be a float in \[0, 1\). Received: rho=-0.1"),
        (lambda: T.scale_by_adagrad(epsilon=-1), r"`epsilon` must be a non-negative number. Received: epsilon=-1"),
        (lambda: T.scale_by_learning_rate(-0.5), r"`learning_rate` must be a non-negative number. Received: learning_rate=-0.5"),
        (lambda: T.trace(1.5), r"`momentum` must be a float in \[0, 1\]. Received: momentum=1.5"),
        (lambda: T.trace(0.9, dampening=2), r"`dampening` must be a float in \[0, 1\]. Received: dampening=2"),
        (lambda: optim.RMSprop(momentum=-1), r"`momentum` must be a float in \[0, 1\]. Received: momentum=-1"),
    ],
)
def test_bad_part_settings_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_rate_inside_the_momentum_is_what_keras_does_under_a_schedule():
    """optax's order (trace, then the rate) equals Keras' for a constant rate but not for a schedule:
    the reason SGD puts scale_by_learning_rate before trace."""
    params, grads = problem(6)
    keras_sgd = lambda lr: keras.optimizers.SGD(lr, momentum=0.9)
    const = run_ours(T.chain(T.trace(0.9), T.scale_by_learning_rate(0.1)), params, grads)
    ref = run_keras(keras_sgd(0.1), params, grads)
    assert all(rel(const[k], ref[k]) <= RTOL for k in params)
    sched = S.exponential(0.1, 2, 0.3)
    lr_last = run_ours(T.chain(T.trace(0.9), T.scale_by_learning_rate(sched)), params, grads)
    lr_first = run_ours(T.chain(T.scale_by_learning_rate(sched), T.trace(0.9)), params, grads)
    ref = run_keras(keras_sgd(KS.ExponentialDecay(0.1, 2, 0.3)), params, grads)
    assert all(rel(lr_first[k], ref[k]) <= RTOL for k in params)
    assert all(rel(lr_last[k], ref[k]) > 1e-2 for k in params)


def test_scale_by_learning_rate_reads_the_schedule_at_the_step_count():
    sched = S.step_decay(0.5, step_size=2, gamma=0.1)
    t = T.scale_by_learning_rate(sched)
    ascent = T.scale_by_learning_rate(sched, flip_sign=False)
    g = {"w": tf.constant([1.0, -2.0])}
    state, state_up = t.init(g), ascent.init(g)
    for step in range(5):
        expected = float(sched(step))
        updates, state = t.update(g, state)
        up, state_up = ascent.update(g, state_up)
        np.testing.assert_allclose(updates["w"].numpy(), [-expected, 2 * expected], rtol=1e-6)
        np.testing.assert_allclose(up["w"].numpy(), [expected, -2 * expected], rtol=1e-6)
        assert int(state.count) == step + 1
    assert float(sched(4)) == pytest.approx(0.005)


def test_trace_dampening_is_pytorchs():
    mu, tau = 0.9, 0.3
    t = T.trace(mu, dampening=tau)
    u = [{"w": tf.constant([float(i + 1)])} for i in range(4)]
    state, buf = t.init(u[0]), None
    for ui in u:
        out, state = t.update(ui, state)
        x = float(ui["w"][0])
        buf = x if buf is None else mu * buf + (1 - tau) * x  # torch.optim.SGD's buffer
        assert float(out["w"][0]) == pytest.approx(buf, rel=1e-6)


def test_state_survives_flatten_and_pack_as_a_checkpoint_does():
    """The loop saves the state's leaves and packs them back into the init() structure: the chain
    accepts the packed state and continues as if never interrupted."""
    params, grads = problem(7, steps=6)
    method = optim.SGD(S.cosine(0.1, 6), momentum=0.9, weight_decay=0.01)
    p = {k: tf.constant(v) for k, v in params.items()}
    straight = method.init(p)
    resumed = method.init(p)
    for raw in grads:
        g = {k: tf.constant(v) for k, v in raw.items()}
        u1, straight = method.update(g, straight, p)
        leaves = [np.array(x) for x in tf.nest.flatten(resumed)]
        resumed = tf.nest.pack_sequence_as(method.init(p), [tf.constant(x) for x in leaves])
        u2, resumed = method.update(g, resumed, p)
        for k in p:
            np.testing.assert_array_equal(u1[k].numpy(), u2[k].numpy())
    assert int(tf.nest.flatten(resumed)[0]) == 6


W = {"dense/kernel": tf.ones([2, 2]), "dense/bias": tf.ones([2])}


@pytest.mark.parametrize(
    "method,state_from,match",
    [
        (lambda: optim.SGD(0.1), lambda: optim.Adam(0.1),
         r"chain of 1 transforms expects a tuple of 1 states \(CountState\); received 2 \(ScaleByAdamState, CountState\)"),
        (lambda: optim.SGD(0.1, momentum=0.9), lambda: optim.Adam(0.1),
         r"expects a tuple of 2 states \(CountState, TraceState\); received 2 \(ScaleByAdamState, CountState\)"),
        (lambda: optim.Adam(0.1, clipnorm=1.0), lambda: optim.Adam(0.1),
         r"chain of 3 transforms expects a tuple of 3 states \(EmptyState, ScaleByAdamState, CountState\); received 2"),
        (lambda: T.chain(T.scale_by_adam(), T.scale_by_learning_rate(0.1)), lambda: T.scale_by_adam(),
         r"expects a tuple of 2 states .*; received one ScaleByAdamState\. The state was made by another optimiser"),
        (lambda: T.partition({"dense/": optim.SGD(0.1)}), lambda: T.partition({"dense/k": optim.SGD(0.1), "dense/b": None}),
         r"This partition has 1 groups \(\['dense/'\]\) and expects a PartitionState of 1; received 2 groups"),
    ],
    ids=["shorter", "same length other parts", "longer", "not a tuple", "partition"],
)
def test_a_state_from_another_optimiser_is_refused(method, state_from, match):
    state = state_from().init(W)
    with pytest.raises(OptimizerStateError, match=match) as info:
        method().update(W, state, W)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TFNetError)


def test_chain_checks_the_state_inside_tf_function():
    sgd = optim.SGD(0.1, momentum=0.9)
    state = sgd.init(W)
    step = tf.function(lambda g, s: sgd.update(g, s, W), autograph=False)
    _, state = step(W, state)
    assert int(state[1].count) == 1
    with pytest.raises(OptimizerStateError, match="received 2 \\(ScaleByAdamState, CountState\\)"):
        step(W, optim.Adam(0.1).init(W))


def test_partition_groups_train_apart():
    """The first matching key wins (the regex before the prefix here); a None group and an
    unmatched weight stay frozen; each group equals its transform run on that group alone."""
    params, grads = problem(8, steps=4)
    rng = np.random.default_rng(9)
    for extra in ("conv/bias", "other/w"):
        params[extra] = rng.normal(size=(3,)).astype("float32")
        for g in grads:
            g[extra] = rng.normal(size=(3,)).astype("float32")
    adam = lambda: T.chain(T.scale_by_adam(), T.scale_by_learning_rate(0.05))
    sgd = lambda: T.chain(T.scale_by_learning_rate(0.1), T.trace(0.9))
    groups = {re.compile(r"kernel$"): adam(), "dense/": sgd(), "conv/": None}
    out = run_ours(T.partition(groups), params, grads)

    def alone(transform, names):
        return run_ours(transform, {k: params[k] for k in names}, [{k: g[k] for k in names} for g in grads])

    expected = {**alone(adam(), ["dense/kernel", "conv/kernel"]), **alone(sgd(), ["dense/bias"])}
    for k, v in expected.items():
        np.testing.assert_array_equal(out[k], v)
        assert not np.array_equal(v, params[k])
    for frozen in ("conv/bias", "other/w"):
        np.testing.assert_array_equal(out[frozen], params[frozen])
    assert T.assign_groups(list(groups), list(params)) == {
        "dense/kernel": 0, "dense/bias": 1, "conv/kernel": 0, "conv/bias": 2, "other/w": None}
