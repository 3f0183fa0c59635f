"""Models of several inputs and outputs as Keras's guide writes them ("The Functional API": a ticket's title, body
and tags in, its priority and department out, a dict of outputs, losses and loss weights by output name, data as
dicts by name), through ``TFOptimizer.from_keras``, against Keras's own ``fit`` on the same batches: the weights,
and the history's total loss, each output's loss (``priority_loss``) and each output's metrics
(``department_accuracy``), training and validation. Before: labels given as a dict were refused, a dict of outputs
whose keys are not the layers' names was an "unknown output", each output's loss was missing from the history, metrics
per output were refused (a dict) or all given to the first output (Keras's list of one entry per output), and a
``tf.data`` input's features dict was fed in the dict's order, not by input name."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from optim import TFOptimizer
from optim.errors import DataError, KerasMappingError, LabelShapeError
from tfnet import TFNet

RNG = np.random.default_rng(0)
N, WORDS, TAGS, DEPARTMENTS = 48, 40, 5, 3
TITLE = RNG.integers(0, WORDS, size=(N, 6)).astype(np.float32)  # the guide feeds token ids to float inputs
BODY = RNG.integers(0, WORDS, size=(N, 9)).astype(np.float32)
TAG = RNG.integers(0, 2, size=(N, TAGS)).astype(np.float32)
PRIORITY = RNG.random(size=(N, 1)).astype(np.float32)
DEPARTMENT = np.eye(DEPARTMENTS, dtype=np.float32)[RNG.integers(0, DEPARTMENTS, size=N)]
X = {"title": TITLE, "body": BODY, "tags": TAG}
Y = {"priority": PRIORITY, "department": DEPARTMENT}
FIT = {"batch_size": 16, "epochs": 2, "shuffle": False, "verbose": 0}


def guide_model(metrics=None, weighted_metrics=None, keys=("priority", "department"), as_list=False):
    """The guide's ticket model, smaller; ``keys`` name the dict of outputs (the guide names them as the layers), or
    ``as_list``: a list of the two outputs, compiled with lists."""
    keras.backend.clear_session()  # the same layer names (and weight paths) in every model built here
    keras.utils.set_random_seed(0)
    title = keras.Input(shape=(None,), name="title")
    body = keras.Input(shape=(None,), name="body")
    tags = keras.Input(shape=(TAGS,), name="tags")
    title_features = keras.layers.LSTM(8)(keras.layers.Embedding(WORDS, 6)(title))
    body_features = keras.layers.LSTM(4)(keras.layers.Embedding(WORDS, 6)(body))
    x = keras.layers.concatenate([title_features, body_features, tags])
    priority = keras.layers.Dense(1, name="priority")(x)
    department = keras.layers.Dense(DEPARTMENTS, name="department")(x)
    model = keras.Model([title, body, tags], [priority, department] if as_list else {keys[0]: priority, keys[1]: department})
    # the guide's RMSprop, with momentum SGD here: with token ids repeated in a batch, Keras 3's TensorFlow backend
    # squares each repeated id's gradient slice apart (test_an_embedding_trains_on_its_dense_gradient below)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  loss={keys[0]: keras.losses.BinaryCrossentropy(from_logits=True),
                        keys[1]: keras.losses.CategoricalCrossentropy(from_logits=True)},
                  loss_weights={keys[0]: 1.0, keys[1]: 0.2}, metrics=metrics, weighted_metrics=weighted_metrics)
    if as_list:
        model.compile(model.optimizer, loss=[keras.losses.BinaryCrossentropy(from_logits=True),
                                             keras.losses.CategoricalCrossentropy(from_logits=True)],
                      loss_weights=[1.0, 0.2], metrics=metrics, weighted_metrics=weighted_metrics)
    return model


def assert_history_equal(ours, theirs, rtol=1e-5):
    keys = {k for k in theirs}
    assert keys <= set(ours), sorted(keys - set(ours))
    for key in sorted(keys):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=rtol, atol=1e-6, err_msg=key)


def assert_weights_equal(opt, model, atol=2e-6):
    weights = opt.net.get_weights()
    for v in model.trainable_variables:
        np.testing.assert_allclose(weights[v.path], v.numpy(), atol=atol, err_msg=v.path)


def test_the_guides_ticket_model_trains_as_fit_with_dicts_by_name():
    metrics = {"priority": ["mae", keras.metrics.AUC(name="auc")], "department": ["accuracy"]}
    model = guide_model(metrics)
    theirs = model.fit(X, Y, validation_data=(X, Y), **FIT).history
    assert {"priority_loss", "department_loss", "priority_mae", "priority_auc", "department_accuracy",
            "val_department_loss"} <= set(theirs)
    opt = TFOptimizer.from_keras(guide_model(metrics))
    ours = opt.optimize((X, Y), validation_data=(X, Y), **FIT)
    assert_history_equal(ours, theirs)
    assert_weights_equal(opt, model)


def test_a_dict_of_outputs_is_named_by_its_keys_and_a_tf_data_input_by_name():
    """Keys that are not the layers' names (what compile, the labels and the history use); a ``tf.data`` input whose
    dicts list the inputs and outputs in another order than the model's."""
    model = guide_model(keys=("urgency", "team"))
    net = TFNet.from_keras(model)
    assert [n.split(":")[0] for n in net.output_names] == ["team", "urgency"]  # tf.nest's order, as Keras flattens
    predicted = model.predict(X, verbose=0)
    forward = dict(zip(["team", "urgency"], net.forward([X[n.split(":")[0]] for n in net.input_names])))
    for key in ("team", "urgency"):
        np.testing.assert_allclose(forward[key], predicted[key], atol=1e-5, err_msg=key)

    reordered = ({"tags": TAG, "body": BODY, "title": TITLE}, {"urgency": PRIORITY, "team": DEPARTMENT})
    data = tf.data.Dataset.from_tensor_slices(reordered).batch(16)
    theirs = model.fit(data, epochs=2, verbose=0).history
    assert set(theirs) == {"loss", "urgency_loss", "team_loss"}
    opt = TFOptimizer.from_keras(guide_model(keys=("urgency", "team")))
    ours = opt.optimize(data, epochs=2, verbose=0)
    assert_history_equal(ours, theirs)
    assert_weights_equal(opt, model)


def test_a_list_of_metrics_gives_one_entry_per_output_as_compile_reads_it():
    """``metrics=[a, [b, c]]`` on two outputs is output 0's ``a`` and output 1's ``b`` and ``c`` (before, all three
    followed the first output); a weighted metric named as a metric is ``weighted_<name>``, as Keras names it."""
    metrics = ["mse", ["accuracy", "mse"]]
    weighted = [None, ["accuracy"]]
    weights = RNG.uniform(0.2, 2.0, size=N).astype(np.float32)
    model = guide_model(metrics, weighted, as_list=True)
    assert [n.split(":")[0] for n in TFNet.from_keras(model).output_names] == ["priority", "department"]
    y = [PRIORITY, DEPARTMENT]
    theirs = model.fit(X, y, sample_weight=weights, validation_data=(X, y, weights), **FIT).history
    assert {"priority_mse", "department_accuracy", "department_mse", "department_weighted_accuracy"} <= set(theirs)
    opt = TFOptimizer.from_keras(guide_model(metrics, weighted, as_list=True))
    ours = opt.optimize((X, y), sample_weight=weights, validation_data=(X, y, weights), **FIT)
    assert_history_equal(ours, theirs)
    assert_weights_equal(opt, model)


def test_what_keras_refuses_or_tfnet_cannot_take_is_said_before_training():
    model = guide_model(metrics=["mae"])  # one entry for two outputs: Keras's fit refuses it too
    with pytest.raises(ValueError):
        model.fit(X, Y, **FIT)
    with pytest.raises(KerasMappingError, match="one entry .* per output"):
        TFOptimizer.from_keras(guide_model(metrics=["mae"]))
    opt = TFOptimizer.from_keras(guide_model())
    with pytest.raises(DataError, match="'prio'.*Outputs"):
        opt.optimize((X, {"prio": PRIORITY, "department": DEPARTMENT}), **FIT)
    with pytest.raises(DataError, match=r"no array for the net's outputs \['priority:0'\]"):
        opt.optimize((X, {"department": DEPARTMENT}), **FIT)
    with pytest.raises(LabelShapeError, match="Output department:0"):  # a list is in output order: the keys sorted
        opt.evaluate((X, [PRIORITY, DEPARTMENT]))  # before: TensorFlow's broadcast error from inside the loss
    with pytest.raises(DataError, match="'prio' in the sample weights dict"):
        opt.optimize((X, Y, {"prio": np.ones(N)}), **FIT)
    with pytest.raises(DataError, match=r"no array for the net's outputs \['department:0'\]: one per output"):
        opt.optimize((X, Y, {"priority": np.ones(N)}), **FIT)
    assert opt.global_step == 0


def test_metrics_by_output_and_each_outputs_loss_for_a_net_of_tfnets_own():
    """``TFOptimizer(net, [loss_a, loss_b], metrics={"b": ...})``: each output's metric on its own output, and
    each output's loss, as numpy computes them at the trained weights (``evaluate``)."""
    i = keras.Input((3,), name="x")
    model = keras.Model(i, [keras.layers.Dense(1, name="a")(i), keras.layers.Dense(2, name="b")(i)])
    net = TFNet.from_keras(model)
    x = RNG.normal(size=(20, 3)).astype(np.float32)
    ya, yb = RNG.normal(size=(20, 1)).astype(np.float32), RNG.normal(size=(20, 2)).astype(np.float32)
    opt = TFOptimizer(net, ["mse", "mae"], 0.01, metrics={"b": ["mse"], "a": "mae"}, loss_weights=[1.0, 3.0])
    assert sorted(m.name for m in opt.metrics) == ["a_loss", "a_mae", "b_loss", "b_mse"]
    logs = opt.evaluate((x, {"b": yb, "a": ya}), batch_size=8)
    pa, pb = net.forward(x)
    expected = {"a_mae": np.abs(pa - ya).mean(), "b_mse": np.square(pb - yb).mean(),
                "a_loss": np.square(pa - ya).mean(), "b_loss": np.abs(pb - yb).mean()}
    expected["loss"] = expected["a_loss"] + 3.0 * expected["b_loss"]
    for key, value in expected.items():
        np.testing.assert_allclose(logs[key], value, rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("kind", ["Adam", "RMSprop"])
def test_an_embedding_trains_on_its_dense_gradient(kind):
    """An embedding's gradient is sparse (``tf.IndexedSlices``, one slice per token). Keras 3's TensorFlow backend
    squares each slice apart where an id repeats in the batch, so its Adam and RMSprop keep the sum of the squares
    instead of the square of the sum (with unique ids the two agree). tfnet trains on the dense gradient: the update
    Keras's own optimiser makes from ``tf.convert_to_tensor`` of the same gradient."""
    ids = np.array([[1, 1, 3], [1, 5, 6]], np.int32)  # id 1 three times
    target = RNG.normal(size=(2, 3, 2)).astype(np.float32)

    def model():
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        i = keras.Input((3,), dtype="int32", name="ids")
        m = keras.Model(i, keras.layers.Embedding(8, 2, name="emb")(i))
        m.compile(getattr(keras.optimizers, kind)(0.1), "mse")
        return m

    keras_model = model()
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(target, keras_model(ids))
    (grad,) = tape.gradient(loss, keras_model.trainable_variables)
    assert isinstance(grad, tf.IndexedSlices)
    start = keras_model.get_weights()[0]
    keras_model.optimizer.apply_gradients([(tf.convert_to_tensor(grad), keras_model.trainable_variables[0])])
    dense = keras_model.get_weights()[0]
    keras_model.set_weights([start])
    sliced = keras.optimizers.get(kind)
    sliced.learning_rate = 0.1
    sliced.apply_gradients([(grad, keras_model.trainable_variables[0])])
    assert np.abs(keras_model.get_weights()[0] - dense).max() > 1e-2  # the repeated id's row: Keras's two roads differ

    opt = TFOptimizer.from_keras(model())
    opt.optimize((ids, target), batch_size=2, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(opt.net.get_weights()["emb/embeddings"], dense, atol=1e-6)


def test_each_outputs_loss_weighs_its_batches_by_their_rows():
    """20 rows in batches of 8: each output's loss is the mean over the rows, as Keras's eager step reports it
    (``run_eagerly=True``) and as the total loss is in both. Keras's traced step weighs each batch's per-output loss
    alike (the batch size it weighs by is unknown when traced), so there its last, smaller batch counts double."""
    val = ({k: v[:20] for k, v in X.items()}, {k: v[:20] for k, v in Y.items()})
    eager = guide_model()
    eager.compile(eager.optimizer, loss=eager.loss, loss_weights={"priority": 1.0, "department": 0.2}, run_eagerly=True)
    theirs = eager.evaluate(*val, batch_size=8, return_dict=True, verbose=0)
    ours = TFOptimizer.from_keras(guide_model()).evaluate(val, batch_size=8)
    for key in ("loss", "priority_loss", "department_loss"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, err_msg=key)


def test_sample_weights_by_output_as_fit_takes_them():
    """Multi-task data with missing labels: the priority known for half the tickets only (weight 0 elsewhere), the
    department weighted by another array; as a dict of numpy arrays and in a ``tf.data`` input's elements. Each
    output's loss and weighted metric takes its own weights, as in ``fit`` (before: a ``DataError``)."""
    known = (np.arange(N) % 2).astype(np.float32)
    weights = {"priority": known, "department": RNG.uniform(0.5, 2.0, size=N).astype(np.float32)}
    weighted = {"priority": ["mae"], "department": ["accuracy"]}
    model = guide_model(weighted_metrics=weighted)
    theirs = model.fit(X, Y, sample_weight=weights, validation_data=(X, Y, weights), **FIT).history
    assert {"priority_mae", "department_accuracy", "val_priority_loss"} <= set(theirs)
    opt = TFOptimizer.from_keras(guide_model(weighted_metrics=weighted))
    ours = opt.optimize((X, Y), sample_weight=weights, validation_data=(X, Y, weights), **FIT)
    assert_history_equal(ours, theirs)
    assert_weights_equal(opt, model)
    data = tf.data.Dataset.from_tensor_slices((X, Y, {"department": weights["department"], "priority": known}))
    again = TFOptimizer.from_keras(guide_model(weighted_metrics=weighted))
    assert_history_equal(again.optimize(data.batch(16), epochs=2, verbose=0), {k: v for k, v in theirs.items()
                                                                              if not k.startswith("val_")})


def test_an_output_without_a_loss_keeps_its_metrics_and_adds_no_output_losses():
    """A loss for one of the two outputs: the other's metrics still reported, and no ``{output}_loss`` (Keras reports
    those only where more than one output has a loss); labels for both, as fit asks. The other output's layer, which
    the loss does not reach, keeps its weights: no weight decay, no momentum, as Keras's optimiser leaves a variable
    without a gradient (before: decayed, 7e-2 from fit's)."""
    def one_loss():
        model = guide_model()
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=0.5),
                      loss={"priority": keras.losses.BinaryCrossentropy(from_logits=True)},
                      metrics={"department": ["accuracy"], "priority": ["mae"]})
        return model

    model = one_loss()
    theirs = model.fit(X, Y, **FIT).history
    opt = TFOptimizer.from_keras(one_loss())
    ours = opt.optimize((X, Y), **FIT)
    assert set(theirs) == {"loss", "department_accuracy", "priority_mae"} == set(ours)
    assert_history_equal(ours, theirs)
    assert_weights_equal(opt, model)
    start = {v.path: v.numpy() for v in one_loss().trainable_variables}
    np.testing.assert_array_equal(opt.net.get_weights()["department/kernel"], start["department/kernel"])
    with pytest.raises(DataError, match=r"no array for the net's outputs \['department:0'\]: Keras's fit takes one"):
        opt.optimize((X, {"priority": PRIORITY}), **FIT)
