"""TFNetModel: what :class:`~optim.ml.estimator.TFNetEstimator` fits. Driver side.

A :class:`~optim.predict.transformer.TFNetTransformer` (the fine-tuned net, its Spark ML columns) that
also carries the estimator's training params, as Spark ML's own models carry their estimators'
(``LogisticRegressionModel.getRegParam()``): ``getOrDefault("learningRate")`` on the best model of a
``CrossValidator`` is the rate the search chose. The params save and load with the model.
"""

from __future__ import annotations

from optim.ml.params import TRAINING_DEFAULTS, TrainingParams
from optim.predict.transformer import TFNetTransformer

__all__ = ["TFNetModel"]


class TFNetModel(TFNetTransformer, TrainingParams):
    """A fine-tuned net as a Spark ML model: a :class:`TFNetTransformer` with the training params
    of the :class:`~optim.TFNetEstimator` that fitted it (``featureCols``, ``featureShapes``,
    ``labelCol``, ``loss``, ``method``, ``learningRate``, ``epochs``, ``batchSize``, ``numWorkers``,
    ``modelDir``, ``seed``, ``verbose``). Takes :class:`TFNetTransformer`'s arguments.

    Example:
        >>> cv_model = CrossValidator(estimator=est, estimatorParamMaps=grid, ...).fit(df)  # doctest: +SKIP
        >>> cv_model.bestModel.getOrDefault("learningRate")                               # doctest: +SKIP
        0.01
    """

    def __init__(self, net=None, inputCols=None, outputCols=None, **kwargs):  # noqa: N803 (Spark ML names)
        super().__init__(net, inputCols, outputCols, **kwargs)
        self._setDefault(**TRAINING_DEFAULTS)
