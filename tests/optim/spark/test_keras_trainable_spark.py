"""Keras's transfer-learning flow on two ranks (issue 51): a frozen base and a new head trained by tfnet over a real
local[2] Spark with Horovod over Gloo equal Keras's own ``fit`` on the same global batches, in both phases, and only
the head's bytes are allreduced while the base is frozen; weight regularizers as fit adds them. A compiled subclassed
model, too, with a per-example loss function, a Keras metric merged over the ranks and the weights' moving average
(use_ema, validated on it with SwapEMAWeights). And Keras's guide's model of several inputs and outputs, given as dicts by name.
Dropout draws each rank's own noise, rank 0 fit's, checked against Keras's gradients under the same seeds."""

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests.keras_subclassed import subclassed_cnn
from tests.optim.keras_transfer import LR_FINE, LR_HEAD, data, keras_fit, max_diff, transfer_model, unfreeze_all_but_batch_norm
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def as_two_ranks_see_it(x, y, batch: int):
    """The rows in the order Keras's fit must see them to take the steps two ranks take: rank r holds rows r, r + 2,
    ...; step k averages each rank's k-th block of ``batch / 2`` rows, which is one step over both blocks."""
    per = batch // 2
    shards = [(x[r::2], y[r::2]) for r in range(2)]
    steps = len(shards[0][0]) // per
    order = [np.concatenate([s[i][k * per:(k + 1) * per] for s in shards]) for i in range(2) for k in range(steps)]
    xs, ys = order[:steps], order[steps:]
    return np.concatenate(xs), np.concatenate(ys)


def test_the_transfer_learning_flow_on_two_ranks_trains_as_keras_fit(spark):
    """With weight regularizers on the base and the head, which Keras's fit adds to the loss for the trainable
    weights: each rank adds them to its loss, and the averaged gradient is fit's on the global batch."""
    x, y = data(64)
    kx, ky = as_two_ranks_see_it(x, y, 16)
    reference, _ = transfer_model(regularized=True)
    model, _ = transfer_model(regularized=True)
    net = TFNet.from_keras(model)
    want = keras_fit(reference, kx, ky, LR_HEAD, 16)
    history = TFOptimizer(net, SCE, optim.SGD(LR_HEAD)).optimize(
        (x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0)
    assert max_diff(net, want) < 1e-6
    head_bytes = sum(w.nbytes for k, w in net.get_weights().items() if k.startswith("head/"))
    assert history["bytes_per_step"] == [head_bytes + 4]  # the head's gradients and the loss, nothing of the base
    for keras_model in (reference, model):
        unfreeze_all_but_batch_norm(keras_model.get_layer("base"))
    want = keras_fit(reference, kx, ky, LR_FINE, 16)
    net.trainable = [v.path for v in model.trainable_variables]
    history = TFOptimizer(net, SCE, optim.SGD(LR_FINE)).optimize(
        (x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0)
    assert max_diff(net, want) < 1e-6
    assert history["bytes_per_step"][0] > head_bytes + 4


def test_a_compiled_subclassed_model_on_two_ranks_trains_as_keras_fit(spark):
    """``TFOptimizer.from_keras`` on a subclassed model (its own ``call``, built by its first call), over two ranks,
    against ``fit`` on the same global batches; batch norm frozen and no dropout, as ``fit``'s ``training=True``
    would otherwise compute another function."""
    import keras

    x, y = data(64)
    kx, ky = as_two_ranks_see_it(x, y, 16)
    reference, _ = subclassed_cnn(frozen_bn=True, dropout=0.0)
    model, _ = subclassed_cnn(frozen_bn=True, dropout=0.0)
    # a loss function of per-example values (Keras wraps it, tfnet ships Keras's wrapper to the ranks), a Keras metric
    # tfnet does not compute itself, merged over the ranks, and the weights' moving average (use_ema), which every rank
    # keeps alike and training ends with, as fit's end
    def sparse_xent(y_true, y_pred):  # defined here: shipped by value, with its globals
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

    for keras_model in (reference, model):
        keras_model.compile(optimizer=keras.optimizers.SGD(LR_HEAD, use_ema=True, ema_momentum=0.5), loss=sparse_xent,
                            metrics=[keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent")])
    opt = TFOptimizer.from_keras(model)
    # validated on the moving average on every rank (SwapEMAWeights), as fit validates
    val = dict(validation_data=(x[:16], y[:16]), callbacks=[keras.callbacks.SwapEMAWeights()])
    theirs = reference.fit(kx, ky, batch_size=16, epochs=1, shuffle=False, verbose=0, **val).history
    want = {v.path: v.numpy() for v in reference.weights}
    ours = opt.optimize((x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0, **val)
    assert max_diff(opt.net, want) < 1e-6
    for key in ("xent", "val_xent", "val_loss"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, err_msg=key)
    assert float(np.abs(want["cnn/conv/kernel"] - model.get_layer("conv").kernel.numpy()).max()) > 1e-4  # it trained


def test_the_guides_model_of_dicts_on_two_ranks_reports_as_keras_fit(spark):
    """Keras's guide's ticket model (three inputs, a dict of two outputs, losses, loss weights and metrics by output
    name), trained over two ranks on dicts of arrays (sample weights for one output: its labels missing for a third of
    the rows) and validated on a ``tf.data`` input of dicts in another order
    (collected and sent to the ranks): each output's loss and metrics (a Keras AUC among them, merged over the ranks)
    and the weights as fit gives them on the same global batches."""
    import keras
    import tensorflow as tf

    from tests.optim.test_keras_multi_output import DEPARTMENT, PRIORITY, X, Y, assert_history_equal, guide_model

    metrics = {"priority": [keras.metrics.AUC(name="auc")],
               "department": ["accuracy", keras.metrics.F1Score(average="macro", name="f1")]}  # per-class counts
    order = as_two_ranks_see_it(np.arange(len(PRIORITY)), np.arange(len(PRIORITY)), 16)[0]
    reference = guide_model(metrics)
    # whole batches: Keras's traced step weighs each batch's per-output loss alike (tests/optim/test_keras_multi_output.py)
    val = ({"tags": X["tags"][:32], "body": X["body"][:32], "title": X["title"][:32]},
           {"department": DEPARTMENT[:32], "priority": PRIORITY[:32]})
    weights = {"priority": (np.arange(len(PRIORITY)) % 3 > 0).astype(np.float32),  # a third unlabelled
               "department": np.ones(len(PRIORITY), np.float32)}
    theirs = reference.fit({k: v[order] for k, v in X.items()}, {k: v[order] for k, v in Y.items()}, batch_size=16,
                           epochs=2, shuffle=False, verbose=0, validation_data=val,
                           sample_weight={k: w[order] for k, w in weights.items()}).history
    opt = TFOptimizer.from_keras(guide_model(metrics))
    ours = opt.optimize((X, Y), batch_size=16, epochs=2, shuffle=False, num_workers=2, verbose=0,
                        validation_data=tf.data.Dataset.from_tensor_slices(val).batch(8), sample_weight=weights)
    assert {"priority_loss", "department_loss", "priority_auc", "val_department_accuracy", "department_f1"} <= set(theirs)
    assert_history_equal(ours, theirs)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    assert max(float(np.abs(opt.net.get_weights()[k] - w).max()) for k, w in want.items()) < 2e-6


def test_label_columns_by_output_name_over_spark(spark):
    """A DataFrame's label columns given as a dict by output name, in another order than the outputs (and the feature
    columns by input name): evaluated over Spark, one task per partition, as the numpy dicts are here."""
    from optim import TFDataset
    from optim.errors import ColumnError, LabelShapeError
    from tests.optim.test_keras_multi_output import X, Y, guide_model

    rows = [(X["title"][i].tolist(), X["body"][i].tolist(), X["tags"][i].tolist(), float(Y["priority"][i, 0]),
             Y["department"][i].tolist()) for i in range(len(Y["priority"]))]
    df = spark.createDataFrame(rows, "t array<float>, b array<float>, g array<float>, p double, d array<float>")
    opt = TFOptimizer.from_keras(guide_model())
    data = TFDataset.from_dataframe(df.repartition(3), {"tags": "g", "title": "t", "body": "b"},
                                    label_cols={"priority": "p", "department": "d"})
    distributed = opt.evaluate(data, batch_size=16)
    local = opt.evaluate((X, Y), batch_size=16)
    for key in ("loss", "priority_loss", "department_loss"):
        np.testing.assert_allclose(distributed[key], local[key], rtol=1e-6, err_msg=key)
    with pytest.raises(LabelShapeError, match=r"Output department:0: CategoricalCrossentropy .* \(16, 3\)"):
        opt.evaluate(TFDataset.from_dataframe(df, {"tags": "g", "title": "t", "body": "b"}, label_cols=["p", "d"]),
                     batch_size=16)  # a list in the wrong order: before, TensorFlow's broadcast error through Py4J
    with pytest.raises(ColumnError, match="no column for the net's outputs"):
        opt.evaluate(TFDataset.from_dataframe(df, {"tags": "g", "title": "t", "body": "b"}, label_cols={"department": "d"}))


def pooled_model(seed: int, layers):
    """The two-rank tests' small model, seeded: 8x8x3 images, global average pooling, ``layers()`` (made after the
    seed, as a dropout's seed generator draws its own at construction), a ``Dense(3)`` named "out"; compiled with SGD
    at ``LR_HEAD`` and sparse categorical cross-entropy from logits."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.GlobalAveragePooling2D()(inputs)
    for layer in layers():
        x = layer(x)
    m = keras.Model(inputs, keras.layers.Dense(3, name="out")(x))
    m.compile(optimizer=keras.optimizers.SGD(LR_HEAD), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def test_dropout_on_two_ranks_draws_each_ranks_own_noise(spark):
    """Rank ``r`` at step ``k`` draws the noise Keras's dropout draws from its seed generator at its state plus
    ``[r, k]`` (rank 0: ``fit``'s own sequence): Keras's gradients of each rank's block so drawn, averaged, are the
    step the two ranks take. With the same noise on both ranks (the state plus ``[0, k]``), the weights differ."""
    import keras
    import tensorflow as tf

    def model():
        return pooled_model(5, lambda: [keras.layers.Dense(6, activation="relu", name="hidden"),
                                        keras.layers.Dropout(0.5, name="drop")])

    x, y = data(32)
    opt = TFOptimizer.from_keras(model())
    opt.optimize((x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0)
    assert int(opt.net.state.seed_step.numpy()) == 2  # the driver's net goes on from the ranks' steps

    def keras_steps(streams):
        reference = model()
        generator = reference.get_layer("drop").seed_generator
        start = generator.state.numpy()
        for k in range(2):
            grads = []
            for r, stream in enumerate(streams):
                generator.state.assign(start + np.array([stream, k], start.dtype))
                rows = slice(r + 16 * k, r + 16 * (k + 1), 2)  # rank r holds rows r, r + 2, ...: its k-th block of 8
                with tf.GradientTape() as tape:
                    loss = reference.loss(y[rows], reference(x[rows], training=True))
                grads.append(tape.gradient(loss, reference.trainable_variables))
            for v, *g in zip(reference.trainable_variables, *grads):
                v.assign_sub(LR_HEAD * sum(g) / len(g))
        return {v.path: v.numpy() for v in reference.weights}

    assert max_diff(opt.net, keras_steps([0, 1])) < 1e-6
    assert max_diff(opt.net, keras_steps([0, 0])) > 1e-4


def test_batch_norm_on_two_ranks_normalizes_by_each_ranks_batch(spark):
    """A trainable batch norm on two ranks, as Horovod's Keras training runs it: each rank normalizes by its own
    block's statistics and moves its own moving ones; the averaged gradients are Keras's of each block in training
    mode, and the driver's net holds rank 0's moving statistics (checked against Keras's calls, rank by rank)."""
    import keras
    import tensorflow as tf

    def model():
        return pooled_model(6, lambda: [keras.layers.Dense(6, use_bias=False, name="hidden"),
                                        keras.layers.BatchNormalization(momentum=0.5, name="bn"),
                                        keras.layers.Activation("relu")])

    x, y = data(32)
    opt = TFOptimizer.from_keras(model())
    opt.optimize((x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0)

    reference = model()
    moving = [v for v in reference.weights if not v.trainable]
    chains = [[v.numpy() for v in moving] for _ in range(2)]  # each rank's own moving statistics
    for k in range(2):
        grads = []
        for r in range(2):
            for v, value in zip(moving, chains[r]):
                v.assign(value)
            rows = slice(r + 16 * k, r + 16 * (k + 1), 2)  # rank r holds rows r, r + 2, ...: its k-th block of 8
            with tf.GradientTape() as tape:
                loss = reference.loss(y[rows], reference(x[rows], training=True))
            grads.append(tape.gradient(loss, reference.trainable_variables))
            chains[r] = [v.numpy() for v in moving]
        for v, *g in zip(reference.trainable_variables, *grads):
            v.assign_sub(LR_HEAD * sum(g) / len(g))
    for v, value in zip(moving, chains[0]):
        v.assign(value)
    assert max_diff(opt.net, {v.path: v.numpy() for v in reference.weights}) < 1e-6
    assert np.abs(chains[0][0] - chains[1][0]).max() > 1e-3  # the ranks' statistics differ: rank 0's came back
