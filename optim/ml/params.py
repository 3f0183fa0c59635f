"""The training parameters that :class:`~optim.ml.estimator.TFNetEstimator` takes and the model it fits
carries (Spark ML's convention: ``LogisticRegressionModel`` shares ``LogisticRegression``'s params), so
that the best model of a ``CrossValidator`` says which learning rate it was trained with, also after
it is saved and loaded. Driver side."""

from __future__ import annotations

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasSeed

__all__ = ["TrainingParams", "TRAINING_DEFAULTS"]


def _shapes(value):
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(
            s is None or (isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s)) for s in value):
        raise TypeError(f"featureShapes must be a list of per-row shapes, one per feature column (e.g. [[8, 8, 1]]). "
                        f"Received: {value!r}")
    return [None if s is None else list(s) for s in value]


#: The training params' defaults (``featureCols`` and ``featureShapes`` have none).
TRAINING_DEFAULTS = {"labelCol": "label", "loss": "sparse_categorical_crossentropy", "method": "adam",
                     "learningRate": 0.001, "epochs": 1, "batchSize": 32, "numWorkers": 0, "modelDir": "",
                     "seed": 0, "verbose": 0}


class TrainingParams(HasLabelCol, HasSeed):
    """How a TFNet is fine-tuned over Spark: the estimator's settings, and what its fitted model was
    trained with."""

    featureCols = Param(Params._dummy(), "featureCols", "one column per net input", TypeConverters.toListString)
    featureShapes = Param(Params._dummy(), "featureShapes", "per-row shapes of the feature columns", _shapes)
    loss = Param(Params._dummy(), "loss", "a loss name", TypeConverters.toString)
    method = Param(Params._dummy(), "method", "the optimisation method", TypeConverters.toString)
    learningRate = Param(Params._dummy(), "learningRate", "the learning rate", TypeConverters.toFloat)
    epochs = Param(Params._dummy(), "epochs", "epochs", TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "the global batch", TypeConverters.toInt)
    numWorkers = Param(Params._dummy(), "numWorkers", "ranks (0: Spark's default parallelism)", TypeConverters.toInt)
    modelDir = Param(Params._dummy(), "modelDir", "checkpoints and TensorBoard events", TypeConverters.toString)
    verbose = Param(Params._dummy(), "verbose", "0 quiet, 1 progress bar, 2 a line per epoch", TypeConverters.toInt)

    def getLearningRate(self) -> float:  # noqa: N802 (Spark ML names)
        return self.getOrDefault(self.learningRate)

    def copy_training_params(self, to: TrainingParams) -> TrainingParams:
        """Sets on ``to`` every training param defined here (set or by default): what a fitted model
        carries from its estimator."""
        for name in ("featureCols", "featureShapes", *TRAINING_DEFAULTS):
            param = self.getParam(name)
            if self.isDefined(param):
                to._set(**{name: self.getOrDefault(param)})
        return to
