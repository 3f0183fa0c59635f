"""TFNetEstimator as Spark ML users use an Estimator: in a Pipeline, under CrossValidator with a
ParamGridBuilder over the learning rate (two rates, two folds), evaluated by Spark ML's own
MulticlassClassificationEvaluator, saved and loaded with the pipeline; the best model carries the
estimator's params (the rate the search chose), saved and loaded too. Real local[2] Spark, two
Horovod ranks per fit, digits."""

import keras
import numpy as np
import pytest

import optim
from optim import TFNetEstimator, TFNetModel, TFNetTransformer, TFOptimizer
from tests import digits
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]


def transfer_net():
    """A CNN pretrained on digits 0-4, cut at its features, with a new 10-way head."""
    x, y = digits.load(range(5))
    base = digits.cnn(classes=5)
    base.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pre = TFOptimizer.from_keras(base)
    pre.optimize((x, y), epochs=8, batch_size=32, verbose=0)
    body = TFNet.from_frozen_graph(pre.net.frozen_graph_def(), "image", "logits").cut("features")
    keras.utils.set_random_seed(1)
    return body.add_head(keras.layers.Dense(10, name="digit"))


def test_cross_validator_chooses_a_rate_and_the_model_saves_with_the_pipeline(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import SQLTransformer
    from pyspark.ml.tuning import CrossValidator, CrossValidatorModel, ParamGridBuilder

    (xtr, ytr), (xte, yte) = digits.split(*digits.load(range(5, 10)))
    train = spark.createDataFrame([(xtr[i].ravel().tolist(), float(ytr[i])) for i in range(len(xtr))],
                                  "pixels array<float>, label double").repartition(2)
    test = spark.createDataFrame([(xte[i].ravel().tolist(), float(yte[i])) for i in range(len(xte))],
                                 "pixels array<float>, label double")
    est = TFNetEstimator(transfer_net(), featureCols=["scaled"], featureShapes=[[8, 8, 1]], method="adam",
                         epochs=6, batchSize=32, numWorkers=2, outputCols=["logits"])
    pipeline = Pipeline(stages=[SQLTransformer(statement="SELECT *, pixels AS scaled FROM __THIS__"), est])
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-5, 0.01]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=3)
    model = cv.fit(train)
    assert model.avgMetrics[1] > model.avgMetrics[0], model.avgMetrics  # 0.01 learns; 1e-5 barely moves
    chosen = model.bestModel.stages[-1]
    assert isinstance(chosen, TFNetTransformer) and isinstance(chosen, TFNetModel)
    # the model carries its estimator's params, as Spark ML's models do: the rate the search chose
    assert chosen.getOrDefault("learningRate") == 0.01 and chosen.getOrDefault("epochs") == 6
    accuracy = evaluator.evaluate(model.transform(test))
    assert accuracy >= 0.95, (accuracy, model.avgMetrics)
    # saved and loaded with the pipeline, it scores the same
    model.bestModel.write().overwrite().save(str(tmp_path / "best"))
    loaded = PipelineModel.load(str(tmp_path / "best"))
    assert evaluator.evaluate(loaded.transform(test)) == accuracy
    assert type(loaded.stages[-1]) is TFNetModel and loaded.stages[-1].getOrDefault("learningRate") == 0.01
    assert loaded.stages[-1].getOrDefault("featureShapes") == [[8, 8, 1]]
    cv_path = str(tmp_path / "cv")
    model.write().overwrite().save(cv_path)
    assert CrossValidatorModel.load(cv_path).avgMetrics == model.avgMetrics
    # the estimator itself saves and loads (its params and the initial net)
    est.write().overwrite().save(str(tmp_path / "est"))
    back = TFNetEstimator.load(str(tmp_path / "est"))
    assert back.getLearningRate() == est.getLearningRate() and back.getOrDefault("epochs") == 6
    assert back.getOrDefault("featureShapes") == [[8, 8, 1]]


def test_estimator_errors(spark):
    with pytest.raises(ValueError, match=r"Unknown method 'lbfgs'. Methods: \['adagrad', 'adam', 'adamw', "):
        TFNetEstimator(TFNet.from_keras(digits.cnn(10)), featureCols=["pixels"], method="lbfgs")
    with pytest.raises(TypeError, match=r"featureShapes must be a list of per-row shapes"):
        TFNetEstimator(TFNet.from_keras(digits.cnn(10)), featureCols=["pixels"], featureShapes="8x8")
    df = spark.createDataFrame([([0.0] * 64, 1.0)], "pixels array<float>, label double")
    with pytest.raises(ValueError, match=r"needs featureCols"):
        TFNetEstimator(TFNet.from_keras(digits.cnn(10))).fit(df)
    assert isinstance(optim.TFNetEstimator(), TFNetEstimator)
    np.testing.assert_equal(TFNetEstimator().copy({}).getOrDefault("learningRate"), 0.001)
