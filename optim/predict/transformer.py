"""TFNetTransformer: TFPredictor as a Spark ML ``Transformer``, for ``pyspark.ml.Pipeline``.

Saving writes the usual ``metadata/`` (the params, as JSON) and the model itself under ``model/``
in the export-folder layout (``frozen_inference_graph.pb`` + ``graph_meta.json``), so a saved
pipeline loads back without the original net. Driver side.
"""

from __future__ import annotations

from pyspark.ml import Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCols, HasOutputCols, HasPredictionCol
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from optim.predict.ml_io import ModelFolderReader, ModelFolderWriter
from optim.predict.predictor import TFPredictor
from optim.predict.snapshot import ModelSnapshot, ModelSource

__all__ = ["TFNetTransformer"]

MODEL_FOLDER = "model"


class TFNetTransformer(Transformer, HasInputCols, HasOutputCols, HasPredictionCol, MLReadable, MLWritable):
    """Adds a model's outputs to a DataFrame, as :meth:`TFPredictor.predict` does.

    Args:
        net: A :class:`tfnet.TFNet`, an export folder, a SavedModel folder, or a frozen graph
            (with ``inputs`` and ``outputs``). The weights are copied now.
        inputCols: One feature column per graph input, in input order. Default: the columns
            named like the inputs.
        outputCols: One new column per graph output. Default: ``"prediction"`` for one
            output, else the output names.
        batchPerThread: Rows per model call in each worker. Default: 32.
        backend: ``"tensorflow"`` (default) or ``"openvino"``.
        onError: ``"raise"`` (default) or ``"null"``; see :class:`TFPredictor`.
        errorCol: The error column with ``onError="null"``. Default: ``"prediction_error"``.
        inputs: Input tensor names, for a frozen graph file only.
        outputs: Output tensor names, for a frozen graph file only.
        predictionCol: Also add this column: the index of the first output's largest value, as a
            double, as Spark ML classifiers give it (for ``MulticlassClassificationEvaluator``).
            Default: "" (not added).

    Example:
        >>> from pyspark.ml import Pipeline, PipelineModel                      # doctest: +SKIP
        >>> stage = TFNetTransformer(net, inputCols=["img"], outputCols=["logits"])  # doctest: +SKIP
        >>> model = Pipeline(stages=[stage]).fit(df)                            # doctest: +SKIP
        >>> model.write().overwrite().save("/tmp/p"); PipelineModel.load("/tmp/p")  # doctest: +SKIP
    """

    batchPerThread = Param(Params._dummy(), "batchPerThread", "rows per model call in each worker",
                           typeConverter=TypeConverters.toInt)
    backend = Param(Params._dummy(), "backend", "'tensorflow' or 'openvino'", typeConverter=TypeConverters.toString)
    onError = Param(Params._dummy(), "onError", "'raise' or 'null'", typeConverter=TypeConverters.toString)
    errorCol = Param(Params._dummy(), "errorCol", "error column for onError='null'",
                     typeConverter=TypeConverters.toString)

    def __init__(self, net: ModelSource | None = None, inputCols: list[str] | None = None,  # noqa: N803 (Spark ML names)
                 outputCols: list[str] | None = None, batchPerThread: int = 32, backend: str = "tensorflow",
                 onError: str = "raise", errorCol: str = "prediction_error", *, inputs=None, outputs=None,
                 predictionCol: str = ""):
        super().__init__()
        self._setDefault(batchPerThread=32, backend="tensorflow", onError="raise", errorCol="prediction_error",
                         predictionCol="")
        self._set(batchPerThread=batchPerThread, backend=backend, onError=onError, errorCol=errorCol,
                  predictionCol=predictionCol)
        if inputCols is not None:
            self._set(inputCols=inputCols)
        if outputCols is not None:
            self._set(outputCols=outputCols)
        self._snapshot = None if net is None else ModelSnapshot.from_source(net, inputs, outputs)
        self._predictors: dict = {}
        if net is not None:
            self._predictor()  # check the params (and the backend) now, not at the first transform

    @property
    def snapshot(self) -> ModelSnapshot:
        if self._snapshot is None:
            raise ValueError("This TFNetTransformer has no model: pass `net` or load a saved one.")
        return self._snapshot

    def _predictor(self) -> TFPredictor:
        """One TFPredictor per set of params, so the model is broadcast once per setting."""
        key = (self.getOrDefault(self.batchPerThread), self.getOrDefault(self.backend),
               self.getOrDefault(self.onError), self.getOrDefault(self.errorCol))
        if key not in self._predictors:
            self._predictors[key] = TFPredictor(
                self.snapshot, batch_per_thread=key[0], backend=key[1], on_error=key[2], error_col=key[3])
        return self._predictors[key]

    def _transform(self, dataset):
        inputs = self.getOrDefault(self.inputCols) if self.isDefined(self.inputCols) else None
        outputs = self.getOrDefault(self.outputCols) if self.isDefined(self.outputCols) else None
        out = self._predictor().predict(dataset, feature_cols=inputs, output_cols=outputs)
        label = self.getOrDefault(self.predictionCol)
        if not label:
            return out
        from pyspark.sql import functions as F

        first = [c for c in out.columns if c not in dataset.columns][0]
        # the class index in Spark SQL (no Python UDF): the position of the largest value, 0-based
        return out.withColumn(label, (F.array_position(F.col(first), F.array_max(F.col(first))) - 1).cast("double"))

    def copy(self, extra=None) -> TFNetTransformer:
        that = super().copy(extra)
        that._predictors = self._predictors  # same model: share the broadcasts
        return that

    def write(self) -> MLWriter:
        return ModelFolderWriter(self, MODEL_FOLDER, self.snapshot.save)  # no model: the error comes now

    @classmethod
    def read(cls) -> MLReader:
        return ModelFolderReader(cls, MODEL_FOLDER, _load_snapshot)


def _load_snapshot(instance, folder: str) -> None:
    instance._snapshot = ModelSnapshot.load(folder)
