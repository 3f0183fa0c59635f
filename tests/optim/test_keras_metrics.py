"""Keras's metrics as ``compile`` takes them, through ``TFOptimizer.from_keras``, against the history of Keras's own
``fit`` (training and validation, two epochs): the metrics tfnet computes itself where they are Keras's (accuracies,
mae), and every other Keras metric updated as Keras updates it (``optim.metrics.KerasMetric``: an ``AUC`` of either
curve, ``Precision``, ``Recall`` at a threshold, ``BinaryAccuracy(threshold=0.7)``, the string ``"auc"``). Before,
``BinaryAccuracy(threshold=0.7)`` was counted at 0.5, ``AUC(curve="PR")`` as a ROC AUC, ``"auc"`` and ``AUC()`` by
tfnet's own histogram (1e-3 off), and ``Precision`` or ``Recall`` refused."""

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer
from optim.errors import KerasMappingError
from optim.training.evaluation import metrics_copy

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 4)).astype(np.float32)
Y = (X[:, :1] + 0.5 * RNG.normal(size=(64, 1)) > 0).astype(np.float32)


def metrics():
    return [keras.metrics.AUC(name="roc"), keras.metrics.AUC(curve="PR", num_thresholds=50, name="pr"),
            keras.metrics.BinaryAccuracy(threshold=0.7, name="acc7"), keras.metrics.Precision(name="prec"),
            keras.metrics.Recall(thresholds=0.3, name="rec3"), keras.metrics.BinaryAccuracy(name="acc"), "auc", "mae"]


def compiled():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(8, activation="relu", name="d1"),
                              keras.layers.Dense(1, activation="sigmoid", name="d2")], name="m")
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=metrics())
    return model


def test_keras_metrics_report_what_fit_reports():
    theirs = compiled().fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                            validation_data=(X[:32], Y[:32])).history
    opt = TFOptimizer.from_keras(compiled())
    kinds = {m.name: type(m).__name__ for m in opt.metrics}
    assert kinds == {"roc": "KerasMetric", "pr": "KerasMetric", "acc7": "KerasMetric", "prec": "KerasMetric",
                     "rec3": "KerasMetric", "acc": "Accuracy", "auc": "KerasMetric", "mae": "MeanAbsoluteError"}
    ours = opt.optimize((X, Y), batch_size=16, epochs=2, shuffle=False, verbose=0, validation_data=(X[:32], Y[:32]))
    for name in ("roc", "pr", "acc7", "prec", "rec3", "acc", "mae"):
        for key in (name, "val_" + name):
            np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, err_msg=key)
    # Keras tells its "auc" from the AUC objects by a suffix, tfnet keeps the name it was given
    np.testing.assert_allclose(ours["auc"], theirs["auc_1" if "auc_1" in theirs else "auc"], rtol=1e-6)


def absolute_error(y_true, y_pred):  # the user's own metric: per-example values, as Keras's guide writes one
    return keras.ops.abs(y_true - y_pred)


def test_metric_functions_and_keras_names_are_averaged_as_compile_averages_them():
    """A name only Keras knows (``"msle"``), Keras's metric function and the user's, each of per-example values
    (before: an unknown metric, and a failure converting a vector to a float); a last batch of 4 rows of 20."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(20, 4)).astype(np.float32), np.abs(rng.normal(size=(20, 3))).astype(np.float32)

    def regression():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(3, name="d")], name="r")
        model.compile(keras.optimizers.SGD(0.1), "mse",
                      metrics=["msle", absolute_error, keras.metrics.mean_squared_error])
        return model

    theirs = regression().fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    ours = TFOptimizer.from_keras(regression()).optimize((x, y), batch_size=8, epochs=2, shuffle=False, verbose=0)
    for key in ("msle", "absolute_error", "mean_squared_error"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, err_msg=key)


def test_a_keras_metric_merges_over_partitions_and_travels():
    """States add up: two halves updated apart and merged give the whole's result; a copy (validation's) and a
    pickled one (a rank's) start from the same state without sharing it."""
    import pickle

    whole, halves = optim.metrics.get(keras.metrics.AUC(curve="PR")), optim.metrics.get(keras.metrics.AUC(curve="PR"))
    score = RNG.uniform(size=(64, 1)).astype(np.float32)
    whole.update(Y, score)
    halves.update(Y[:32], score[:32])
    other = pickle.loads(pickle.dumps(halves))
    other.reset()
    other.update(Y[32:], score[32:])
    halves.merge(other.state)
    assert halves.result() == pytest.approx(whole.result(), rel=1e-6)
    twin = metrics_copy([whole])[0]  # what validation takes
    twin.reset()
    assert whole.result() > 0 and np.count_nonzero(twin.state) == 0


class Unregistered(keras.metrics.Mean):
    """A metric class of one's own, not registered: Keras cannot rebuild it from its config where tfnet trains."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(keras.ops.abs(y_true - y_pred), sample_weight)


def test_a_keras_metric_tfnet_cannot_merge_or_rebuild_is_refused_by_name():
    model = compiled()
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=[Unregistered(name="mine")])
    with pytest.raises(KerasMappingError, match="Keras cannot rebuild the metric 'mine' from its config .*"
                                                "register_keras_serializable"):
        TFOptimizer.from_keras(model)


def test_f1_and_f_beta_scores_built_from_the_outputs_shape_report_what_fit_reports():
    """``F1Score`` and ``FBetaScore`` make their per-class counts from the first batch's shape in Keras; tfnet builds
    them on the output's shape before training, so the counts are sums from the start and merge over ranks (before:
    refused). Three classes, one-hot labels, two epochs of training and validation."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)]

    def classifier():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(3, activation="softmax", name="d")],
                                 name="c")
        model.compile(keras.optimizers.SGD(0.5), "categorical_crossentropy",
                      metrics=[keras.metrics.F1Score(average="macro", threshold=0.4, name="f1"),
                               keras.metrics.FBetaScore(beta=2.0, average="weighted", name="f2")])
        return model

    theirs = classifier().fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, validation_data=(x, y)).history
    opt = TFOptimizer.from_keras(classifier())
    ours = opt.optimize((x, y), batch_size=16, epochs=2, shuffle=False, verbose=0, validation_data=(x, y))
    for key in ("f1", "f2", "val_f1", "val_f2"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, err_msg=key)
    # average=None (one score per class) and several thresholds give arrays, which fit's history holds and tfnet's
    # (numbers, for TensorBoard and MLflow) cannot: refused by name before training
    for metric in (keras.metrics.F1Score(name="f1_each"), keras.metrics.Precision(thresholds=[0.3, 0.6], name="p2")):
        model = classifier()
        model.compile(model.optimizer, "categorical_crossentropy", metrics=[metric])
        with pytest.raises(KerasMappingError, match=f"{metric.name!r} gives one result per"):
            TFOptimizer.from_keras(model)
