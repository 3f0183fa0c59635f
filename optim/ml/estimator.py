"""TFNetEstimator: fine-tuning as a Spark ML ``Estimator``, for ``Pipeline``, ``CrossValidator`` and
``TrainValidationSplit``. Driver side.

``fit(df)`` copies the net, trains it over Spark exactly as ``TFOptimizer.optimize`` does with a
DataFrame, and returns a :class:`~optim.ml.model.TFNetModel` (a
:class:`~optim.predict.transformer.TFNetTransformer`) holding the fine-tuned weights and the training
params. Every setting is a ``Param`` (so ``copy(extra)`` and ``ParamGridBuilder`` reach all of
them), and both save and load with the pipeline (``MLWritable`` / ``MLReadable``): the params as
JSON, the initial net in the export-folder layout.
"""

from __future__ import annotations

import os

from pyspark.ml import Estimator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasPredictionCol, HasProbabilityCol, HasRawPredictionCol
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from optim import losses, methods
from optim.data import TFDataset
from optim.ml.evaluators import check_evaluator, tuning_evaluator
from optim.ml.model import TFNetModel
from optim.ml.params import TRAINING_DEFAULTS, TrainingParams
from optim.optimizer import TFOptimizer
from optim.predict.classification import MLColumns, check_task, scores_are_logits, task_for_loss, units
from optim.predict.ml_io import ModelFolderReader, ModelFolderWriter
from tfnet.serialize import net_from_bytes

__all__ = ["TFNetEstimator"]

MODEL_FOLDER = "initial_model"
_METHODS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad"}


class TFNetEstimator(Estimator, TrainingParams, HasPredictionCol, HasRawPredictionCol, HasProbabilityCol,
                     MLReadable, MLWritable):
    """Fine-tunes a TFNet over Spark; ``fit`` returns a :class:`~optim.ml.model.TFNetModel` (a
    :class:`TFNetTransformer` that carries this estimator's training params, as Spark ML's models do:
    ``cv.fit(df).bestModel.getOrDefault("learningRate")`` is the rate the search chose).

    The fitted model is a Spark ML classifier or regressor, as the loss says: a cross-entropy gives
    ``rawPrediction`` and ``probability`` vectors and a ``prediction`` double (the class index;
    right for one sigmoid output, softmax and logits alike), mse, mae and Huber a ``prediction``
    double (the value). Spark ML's evaluators read them directly, inside ``CrossValidator`` and
    ``TrainValidationSplit`` too, where an evaluator that cannot read this estimator's columns
    (a missing or misnamed column, a binary evaluator over more than two classes) fails before
    any fold trains.

    Args:
        net: The TFNet to fine-tune (copied at each ``fit``: the estimator is never changed).
        featureCols: One column per net input, in input order (array or Spark ML Vector columns).
        labelCol: The label column. Default ``"label"``.
        featureShapes: Per-row shapes of the feature columns, one per column (``[[8, 8, 1]]``).
            Default: as stored.
        outputCols: The fitted model's columns, one per net output. Default: ``["output"]`` (or the
            output names for several outputs).
        predictionCol: The fitted model's ``prediction`` column: the class index or the value, a
            double, as Spark ML's classifiers and regressors give it. Default ``"prediction"``; ""
            for none.
        rawPredictionCol: Classification: the raw scores, a vector. Default ``"rawPrediction"``.
        probabilityCol: Classification: the class probabilities, a vector. Default
            ``"probability"``.
        loss: A loss name (``optim.losses``). Default ``"sparse_categorical_crossentropy"``.
        fromLogits: The outputs are logits (for the loss and the fitted model's probabilities).
            Default: probabilities when a Softmax or Sigmoid op makes the first output, else
            logits.
        task: ``"auto"`` (default: from the loss, see above), ``"classification"``,
            ``"regression"`` or ``"none"`` (the raw outputs only).
        method: ``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"`` or ``"adagrad"``. Default ``"adam"``.
        learningRate: Default 0.001.
        epochs: Default 1. batchSize: The global batch. Default 32.
        numWorkers: Ranks. Default: Spark's default parallelism.
        modelDir: Checkpoints and TensorBoard events. Default: none.
        seed: The shuffling seed. Default 0.
        verbose: As ``optimize``'s. Default 0.
    """

    outputCols = Param(Params._dummy(), "outputCols", "the fitted model's output columns", TypeConverters.toListString)
    fromLogits = Param(Params._dummy(), "fromLogits", "the outputs are logits", TypeConverters.toBoolean)
    task = Param(Params._dummy(), "task", "'auto', 'none', 'classification' or 'regression'", TypeConverters.toString)

    def __init__(self, net=None, *, featureCols=None, labelCol="label", featureShapes=None, outputCols=None,  # noqa: N803
                 predictionCol="prediction", loss="sparse_categorical_crossentropy", fromLogits=None, method="adam",
                 learningRate=0.001, epochs=1, batchSize=32, numWorkers=0, modelDir="", seed=0, verbose=0,
                 task="auto", rawPredictionCol="rawPrediction", probabilityCol="probability"):
        super().__init__()
        self._setDefault(**TRAINING_DEFAULTS, predictionCol="prediction", task="auto",
                         rawPredictionCol="rawPrediction", probabilityCol="probability")
        self._set(labelCol=labelCol, predictionCol=predictionCol, loss=loss, method=method,
                  learningRate=learningRate, epochs=epochs, batchSize=batchSize, numWorkers=numWorkers,
                  modelDir=modelDir, seed=seed, verbose=verbose, task=task, rawPredictionCol=rawPredictionCol,
                  probabilityCol=probabilityCol)
        for name, value in (("featureCols", featureCols), ("featureShapes", featureShapes), ("outputCols", outputCols),
                            ("fromLogits", fromLogits)):
            if value is not None:
                self._set(**{name: value})
        if method.lower() not in _METHODS:
            raise ValueError(f"Unknown method {method!r}. Methods: {sorted(_METHODS)}")
        if task != "auto":
            check_task(task)
        self._net_bytes = None if net is None else _net_bytes(net)

    def setLearningRate(self, value: float) -> TFNetEstimator:  # noqa: N802 (Spark ML names)
        return self._set(learningRate=value)

    def setEpochs(self, value: int) -> TFNetEstimator:  # noqa: N802
        return self._set(epochs=value)

    def _get(self, param):
        return self.getOrDefault(param) if self.isDefined(param) else None

    def _fit(self, dataset):
        if self._net_bytes is None:
            raise ValueError("This TFNetEstimator has no net: pass `net`, or load a saved estimator.")
        cols = self._get(self.featureCols)
        if not cols:
            raise ValueError("TFNetEstimator needs featureCols: one column per net input, in input order.")
        net = net_from_bytes(self._net_bytes)  # a copy: the estimator's net is never changed
        loss = losses.get(self.getOrDefault(self.loss))
        from_logits = self._from_logits(net)
        if hasattr(loss, "from_logits"):
            loss.from_logits = from_logits
        columns = self.mlColumns(loss)
        outputs = self._get(self.outputCols) or (["output"] if len(net.output_names) == 1 else None)
        if columns.task != "none":
            units(tuple(net.output_specs[0].shape.as_list()[1:]), net.output_names[0], columns.task)
        evaluator = tuning_evaluator(self)  # inside CrossValidator or TrainValidationSplit: checked before a fold
        if evaluator is not None:
            check_evaluator(evaluator, columns, self.getOrDefault(self.labelCol), net.output_specs[0], dataset.columns)
        method = getattr(methods, _METHODS[self.getOrDefault(self.method).lower()])(self.getOrDefault(self.learningRate))
        opt = TFOptimizer(net, loss, method, model_dir=self.getOrDefault(self.modelDir) or None)
        data = TFDataset.from_dataframe(dataset, cols, self.getOrDefault(self.labelCol),
                                        feature_shapes=self._get(self.featureShapes))
        workers = self.getOrDefault(self.numWorkers) or None
        opt.optimize(data, epochs=self.getOrDefault(self.epochs), batch_size=self.getOrDefault(self.batchSize),
                     seed=self.getOrDefault(self.seed), verbose=self.getOrDefault(self.verbose), num_workers=workers)
        model = TFNetModel(net, inputCols=cols, outputCols=outputs, task=columns.task, fromLogits=from_logits,
                           predictionCol=columns.prediction, rawPredictionCol=columns.raw_prediction,
                           probabilityCol=columns.probability)
        self.copy_training_params(model)  # the model carries what it was trained with (saved with it)
        model.history = opt.last_run  # what the fit measured (not saved)
        return model

    def _from_logits(self, net) -> bool:
        """``fromLogits`` when set, else whether the graph's last op says logits (no Softmax or Sigmoid)."""
        if self.isDefined(self.fromLogits):
            return self.getOrDefault(self.fromLogits)
        return scores_are_logits(net.frozen_graph_def(), net.output_names[0])

    def mlColumns(self, loss=None) -> MLColumns:  # noqa: N802 (Spark ML names)
        """The Spark ML columns the fitted model adds: its task (``"auto"``: from the loss) and the
        column names."""
        task = self.getOrDefault(self.task)
        if task == "auto":
            task = task_for_loss(loss if loss is not None else losses.get(self.getOrDefault(self.loss)))
        return MLColumns(task, self.getOrDefault(self.predictionCol), self.getOrDefault(self.rawPredictionCol),
                         self.getOrDefault(self.probabilityCol))

    def checkEvaluator(self, evaluator, dataset=None) -> None:  # noqa: N802
        """Raises :class:`~optim.ColumnError` when ``evaluator`` cannot read the fitted model's
        columns (what ``CrossValidator`` and ``TrainValidationSplit`` check before the first fold).
        ``dataset``: the DataFrame to fit, for its label column. Default: not checked."""
        from optim.ml.evaluators import check_evaluator
        from tfnet.serialize import net_from_bytes

        if self._net_bytes is None:
            raise ValueError("This TFNetEstimator has no net: pass `net`, or load a saved estimator.")
        net = net_from_bytes(self._net_bytes)
        check_evaluator(evaluator, self.mlColumns(), self.getOrDefault(self.labelCol), net.output_specs[0],
                        None if dataset is None else dataset.columns)

    def copy(self, extra=None) -> TFNetEstimator:
        that = super().copy(extra)
        that._net_bytes = self._net_bytes  # the same initial net: immutable bytes, shared
        return that

    def write(self) -> MLWriter:
        return ModelFolderWriter(self, MODEL_FOLDER, _save_net(self._net_bytes) if self._net_bytes is not None else None)

    @classmethod
    def read(cls) -> MLReader:
        return ModelFolderReader(cls, MODEL_FOLDER, _load_net)


def _save_net(net_bytes: bytes):
    def save(folder: str) -> None:
        from tfnet.serialize import net_from_bytes

        net_from_bytes(net_bytes).save(folder)

    return save


def _load_net(instance, folder: str) -> None:
    if os.path.isdir(folder):  # an estimator saved without a net has no folder
        from tfnet import TFNet

        instance._net_bytes = _net_bytes(TFNet.load(folder))


def _net_bytes(net) -> bytes:
    from tfnet import TFNet
    from tfnet.serialize import net_to_bytes

    if not isinstance(net, TFNet):
        raise TypeError(f"TFNetEstimator fine-tunes a tfnet.TFNet. Received: {type(net).__name__}")
    return net_to_bytes(net)
