"""Subclassed Keras models (``call`` written by hand, as Keras's guide "Making new layers and models via
subclassing" writes them) through ``TFNet.from_keras``: frozen on the shapes of their first call or on an
``input_signature`` as ``model.export`` takes it, and checked against Keras itself (forward, ``tf.GradientTape``'s
gradients, one SGD step, ``fit``) and against TensorFlow's own converter of the same model."""

import traceback

import keras
import numpy as np
import pytest
import tensorflow as tf

from optim import TFOptimizer
from tests.keras_subclassed import subclassed_cnn
from tests.optim.keras_transfer import LR_HEAD, data, keras_fit, max_diff
from tests.tfnet import fidelity as fd
from tfnet import InputSpecError, KerasSourceError, TFNet


class TokensAndExtra(keras.Model):
    """Two positional inputs, integer token ids and floats, and a dict of outputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Embedding(10, 4)
        self.dense = keras.layers.Dense(4)

    def call(self, tokens, extra):
        return {"logits": self.dense(keras.ops.mean(self.embed(tokens), axis=1) + extra), "doubled": extra * 2.0}


class DictInput(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(2)

    def call(self, inputs):
        return self.dense(inputs["a"]) + inputs["b"]


@keras.saving.register_keras_serializable("tfnet_tests")
class Registered(keras.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(units)

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@pytest.mark.parametrize("path", ["from_keras", "converter"])
def test_a_subclassed_model_matches_keras(tmp_path, path):
    model, x = subclassed_cnn()
    case = {c.path: c for c in fd.keras_cases("SmallCNN", model, x, str(tmp_path))}[path]
    net, errors = fd.compare(case)  # forward 1e-5, every gradient 1e-4, the trainable set, one SGD step 1e-3
    assert not sorted(case.oracle.frozen - set(net.statistics)), net.statistics  # the moving statistics found
    if path == "from_keras":
        prefix = model.name
        assert net.input_names == ["x:0"] and net.output_names == ["output_0:0"]
        assert net.trainable == [f"{prefix}/conv/kernel", f"{prefix}/conv/bias", f"{prefix}/bn/gamma",
                                 f"{prefix}/bn/beta", f"{prefix}/head/kernel", f"{prefix}/head/bias"]
        assert net.trainable == [v.path for v in model.trainable_variables]


def test_two_inputs_need_an_input_signature_and_a_dict_of_outputs_is_named_by_its_keys():
    keras.utils.set_random_seed(0)
    model = TokensAndExtra()
    rng = np.random.default_rng(0)
    tokens, extra = rng.integers(0, 10, (3, 6)).astype(np.int32), rng.normal(size=(3, 4)).astype(np.float32)
    model(tokens, extra)
    with pytest.raises(InputSpecError, match=r"takes 2 inputs \(tokens, extra\); Keras recorded the shape of 1"):
        TFNet.from_keras(model)  # Keras records only the first argument's shape, as model.export says
    net = TFNet.from_keras(model, input_signature=[tf.TensorSpec((None, 6), tf.int32),
                                                   keras.InputSpec(shape=(None, 4), dtype="float32")])
    assert net.input_names == ["tokens:0", "extra:0"] and net.output_names == ["doubled:0", "logits:0"]
    want = model(tokens, extra)
    got = dict(zip(["doubled", "logits"], net.forward([tokens, extra])))
    for key in ("doubled", "logits"):
        np.testing.assert_allclose(got[key], want[key].numpy(), rtol=1e-6, atol=1e-7)
    # gradients against Keras's tape: the float input's and every weight's (the embedding's as a dense array)
    g = [rng.normal(size=(3, 4)).astype(np.float32) for _ in range(2)]
    extra_t = tf.constant(extra)
    with tf.GradientTape() as tape:
        tape.watch(extra_t)
        out = model(tokens, extra_t)
        objective = tf.reduce_sum(out["doubled"] * g[0]) + tf.reduce_sum(out["logits"] * g[1])
    grads = tape.gradient(objective, [extra_t, *model.trainable_variables])
    grad_x, grad_w = net.backward([tokens, extra], g)
    assert grad_x[0] is None  # integer ids have no gradient
    np.testing.assert_allclose(grad_x[1], grads[0].numpy(), rtol=1e-5, atol=1e-6)
    for var, want_g in zip(model.trainable_variables, grads[1:]):
        np.testing.assert_allclose(grad_w[var.path], tf.convert_to_tensor(want_g).numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=var.path)


def test_a_dict_input_a_model_only_built_and_one_never_called():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    model = DictInput()
    x = {"a": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=(3, 2)).astype(np.float32)}
    model(x)
    net = TFNet.from_keras(model)
    assert net.input_names == ["a:0", "b:0"]
    np.testing.assert_allclose(net.forward(x), model(x).numpy(), rtol=1e-6, atol=1e-7)
    other = {"a": rng.normal(size=(5, 4)).astype(np.float32), "b": rng.normal(size=(5, 2)).astype(np.float32)}
    np.testing.assert_allclose(net.forward(other), model(other).numpy(), rtol=1e-6, atol=1e-7)  # any batch size
    # built with build(shape) and never called (no weights yet): frozen on the recorded shape, its weights made then
    built = Registered()
    with pytest.warns(UserWarning, match="does not have a `build\\(\\)` method"):
        built.build((None, 5))
    assert not built.weights
    net = TFNet.from_keras(built)
    assert len(built.weights) == 4 and net.weight_names == [v.path for v in built.weights]
    x5 = rng.normal(size=(7, 5)).astype(np.float32)
    np.testing.assert_allclose(net.forward(x5), built(x5).numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(InputSpecError, match="was never called. Call it once on data, or pass input_signature"):
        TFNet.from_keras(Registered())
    with pytest.raises(TypeError, match="input_signature's entries are tf.TensorSpec or keras.InputSpec"):
        TFNet.from_keras(Registered(), input_signature=[(None, 5)])
    # a signature the model does not take: Keras's reason in a typed error, without TensorFlow's tracing frames
    with pytest.raises(InputSpecError, match=r"fails when called on its input signature \(x \(None, 7\) float32\): "
                       r".*expected axis -1 of input shape to have value 5") as raised:
        TFNet.from_keras(built, input_signature=[tf.TensorSpec((None, 7), tf.float32)])
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert len("".join(traceback.format_exception(raised.value)).splitlines()) <= 25


@pytest.mark.parametrize("frozen_bn", [True, False], ids=["bn-frozen", "bn-trained"])
def test_a_compiled_subclassed_model_trains_as_keras_fit(frozen_bn):
    """``TFOptimizer.from_keras`` on a compiled subclassed model against Keras's own ``fit`` (plain SGD, one epoch):
    its batch norm frozen, or trainable (normalized by each batch's statistics, its moving ones moving, as ``call``
    passes ``training`` on), its dropout at 0.5 drawing in each step the noise ``fit`` draws (tfnet.keras_training)."""
    x, y = data()
    reference, _ = subclassed_cnn(frozen_bn=frozen_bn)
    model, _ = subclassed_cnn(frozen_bn=frozen_bn)
    model.compile(optimizer=keras.optimizers.SGD(LR_HEAD),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    opt = TFOptimizer.from_keras(model, input_signature=[tf.TensorSpec((None, 8, 8, 3), tf.float32, name="images")])
    assert opt.net.input_names == ["images:0"]  # the spec's own name
    initial = opt.net.get_weights()
    want = keras_fit(reference, x, y, LR_HEAD, 8)
    opt.optimize((x, y), batch_size=8, shuffle=False, verbose=0)
    assert max_diff(opt.net, want) < 1e-6
    moved = [k for k, v in opt.net.get_weights().items() if not np.array_equal(v, initial[k])]
    moving = [] if frozen_bn else ["cnn/bn/moving_mean", "cnn/bn/moving_variance"]  # the statistics move as fit's
    assert sorted(moved) == sorted([v.path for v in model.trainable_variables] + moving), moved


def test_to_keras_gives_a_registered_subclass_back_and_says_why_not_for_another():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32)
    model = Registered()
    model(x)
    net = TFNet.from_keras(model)
    net.set_weights({k: v + 0.5 for k, v in net.get_weights().items()})
    back = net.to_keras()
    assert type(back) is Registered
    np.testing.assert_allclose(back(x).numpy(), net.forward(x), rtol=1e-6, atol=1e-6)
    assert not np.allclose(back(x).numpy(), model(x).numpy())  # the net's weights, not the original's
    cnn, _ = subclassed_cnn()
    with pytest.raises(KerasSourceError, match="register_keras_serializable"):
        TFNet.from_keras(cnn).to_keras()


def test_a_saved_subclassed_model_file_loads(tmp_path):
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(2).normal(size=(4, 5)).astype(np.float32)
    model = Registered(units=2)
    model(x)
    model.save(str(tmp_path / "registered.keras"))
    net = TFNet.from_keras(str(tmp_path / "registered.keras"))
    np.testing.assert_allclose(net.forward(x), model(x).numpy(), rtol=1e-6, atol=1e-7)


def test_a_functional_model_takes_its_inputs_in_one_entry_as_model_export_does():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    model = keras.Model([a, b], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
    with pytest.raises(InputSpecError, match=r"takes 1 input argument\(s\) \(inputs\); input_signature has 2 entries"):
        TFNet.from_keras(model, input_signature=[tf.TensorSpec((None, 3)), tf.TensorSpec((None, 2))])
    net = TFNet.from_keras(model, input_signature=[[tf.TensorSpec((None, 3), name="a"), tf.TensorSpec((None, 2), name="b")]])
    x = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 2), np.float32)]
    assert net.input_names == ["a:0", "b:0"]
    np.testing.assert_allclose(net.forward(x), model(x).numpy(), rtol=1e-6)
