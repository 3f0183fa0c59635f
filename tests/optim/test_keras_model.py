"""``optim.KerasModel``: a compiled Keras model trained by tfnet through Keras's own calls. The oracle is Keras: the
same ``fit``, ``evaluate`` and ``predict`` calls on a twin model give the same history, weights (written back into
the Keras model), results and output structure."""

import keras
import numpy as np
import pytest

from optim import KerasModel
from tests.models import small_cnn
from tests.optim.keras_transfer import LR_FINE, LR_HEAD, data, transfer_model, unfreeze_all_but_batch_norm

SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def compiled_cnn():
    model = small_cnn(classes=3)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss=SCE, metrics=["accuracy"])
    return model


def weight_diff(a, b) -> float:
    return max(float(np.abs(u.numpy() - v.numpy()).max()) for u, v in zip(a.weights, b.weights))


def test_fit_evaluate_and_predict_give_what_keras_gives():
    """Keras's arguments as Keras's ``fit`` takes them, positional ``x, y`` included: ``validation_split`` holds
    out the last quarter of the rows and of the sample weights, as Keras does; a second ``fit`` goes on from the
    first's optimiser state (momentum), as Keras's does; the Keras model holds the trained weights afterwards."""
    x, y = data(40)
    w = np.linspace(0.5, 1.5, 40).astype("float32")
    reference, model = compiled_cnn(), compiled_cnn()
    ours = KerasModel(model)
    fits = dict(batch_size=8, epochs=2, validation_split=0.25, shuffle=False, verbose=0, sample_weight=w)
    theirs, got = reference.fit(x, y, **fits).history, ours.fit(x, y, **fits).history
    assert sorted(got) == sorted(theirs)
    for key in theirs:
        np.testing.assert_allclose(got[key], theirs[key], rtol=1e-5, err_msg=key)
    assert weight_diff(model, reference) < 1e-6  # written back: the Keras model itself
    np.testing.assert_allclose(model.predict(x, verbose=0), reference.predict(x, verbose=0), atol=1e-5)
    # a second fit continues from the first's momentum
    theirs, got = (m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history for m in (reference, ours))
    np.testing.assert_allclose(got["loss"], theirs["loss"], rtol=1e-5)
    assert weight_diff(model, reference) < 1e-6
    # evaluate: the loss then the metrics, as a list; a dict with return_dict
    expected = reference.evaluate(x, y, verbose=0)
    result = ours.evaluate(x, y, batch_size=8)
    assert isinstance(result, list) and len(result) == len(expected) == 2
    np.testing.assert_allclose(result, expected, rtol=1e-5)
    assert ours.evaluate(x, y, return_dict=True).keys() == reference.evaluate(x, y, verbose=0, return_dict=True).keys()
    weighted = reference.evaluate(x, y, sample_weight=w, verbose=0)
    np.testing.assert_allclose(ours.evaluate(x, y, sample_weight=w), weighted, rtol=1e-5)
    np.testing.assert_allclose(ours.predict(x, batch_size=16), reference.predict(x, verbose=0), atol=1e-5)


def test_the_transfer_learning_flow_recompiled_between_phases_and_weights_set_between_calls():
    """Keras's guide: the head trained on a frozen base, then ``base.trainable = True`` and ``compile`` again at a
    lower rate; each call of a ``KerasModel`` starts from the model as it is (after a compile, a new optimizer with
    the new flags and rate; weights set on the model, those)."""
    x, y = data(48)
    (reference, base_theirs), (model, base) = transfer_model(), transfer_model()
    for m in (reference, model):
        m.compile(optimizer=keras.optimizers.SGD(LR_HEAD), loss=SCE)
    ours = KerasModel(model)
    fits = dict(batch_size=8, epochs=1, shuffle=False, verbose=0)
    reference.fit(x, y, **fits)
    ours.fit(x, y, **fits)
    assert weight_diff(model, reference) < 1e-6
    frozen = {v.path: v.numpy() for v in base.weights}
    for b, m in ((base_theirs, reference), (base, model)):
        unfreeze_all_but_batch_norm(b)
        m.compile(optimizer=keras.optimizers.SGD(LR_FINE), loss=SCE)
    theirs, got = reference.fit(x, y, **fits).history, ours.fit(x, y, **fits).history
    np.testing.assert_allclose(got["loss"], theirs["loss"], rtol=1e-5)
    assert weight_diff(model, reference) < 1e-6
    assert not np.array_equal(frozen["base/conv/kernel"], base.get_layer("conv").kernel.numpy())  # the base trained
    start = transfer_model()[0].get_weights()
    model.set_weights(start)
    np.testing.assert_allclose(ours.predict(x), model.predict(x, verbose=0), atol=1e-5)
    np.testing.assert_allclose(ours.evaluate(x, y), model.evaluate(x, y, verbose=0), rtol=1e-5)


def test_pandas_and_float64_data_as_keras_reads_them():
    """Keras's array adapter: a pandas DataFrame as its values, a Series of labels as one column, float64 as
    float32; ``validation_split`` of them the last rows."""
    import pandas as pd

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(40, 5)), columns=list("abcde"))  # float64
    labels = pd.Series((frame["a"] + frame["b"] > 0).astype("int64"))
    models = []
    for _ in range(2):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss=SCE, metrics=["accuracy"])
        models.append(m)
    reference, model = models
    fits = dict(batch_size=8, epochs=2, validation_split=0.2, shuffle=False, verbose=0)
    theirs, got = reference.fit(frame, labels, **fits).history, KerasModel(model).fit(frame, labels, **fits).history
    for key in theirs:
        np.testing.assert_allclose(got[key], theirs[key], rtol=1e-5, err_msg=key)
    assert weight_diff(model, reference) < 1e-6
    np.testing.assert_allclose(KerasModel(model).predict(frame), reference.predict(frame, verbose=0), atol=1e-5)


class Batches(keras.utils.PyDataset):
    """Batches of arrays in an order its ``on_epoch_end`` turns by one, as a user's dataset reshuffles there."""

    def __init__(self, x, y, batch: int):
        super().__init__()
        self.x, self.y, self.batch, self.ends = x, y, batch, 0
        self.order = np.arange(len(x) // batch)

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        rows = slice(self.order[i] * self.batch, (self.order[i] + 1) * self.batch)
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.ends += 1
        self.order = np.roll(self.order, 1)


def test_a_py_dataset_is_read_through_kerass_adapter_with_its_epoch_hooks():
    """A ``keras.utils.PyDataset`` (Keras 3's way to feed batches from Python): its batches and its ``on_epoch_end``
    as Keras's ``fit`` calls them (once more before the first epoch, as its epoch iterator resets), so a dataset that
    reorders there trains as in ``fit``; ``evaluate`` and ``predict`` as Keras's."""
    x, y = data(40)
    reference, model = compiled_cnn(), compiled_cnn()
    theirs_data, our_data = Batches(x, y, 8), Batches(x, y, 8)
    theirs = reference.fit(theirs_data, epochs=3, shuffle=False, verbose=0).history
    got = KerasModel(model).fit(our_data, epochs=3, shuffle=False, verbose=0).history
    for key in theirs:
        np.testing.assert_allclose(got[key], theirs[key], rtol=1e-5, err_msg=key)
    assert weight_diff(model, reference) < 1e-6 and our_data.ends == theirs_data.ends == 4
    np.testing.assert_allclose(KerasModel(model).evaluate(Batches(x, y, 8)),
                               reference.evaluate(Batches(x, y, 8), verbose=0), rtol=1e-5)
    np.testing.assert_allclose(KerasModel(model).predict(Batches(x, y, 8)),
                               reference.predict(Batches(x, y, 8), verbose=0), atol=1e-5)


class StopWithAnError(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError(f"stopped after epoch {epoch}")


def test_a_fit_stopped_by_an_error_leaves_the_model_where_training_got():
    """As Keras's ``fit``: the weights of the steps taken before the error are the model's."""
    x, y = data(32)
    reference, model = compiled_cnn(), compiled_cnn()
    for m in (reference, KerasModel(model)):
        with pytest.raises(RuntimeError, match="stopped after epoch 0"):
            m.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[StopWithAnError()])
    assert weight_diff(model, reference) < 1e-6
    assert weight_diff(model, compiled_cnn()) > 1e-3


def two_outputs(as_dict: bool):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(6, activation="relu", name="h")(inputs)
    score, logits = keras.layers.Dense(1, name="score")(hidden), keras.layers.Dense(3, name="logits")(hidden)
    if as_dict:
        model = keras.Model(inputs, {"score": score, "logits": logits})
        model.compile(optimizer="sgd", loss={"score": "mse", "logits": SCE},
                      metrics={"logits": ["accuracy"], "score": ["mae"]})
    else:
        model = keras.Model(inputs, [score, logits])
        model.compile(optimizer="sgd", loss=["mse", SCE], metrics=[["mae"], ["accuracy"]])
    return model


@pytest.mark.parametrize("as_dict", [True, False], ids=["dict", "list"])
def test_two_outputs_predict_and_evaluate_in_kerass_structure_and_order(as_dict):
    """``predict``: a dict by output name for a dict of outputs, a list for a list; ``evaluate``: Keras's list, in
    Keras's order (the loss, each output's loss, then the metrics by name), each against a fresh twin's own call."""
    x = np.random.default_rng(0).normal(size=(10, 4)).astype("float32")
    y = {"score": np.ones((10, 1), "float32"), "logits": np.arange(10) % 3}
    y = y if as_dict else [y["score"], y["logits"]]
    model, twin = two_outputs(as_dict), two_outputs(as_dict)
    got, theirs = KerasModel(model).predict(x), twin.predict(x, verbose=0)
    assert type(got) is type(theirs) and len(got) == len(theirs) == 2
    for key in (theirs if as_dict else range(2)):
        np.testing.assert_allclose(got[key], theirs[key], atol=1e-6)
    got, theirs = KerasModel(two_outputs(as_dict)).evaluate(x, y), two_outputs(as_dict).evaluate(x, y, verbose=0)
    assert len(got) == len(theirs) == 5
    np.testing.assert_allclose(got, theirs, rtol=1e-5)


@pytest.mark.parametrize("call,name", [
    (lambda m, x, y: m.fit(x, y, epochs=3, initial_epoch=1), "initial_epoch"),
    (lambda m, x, y: m.fit(x, y, validation_split=0.25, validation_freq=2), "validation_freq"),
    (lambda m, x, y: m.fit(x, y, steps_per_epoch=2), "steps_per_epoch"),
    (lambda m, x, y: m.fit(x, y, validation_split=1.5), "validation_split"),
    (lambda m, x, y: m.evaluate(x, y, steps=1), "steps"),
])
def test_what_tfnet_does_not_run_is_refused_before_any_step(call, name):
    x, y = data(16)
    model = compiled_cnn()
    before = [v.numpy() for v in model.weights]
    with pytest.raises(ValueError, match=name):
        call(KerasModel(model), x, y)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.weights))
