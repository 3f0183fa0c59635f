"""Update rules: each method equals the Keras 3 optimiser of the same name and settings over 10
steps, every method converges on a parabola and on Rosenbrock, and bad settings are refused."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import schedules as S
from optim import transforms as T

RTOL = 1e-5


def run_ours(method, params, grads_seq):
    params = {k: tf.constant(v) for k, v in params.items()}
    state = method.init(params)
    step = tf.function(lambda g, s, p: method.update(g, s, p), autograph=False)
    for grads in grads_seq:
        updates, state = step({k: tf.constant(v) for k, v in grads.items()}, state, params)
        params = {k: params[k] + updates[k] for k in params}
    return {k: v.numpy() for k, v in params.items()}


def run_keras(opt, params, grads_seq):
    variables = {k: keras.Variable(v, name=k.replace("/", "_")) for k, v in params.items()}
    names = list(params)
    for grads in grads_seq:
        opt.apply_gradients([(tf.constant(grads[k]), variables[k]) for k in names])
    return {k: variables[k].numpy() for k in names}


def problem(seed=0, steps=10):
    rng = np.random.default_rng(seed)
    shapes = {"dense/kernel": (4, 3), "dense/bias": (3,), "conv/kernel": (2, 2, 1, 2)}
    params = {k: rng.normal(size=s).astype("float32") for k, s in shapes.items()}
    grads = [{k: rng.normal(size=s).astype("float32") for k, s in shapes.items()} for _ in range(steps)]
    return params, grads


def rel(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)


def excluding(opt, var_names):
    opt.exclude_from_weight_decay(var_names=var_names)
    return opt


KERAS_TABLE = [
    ("sgd", lambda: optim.SGD(0.1), lambda: keras.optimizers.SGD(0.1)),
    ("sgd momentum", lambda: optim.SGD(0.1, momentum=0.9), lambda: keras.optimizers.SGD(0.1, momentum=0.9)),
    ("sgd nesterov", lambda: optim.SGD(0.05, momentum=0.8, nesterov=True),
     lambda: keras.optimizers.SGD(0.05, momentum=0.8, nesterov=True)),
    ("sgd clipnorm", lambda: optim.SGD(0.1, clipnorm=0.5), lambda: keras.optimizers.SGD(0.1, clipnorm=0.5)),
    ("sgd clipvalue", lambda: optim.SGD(0.1, clipvalue=0.3), lambda: keras.optimizers.SGD(0.1, clipvalue=0.3)),
    ("sgd global_clipnorm", lambda: optim.SGD(0.1, momentum=0.5, global_clipnorm=1.0),
     lambda: keras.optimizers.SGD(0.1, momentum=0.5, global_clipnorm=1.0)),
    ("sgd weight_decay", lambda: optim.SGD(0.1, weight_decay=0.01), lambda: keras.optimizers.SGD(0.1, weight_decay=0.01)),
    ("sgd exponential schedule", lambda: optim.SGD(S.exponential(0.1, 3, 0.5), momentum=0.9),
     lambda: keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 3, 0.5), momentum=0.9)),
    ("adam", lambda: optim.Adam(0.01), lambda: keras.optimizers.Adam(0.01)),
    ("adam custom", lambda: optim.Adam(0.02, beta_1=0.8, beta_2=0.99, epsilon=1e-5),
     lambda: keras.optimizers.Adam(0.02, beta_1=0.8, beta_2=0.99, epsilon=1e-5)),
    ("adam amsgrad", lambda: optim.Adam(0.01, amsgrad=True), lambda: keras.optimizers.Adam(0.01, amsgrad=True)),
    ("adam cosine schedule", lambda: optim.Adam(S.cosine(0.01, 10, alpha=0.1)),
     lambda: keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.01, 10, alpha=0.1))),
    ("adamw", lambda: optim.AdamW(0.01), lambda: keras.optimizers.AdamW(0.01)),
    ("adamw decay", lambda: optim.AdamW(0.01, weight_decay=0.1, clipnorm=1.0),
     lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, clipnorm=1.0)),
    # Keras searches its variables' names (dense_bias here), tfnet its weights' (dense/bias): the same words
    ("adamw exclude_from_weight_decay", lambda: optim.AdamW(0.01, weight_decay=0.3, exclude_from_weight_decay=["bias"]),
     lambda: excluding(keras.optimizers.AdamW(0.01, weight_decay=0.3), ["bias"])),
    ("sgd momentum weight_decay exclude_from_weight_decay",
     lambda: optim.SGD(0.1, momentum=0.9, weight_decay=0.2, exclude_from_weight_decay=["conv", "bias"]),
     lambda: excluding(keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.2), ["conv", "bias"])),
    ("adamax", lambda: optim.Adamax(0.02, beta_1=0.8, epsilon=1e-5), lambda: keras.optimizers.Adamax(0.02, beta_1=0.8,
                                                                                                    epsilon=1e-5)),
    ("nadam", lambda: optim.Nadam(0.01), lambda: keras.optimizers.Nadam(0.01)),
    ("nadam schedule weight_decay", lambda: optim.Nadam(S.cosine(0.02, 10), beta_2=0.99, weight_decay=0.1),
     lambda: keras.optimizers.Nadam(keras.optimizers.schedules.CosineDecay(0.02, 10), beta_2=0.99, weight_decay=0.1)),
    ("lion", lambda: optim.Lion(0.001), lambda: keras.optimizers.Lion(0.001)),
    ("lion weight_decay clipnorm", lambda: optim.Lion(0.003, beta_1=0.95, weight_decay=0.5, clipnorm=0.5),
     lambda: keras.optimizers.Lion(0.003, beta_1=0.95, weight_decay=0.5, clipnorm=0.5)),
    ("adam gradient_accumulation_steps", lambda: optim.Adam(0.05, gradient_accumulation_steps=3),
     lambda: keras.optimizers.Adam(0.05, gradient_accumulation_steps=3)),
    ("sgd momentum schedule weight_decay clipnorm gradient_accumulation_steps",
     lambda: optim.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5), momentum=0.9, weight_decay=0.1,
                       clipnorm=0.5, gradient_accumulation_steps=2),
     lambda: keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5), momentum=0.9,
                                  weight_decay=0.1, clipnorm=0.5, gradient_accumulation_steps=2)),
    ("adam use_ema", lambda: optim.Adam(0.05, use_ema=True, ema_momentum=0.8),
     lambda: keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.8)),
    ("sgd momentum use_ema ema_overwrite_frequency", lambda: optim.SGD(0.1, momentum=0.9, use_ema=True,
                                                                       ema_overwrite_frequency=3),
     lambda: keras.optimizers.SGD(0.1, momentum=0.9, use_ema=True, ema_overwrite_frequency=3)),
    ("adadelta", lambda: optim.Adadelta(1.0), lambda: keras.optimizers.Adadelta(1.0)),
    ("adadelta custom weight_decay", lambda: optim.Adadelta(0.5, rho=0.8, epsilon=1e-5, weight_decay=0.1),
     lambda: keras.optimizers.Adadelta(0.5, rho=0.8, epsilon=1e-5, weight_decay=0.1)),
    ("lamb", lambda: optim.Lamb(0.01), lambda: keras.optimizers.Lamb(0.01)),
    ("lamb weight_decay exclude_from_weight_decay schedule",
     lambda: optim.Lamb(S.cosine(0.02, 10), beta_1=0.8, weight_decay=0.3, exclude_from_weight_decay=["bias"]),
     lambda: excluding(keras.optimizers.Lamb(keras.optimizers.schedules.CosineDecay(0.02, 10), beta_1=0.8,
                                             weight_decay=0.3), ["bias"])),
    ("lamb gradient_accumulation_steps", lambda: optim.Lamb(0.05, gradient_accumulation_steps=3),
     lambda: keras.optimizers.Lamb(0.05, gradient_accumulation_steps=3)),
    ("adafactor", lambda: optim.Adafactor(0.05), lambda: keras.optimizers.Adafactor(0.05)),
    ("adafactor custom weight_decay clipnorm",
     lambda: optim.Adafactor(0.5, beta_2_decay=-0.5, epsilon_2=1e-2, clip_threshold=0.5, weight_decay=0.2,
                             clipnorm=1.0),
     lambda: keras.optimizers.Adafactor(0.5, beta_2_decay=-0.5, epsilon_2=1e-2, clip_threshold=0.5,
                                        weight_decay=0.2, clipnorm=1.0)),
    ("adafactor schedule", lambda: optim.Adafactor(S.exponential(0.5, 3, 0.5)),
     lambda: keras.optimizers.Adafactor(keras.optimizers.schedules.ExponentialDecay(0.5, 3, 0.5))),
    ("ftrl", lambda: optim.Ftrl(0.1), lambda: keras.optimizers.Ftrl(0.1)),
    ("ftrl l1 l2 shrinkage beta weight_decay",
     lambda: optim.Ftrl(0.2, learning_rate_power=-0.7, initial_accumulator_value=0.5, l1_regularization_strength=0.05,
                        l2_regularization_strength=0.1, l2_shrinkage_regularization_strength=0.02, beta=0.3,
                        weight_decay=0.1),
     lambda: keras.optimizers.Ftrl(0.2, learning_rate_power=-0.7, initial_accumulator_value=0.5,
                                   l1_regularization_strength=0.05, l2_regularization_strength=0.1,
                                   l2_shrinkage_regularization_strength=0.02, beta=0.3, weight_decay=0.1)),
    ("schedule_free_adamw", lambda: optim.ScheduleFreeAdamW(0.05), lambda: keras.optimizers.ScheduleFreeAdamW(0.05)),
    ("schedule_free_adamw warmup weight_decay schedule",
     lambda: optim.ScheduleFreeAdamW(S.cosine(0.05, 10), beta_1=0.8, warmup_steps=4, weight_decay=0.2),
     lambda: keras.optimizers.ScheduleFreeAdamW(keras.optimizers.schedules.CosineDecay(0.05, 10), beta_1=0.8,
                                                warmup_steps=4, weight_decay=0.2)),
    ("muon", lambda: optim.Muon(0.02), lambda: keras.optimizers.Muon(0.02)),
    ("muon custom", lambda: optim.Muon(0.05, momentum=0.9, nesterov=False, ns_steps=3, rms_rate=None,
                                       adam_lr_ratio=0.5, weight_decay=0.1, adam_weight_decay=0.3,
                                       exclude_layers=["conv"]),
     lambda: keras.optimizers.Muon(0.05, momentum=0.9, nesterov=False, ns_steps=3, rms_rate=None, adam_lr_ratio=0.5,
                                   weight_decay=0.1, adam_weight_decay=0.3, exclude_layers=["conv"])),
    ("rmsprop", lambda: optim.RMSprop(0.01), lambda: keras.optimizers.RMSprop(0.01)),
    ("rmsprop momentum centered", lambda: optim.RMSprop(0.01, rho=0.8, momentum=0.5, centered=True),
     lambda: keras.optimizers.RMSprop(0.01, rho=0.8, momentum=0.5, centered=True)),
    ("adagrad", lambda: optim.Adagrad(0.1), lambda: keras.optimizers.Adagrad(0.1)),
    ("adagrad custom", lambda: optim.Adagrad(0.05, initial_accumulator_value=0.5, epsilon=1e-5),
     lambda: keras.optimizers.Adagrad(0.05, initial_accumulator_value=0.5, epsilon=1e-5)),
]


@pytest.mark.parametrize("name,ours,theirs", KERAS_TABLE, ids=[t[0] for t in KERAS_TABLE])
def test_method_equals_keras(name, ours, theirs):
    params, grads = problem()
    a = run_ours(ours(), params, grads)
    b = run_keras(theirs(), params, grads)
    for k in params:
        assert rel(a[k], b[k]) <= RTOL, (k, rel(a[k], b[k]))
        assert not np.array_equal(a[k], params[k]), "the weights moved"


def test_sgd_dampening_matches_pytorch_formula():
    params, grads = problem(1)
    lr, mu, tau = 0.1, 0.9, 0.3
    ours = run_ours(optim.SGD(lr, momentum=mu, dampening=tau), params, grads)
    for k, w in params.items():  # torch.optim.SGD: buf = g at step 1, then mu*buf + (1-tau)*g
        w = w.astype(np.float64).copy()
        buf = None
        for g in grads:
            g = g[k].astype(np.float64)
            buf = g.copy() if buf is None else mu * buf + (1 - tau) * g
            w -= lr * buf
        assert rel(ours[k], w) <= RTOL


def test_lars_matches_reference_formula():
    params, grads = problem(2)
    lr, mu, wd, eta = 0.5, 0.9, 1e-3, 0.01
    ours = run_ours(optim.LARS(lr, momentum=mu, weight_decay=wd, trust_coefficient=eta), params, grads)
    for k, w in params.items():
        w = w.astype(np.float64).copy()
        m = np.zeros_like(w)
        adapt = not re.search("bias", k)
        for g in grads:
            g = g[k].astype(np.float64)
            if adapt:
                g = g + wd * w
                wn, gn = np.linalg.norm(w), np.linalg.norm(g)
                g = g * (eta * wn / gn if wn > 0 and gn > 0 else 1.0)
            m = mu * m - lr * g
            w = w + m
        assert rel(ours[k], w) <= RTOL, k


def test_l2_is_added_to_the_gradient():
    params, grads = problem(3, steps=1)
    out = run_ours(optim.SGD(0.1, l2=0.5), params, grads)
    for k in params:
        np.testing.assert_allclose(out[k], params[k] - 0.1 * (grads[0][k] + 0.5 * params[k]), rtol=1e-6)


def test_per_group_methods_and_frozen_groups():
    params, grads = problem(4, steps=3)
    method = T.partition({"dense/": optim.SGD(0.1), re.compile("conv"): None})
    out = run_ours(method, params, grads)
    ref = run_ours(optim.SGD(0.1), {k: v for k, v in params.items() if k.startswith("dense/")},
                   [{k: v for k, v in g.items() if k.startswith("dense/")} for g in grads])
    for k in ("dense/kernel", "dense/bias"):
        np.testing.assert_array_equal(out[k], ref[k])
    np.testing.assert_array_equal(out["conv/kernel"], params["conv/kernel"])


# ---------------------------------------------------------------- convergence


def minimise(fn, x0, method, steps):
    x = tf.constant(np.asarray(x0, np.float32))
    params = {"x": x}
    state = method.init(params)

    @tf.function(autograph=False)
    def step(params, state):
        with tf.GradientTape() as tape:
            tape.watch(params["x"])
            value = fn(params["x"])
        g = tape.gradient(value, params["x"])
        updates, state = method.update({"x": g}, state, params)
        return {"x": params["x"] + updates["x"]}, state

    for _ in range(steps):
        params, state = step(params, state)
    return params["x"].numpy()


def parabola(x):
    return tf.reduce_sum(tf.square(x - tf.constant([3.0, -2.0])))


def rosenbrock(x):
    return tf.square(1.0 - x[0]) + 100.0 * tf.square(x[1] - tf.square(x[0]))


CONVERGENCE = [
    ("sgd", lambda: optim.SGD(0.05), lambda: optim.SGD(1.5e-3, momentum=0.9)),
    ("sgd nesterov", lambda: optim.SGD(0.05, momentum=0.9, nesterov=True),
     lambda: optim.SGD(1e-3, momentum=0.9, nesterov=True)),
    ("adam", lambda: optim.Adam(0.1), lambda: optim.Adam(S.cosine(0.02, 4000, alpha=0.01))),
    ("adamw", lambda: optim.AdamW(0.1, weight_decay=1e-4), lambda: optim.AdamW(S.cosine(0.02, 4000, alpha=0.01), 1e-4)),
    ("rmsprop", lambda: optim.RMSprop(S.exponential(0.1, 100, 0.5)),
     lambda: optim.RMSprop(S.cosine(0.01, 4000, alpha=0.01))),
    ("adagrad", lambda: optim.Adagrad(1.0), lambda: optim.Adagrad(0.5)),
    ("lars", lambda: optim.LARS(S.cosine(200.0, 400), momentum=0.5, weight_decay=0.0, exclude=None),
     lambda: optim.LARS(S.cosine(30.0, 4000, alpha=0.001), momentum=0.9, weight_decay=0.0, exclude=None)),
]


@pytest.mark.parametrize("name,easy,hard", CONVERGENCE, ids=[c[0] for c in CONVERGENCE])
def test_method_converges(name, easy, hard):
    x = minimise(parabola, [0.0, 0.0], easy(), 400)
    np.testing.assert_allclose(x, [3.0, -2.0], atol=1e-2)
    x = minimise(rosenbrock, [-1.0, 1.0], hard(), 4000)
    np.testing.assert_allclose(x, [1.0, 1.0], atol=5e-2)


# ---------------------------------------------------------------- bad settings


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: optim.SGD(-0.1), r"`learning_rate` must be a non-negative number. Received: learning_rate=-0.1"),
        (lambda: optim.SGD(0.1, momentum=1.5), r"`momentum` must be a float in \[0, 1\]. Received: momentum=1.5"),
        (lambda: optim.SGD(0.1, nesterov=True), r"Nesterov momentum needs momentum > 0"),
        (lambda: optim.Adam(beta_1=1.0), r"`beta_1` must be a float in \[0, 1\). Received: beta_1=1.0"),
        (lambda: optim.AdamW(weight_decay=-1), r"`weight_decay` must be a non-negative float"),
        (lambda: optim.SGD(0.1, clipnorm=1.0, clipvalue=1.0), r"at most one of `clipnorm`"),
        (lambda: optim.SGD(0.1, clipnorm=-1.0), r"`clipnorm` must be a non-negative number"),
        (lambda: S.cosine(0.1, 0), r"`decay_steps` must be positive. Received: decay_steps=0"),
        (lambda: S.warmup(0.1, -5), r"`warmup_steps` must be positive"),
    ],
)
def test_bad_settings_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_unknown_option():
    with pytest.raises(TypeError, match=r"Unknown arguments \['decay'\]"):
        optim.SGD(0.1, decay=0.1)
    with pytest.raises(TypeError, match=r"`exclude_from_weight_decay` must be a list of non-empty strings or a regular "
                                        r"expression. Received: exclude_from_weight_decay=\['bias', 3\]"):
        optim.AdamW(0.1, exclude_from_weight_decay=["bias", 3])
    with pytest.raises(TypeError, match="LARS takes the weights it leaves out of its decay as `exclude`"):
        optim.LARS(0.1, exclude_from_weight_decay=["bias"])


def test_the_weights_end_as_keras_finalizes_them_with_use_ema():
    """Keras's ``finalize_variable_values`` (what ``fit`` calls at its end) gives the weights the moving average;
    ``final_weights`` of the method's state is the same."""
    params, grads = problem()
    method = optim.Adam(0.05, use_ema=True, ema_momentum=0.7)
    state = method.init({k: tf.constant(v) for k, v in params.items()})
    weights = {k: tf.constant(v) for k, v in params.items()}
    for g in grads:
        updates, state = method.update({k: tf.constant(v) for k, v in g.items()}, state, weights)
        weights = {k: weights[k] + updates[k] for k in weights}
    theirs = keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.7)
    variables = {k: keras.Variable(v, name=k.replace("/", "_")) for k, v in params.items()}
    for g in grads:
        theirs.apply_gradients([(tf.constant(g[k]), variables[k]) for k in params])
    theirs.finalize_variable_values(list(variables.values()))
    final = method.final_weights(state)
    for k in params:
        assert rel(np.asarray(final[k]), variables[k].numpy()) <= RTOL, k
        assert rel(np.asarray(final[k]), weights[k].numpy()) > 1e-3, "the average is not the last weights"
    assert optim.Adam(0.05).final_weights(optim.Adam(0.05).init(weights)) is None


def test_exclude_from_weight_decay_leaves_exactly_those_weights_undecayed():
    params, grads = problem()
    zero = [{k: np.zeros_like(v) for k, v in params.items()}]  # the decay alone moves the weights
    got = run_ours(optim.SGD(0.1, weight_decay=0.5, exclude_from_weight_decay=r"^dense/"), params, zero)
    for k in params:
        np.testing.assert_allclose(got[k], params[k] * (1.0 if k.startswith("dense/") else 0.95), rtol=1e-6)
