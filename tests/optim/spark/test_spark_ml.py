"""Spark ML's conventions (issue 33, points 1-3): TFNetEstimator's model and TFNetTransformer write
``rawPrediction`` and ``probability`` vectors and a ``prediction`` double, right for one sigmoid
output, softmax and logits; Spark ML's evaluators read them directly, inside CrossValidator too; a
bad evaluator fails before any fold trains; ``prediction`` means one thing. Real local[2] Spark,
scikit-learn's breast-cancer and wine tables through Parquet, scikit-learn as the oracle."""

import json
import os

import keras
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, roc_auc_score
from sklearn.preprocessing import StandardScaler

from optim import ColumnError, TFNetEstimator, TFNetTransformer, TFPredictor
from tfnet import TFNet

pytestmark = pytest.mark.spark


def _table(spark, tmp_path, x, y, name):
    """The table as a user has it: a Parquet file of one double column per feature, a label and a fold."""
    import pandas as pd

    frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(x.shape[1])])
    frame["label"], frame["fold"], frame["id"] = y.astype(float), np.arange(len(y)) % 2, np.arange(len(y))
    path = str(tmp_path / f"{name}.parquet")
    frame.to_parquet(path)
    return spark.read.parquet(path)


def _features(df, n):
    """A VectorAssembler and a standard scaler, as a Spark ML user would prepare the table."""
    from pyspark.ml.feature import StandardScaler as SparkScaler
    from pyspark.ml.feature import VectorAssembler

    return [VectorAssembler(inputCols=[f"f{j}" for j in range(n)], outputCol="raw"),
            SparkScaler(inputCol="raw", outputCol="features", withMean=True, withStd=True)]


def _dense(n_in, units, activation=None, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((n_in,), name="x"), keras.layers.Dense(units, activation=activation,
                                                                                 name="scores")])
    return model, TFNet.from_keras(model)


@pytest.mark.parallel
@pytest.mark.slow
def test_cross_validator_auc_of_one_sigmoid_output_matches_logistic_regression(spark, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    x, y = load_breast_cancer(return_X_y=True)
    df = _table(spark, tmp_path, x, y, "cancer")
    _, net = _dense(30, 1, "sigmoid")
    est = TFNetEstimator(net, featureCols=["features"], loss="binary_crossentropy", learningRate=0.05, epochs=12,
                         batchSize=32, numWorkers=2)
    grid = ParamGridBuilder().addGrid(est.learningRate, [0.05]).build()
    cv = CrossValidator(estimator=Pipeline(stages=_features(df, 30) + [est]), estimatorParamMaps=grid,
                        evaluator=BinaryClassificationEvaluator(), numFolds=2, foldCol="fold")
    model = cv.fit(df)
    # scikit-learn's logistic regression on the same two folds, scaled the same way
    fold = np.arange(len(y)) % 2
    aucs = []
    for k in range(2):
        train, held = fold != k, fold == k
        scaler = StandardScaler().fit(x[train])
        lr = LogisticRegression(max_iter=2000).fit(scaler.transform(x[train]), y[train])
        aucs.append(roc_auc_score(y[held], lr.decision_function(scaler.transform(x[held]))))
    assert abs(model.avgMetrics[0] - np.mean(aucs)) <= 0.02, (model.avgMetrics, aucs)

    out = model.transform(df)
    types = {f.name: type(f.dataType).__name__ for f in out.schema.fields}
    assert (types["rawPrediction"], types["probability"], types["prediction"]) == ("VectorUDT", "VectorUDT", "DoubleType")
    rows = out.select("id", "output", "rawPrediction", "probability", "prediction", "label").toPandas().sort_values("id")
    p = np.array([o[0] for o in rows["output"]])
    np.testing.assert_allclose(np.stack([v.toArray() for v in rows["probability"]]), np.stack([1 - p, p], 1), atol=1e-6)
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), (p > 0.5).astype(float))  # not argmax of one value
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    assert accuracy == pytest.approx(accuracy_score(y, p > 0.5)) and accuracy > 0.95, accuracy
    assert BinaryClassificationEvaluator().evaluate(out) == pytest.approx(roc_auc_score(y, p), abs=1e-6)


@pytest.mark.parametrize("activation,units", [("sigmoid", 1), (None, 1), ("softmax", 3), (None, 3)],
                         ids=["one-sigmoid", "one-logit", "softmax", "logits"])
def test_classifier_columns_and_evaluators(spark, tmp_path, activation, units):
    """rawPrediction, probability and prediction against numpy on Keras's own output, and Spark's
    evaluators against scikit-learn on the same scores."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator

    x, y = load_wine(return_X_y=True) if units == 3 else load_breast_cancer(return_X_y=True)
    x = StandardScaler().fit_transform(x)
    model, net = _dense(x.shape[1], units, activation, seed=1)
    df = spark.createDataFrame([(i, x[i].astype("float32").tolist(), float(y[i])) for i in range(len(y))],
                               "id long, x array<float>, label double")
    stage = TFNetTransformer(net, inputCols=["x"], task="classification")  # fromLogits: from the graph's last op
    rows = stage.transform(df).toPandas().sort_values("id")
    keras_out = model.predict(x.astype("float32"), verbose=0).astype(np.float64)
    if units == 1:
        z = keras_out[:, 0]
        p = z if activation else 1 / (1 + np.exp(-z))
        want_prob, want_raw = np.stack([1 - p, p], 1), (np.stack([1 - p, p], 1) if activation else np.stack([-z, z], 1))
    else:
        want_prob = keras_out if activation else np.exp(keras_out) / np.exp(keras_out).sum(1, keepdims=True)
        want_raw = keras_out
    np.testing.assert_allclose(np.stack([v.toArray() for v in rows["probability"]]), want_prob, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack([v.toArray() for v in rows["rawPrediction"]]), want_raw, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), np.argmax(want_prob, 1).astype(float))
    scored = stage.transform(df)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    assert accuracy == pytest.approx(accuracy_score(y, np.argmax(want_prob, 1)))
    if units == 1:
        auc = BinaryClassificationEvaluator().evaluate(scored)
        assert auc == pytest.approx(roc_auc_score(y, want_prob[:, 1]), abs=1e-6)
    else:
        log_loss = MulticlassClassificationEvaluator(metricName="logLoss").evaluate(scored)
        assert log_loss == pytest.approx(-np.mean(np.log(want_prob[np.arange(len(y)), y])), rel=1e-4)


def test_regression_gives_a_double_prediction_and_task_errors(spark):
    from pyspark.ml.evaluation import RegressionEvaluator

    x = np.random.RandomState(0).randn(40, 5).astype("float32")
    model, net = _dense(5, 1)
    df = spark.createDataFrame([(i, x[i].tolist(), float(i)) for i in range(40)], "id long, x array<float>, label double")
    out = TFNetTransformer(net, inputCols=["x"], task="regression").transform(df)
    assert out.schema["prediction"].dataType.simpleString() == "double"
    rows = out.toPandas().sort_values("id")
    np.testing.assert_allclose(rows["prediction"].to_numpy(), model.predict(x, verbose=0)[:, 0], rtol=1e-5, atol=1e-6)
    rmse = RegressionEvaluator(metricName="rmse").evaluate(out)
    assert rmse == pytest.approx(np.sqrt(np.mean((rows["prediction"].to_numpy() - np.arange(40)) ** 2)), rel=1e-6)
    # a vector output cannot regress; taken names are refused before any job
    _, wide = _dense(5, 3)
    with pytest.raises(ColumnError, match=r"task='regression' gives a double `prediction` from an output with one "
                                          r"value per row; output 'scores:0' has 3 values per row"):
        TFNetTransformer(wide, inputCols=["x"], task="regression").transform(df)
    with pytest.raises(ColumnError, match=r"Column 'label' \(one of rawPredictionCol, probabilityCol, predictionCol\) "
                                          r"is already in the DataFrame"):
        TFNetTransformer(wide, inputCols=["x"], task="classification", predictionCol="label").transform(df)
    with pytest.raises(ValueError, match=r"`task` must be one of \['none', 'classification', 'regression'\]. "
                                         r"Received: task='ranking'"):
        TFNetTransformer(wide, inputCols=["x"], task="ranking")


def _wine_estimator(tmp_path, loss="sparse_categorical_crossentropy", **kw):
    _, net = _dense(13, 3 if "categorical" in loss else 1, "softmax" if "categorical" in loss else None)
    return TFNetEstimator(net, featureCols=["features"], loss=loss, epochs=2, batchSize=32, numWorkers=2,
                          modelDir=str(tmp_path / "runs"), **kw)


@pytest.mark.parametrize("case", ["binary-over-three-classes", "binary-over-a-regressor", "misnamed-column",
                                  "log-loss-without-probabilities"])
def test_a_bad_evaluator_fails_before_any_fold_trains(spark, tmp_path, case):
    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit

    x, y = load_wine(return_X_y=True)
    df = _table(spark, tmp_path, x, y, "wine")
    if case == "binary-over-three-classes":
        est, evaluator = _wine_estimator(tmp_path), BinaryClassificationEvaluator()
        match = (r"BinaryClassificationEvaluator cannot evaluate this TFNetEstimator's model: the net's first output "
                 r"scores 3 classes and a binary evaluator reads two; use MulticlassClassificationEvaluator. The model "
                 r"writes \['rawPrediction', 'probability', 'prediction'\] \(task='classification'\); nothing has "
                 r"trained yet.")
    elif case == "binary-over-a-regressor":
        est, evaluator = _wine_estimator(tmp_path, loss="mse"), BinaryClassificationEvaluator()
        match = r"it needs class scores; set the estimator's task='classification'.*writes \['prediction'\] \(task='regression'\)"
    elif case == "misnamed-column":
        est, evaluator = _wine_estimator(tmp_path), MulticlassClassificationEvaluator(predictionCol="predicted")
        match = r"it reads predictionCol='predicted' \(the class index\), which the model does not write"
    else:
        est = _wine_estimator(tmp_path, probabilityCol="")
        evaluator = MulticlassClassificationEvaluator(metricName="logLoss")
        match = r"it reads probabilityCol='probability' \(the probabilities, for logLoss\), which the model does not write"
    grid = ParamGridBuilder().addGrid(est.learningRate, [0.01, 0.1]).build()
    pipeline = Pipeline(stages=_features(df, 13) + [est])
    tuner = (TrainValidationSplit(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator)
             if case == "misnamed-column" else
             CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, foldCol="fold"))
    with pytest.raises(ColumnError, match=match):
        tuner.fit(df)
    assert not os.path.exists(tmp_path / "runs" / "checkpoints")  # no fold trained: no checkpoint written
    # the same check, asked for directly
    with pytest.raises(ColumnError, match=match):
        est.checkEvaluator(evaluator, df)


def test_prediction_means_one_thing(spark, tmp_path):
    """TFPredictor's raw output column is ``output``; ``prediction`` is only ever Spark ML's double.
    A TFNetTransformer saved before ``task`` existed keeps the columns it wrote."""
    from pyspark.ml import PipelineModel

    x = np.random.RandomState(1).randn(8, 5).astype("float32")
    _, net = _dense(5, 3)
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(8)], "id long, x array<float>")
    assert TFPredictor(net).predict(df, feature_cols="x").columns == ["id", "x", "output"]
    assert TFNetTransformer(net, inputCols=["x"]).transform(df).columns == ["id", "x", "output"]
    assert TFNetTransformer(net, inputCols=["x"], predictionCol="prediction").transform(df).columns == [
        "id", "x", "output", "rawPrediction", "probability", "prediction"]
    # an old save: no `task` param, the one output under "prediction", a class index under "label_index"
    old = TFNetTransformer(net, inputCols=["x"], predictionCol="label_index")
    path = str(tmp_path / "old")
    from pyspark.ml import Pipeline

    Pipeline(stages=[old]).fit(df).write().overwrite().save(path)
    meta_dir = os.path.join(path, "stages", os.listdir(os.path.join(path, "stages"))[0], "metadata")
    meta_file = [f for f in os.listdir(meta_dir) if f.startswith("part-")][0]
    meta = json.loads(open(os.path.join(meta_dir, meta_file)).read())
    for key in ("paramMap", "defaultParamMap"):
        for name in ("task", "rawPredictionCol", "probabilityCol", "fromLogits"):
            meta[key].pop(name, None)
    meta["defaultParamMap"]["predictionCol"] = ""
    open(os.path.join(meta_dir, meta_file), "w").write(json.dumps(meta))
    os.remove(os.path.join(meta_dir, f".{meta_file}.crc"))  # Hadoop's checksum of the old text
    loaded = PipelineModel.load(path)
    rows = loaded.transform(df).orderBy("id").collect()
    assert loaded.transform(df).columns[:4] == ["id", "x", "prediction", "rawPrediction"]
    np.testing.assert_allclose(np.array([r.prediction for r in rows]), net.forward(x), rtol=1e-6)
    np.testing.assert_array_equal([r.label_index for r in rows], np.argmax(net.forward(x), 1).astype(float))
