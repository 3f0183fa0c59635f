"""TFNetTransformer: TFPredictor as a Spark ML ``Transformer``, for ``pyspark.ml.Pipeline``.

Saving writes the usual ``metadata/`` (the params, as JSON) and the model itself under ``model/``
in the export-folder layout (``frozen_inference_graph.pb`` + ``graph_meta.json``), so a saved
pipeline loads back without the original net. Driver side.
"""

from __future__ import annotations

from pyspark.ml import Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasInputCols,
    HasOutputCols,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
)
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from optim.errors import ColumnError
from optim.predict.classification import MLColumns, add_prediction_columns, check_task, scores_are_logits, units
from optim.predict.columns import default_output_columns
from optim.predict.ml_io import ModelFolderReader, ModelFolderWriter
from optim.predict.predictor import TFPredictor
from optim.predict.snapshot import ModelSnapshot, ModelSource

__all__ = ["TFNetTransformer"]

MODEL_FOLDER = "model"


class TFNetTransformer(Transformer, HasInputCols, HasOutputCols, HasPredictionCol, HasRawPredictionCol,
                       HasProbabilityCol, MLReadable, MLWritable):
    """Adds a model's outputs to a DataFrame, as :meth:`TFPredictor.predict` does, and, asked to
    classify or regress, Spark ML's prediction columns.

    With ``task="classification"`` it is a Spark ML classifier: ``rawPrediction`` and
    ``probability`` (``VectorUDT``) and ``prediction`` (a double, the class index) come from the
    first output, so ``BinaryClassificationEvaluator`` and ``MulticlassClassificationEvaluator`` read
    it as they read Spark's own classifiers (see :mod:`optim.predict.classification` for how one
    sigmoid, softmax and logits outputs map). With ``task="regression"``: ``prediction`` (a double)
    is the first output's value. ``prediction`` never means anything else in tfnet: the raw outputs
    are array columns named ``outputCols``.

    Args:
        net: A :class:`tfnet.TFNet`, an export folder, a SavedModel folder, or a frozen graph
            (with ``inputs`` and ``outputs``). The weights are copied now.
        inputCols: One feature column per graph input, in input order. Default: the columns
            named like the inputs.
        outputCols: One new column per graph output (the raw outputs, as arrays). Default:
            ``"output"`` for one output, else the output names.
        batchPerThread: Rows per model call in each worker. Default: 32.
        backend: ``"tensorflow"`` (default) or ``"openvino"``.
        onError: ``"raise"`` (default) or ``"null"``; see :class:`TFPredictor`.
        errorCol: The error column with ``onError="null"``. Default: ``"prediction_error"``.
        inputs: Input tensor names, for a frozen graph file only.
        outputs: Output tensor names, for a frozen graph file only.
        task: ``"none"``, ``"classification"`` or ``"regression"``. Default: ``"classification"``
            when ``predictionCol`` is given (as before this parameter existed), else ``"none"``.
        fromLogits: For classification: the first output holds logits (True) or probabilities
            (False). Default: probabilities when a Softmax or Sigmoid op makes the output, else
            logits.
        predictionCol: The class index or value, a double. Default: ``"prediction"`` when a task
            is set; "" to leave it out.
        rawPredictionCol: Classification: the raw scores, a vector. Default ``"rawPrediction"``;
            "" to leave it out.
        probabilityCol: Classification: the class probabilities, a vector. Default
            ``"probability"``; "" to leave it out.

    Example:
        >>> from pyspark.ml import Pipeline, PipelineModel                      # doctest: +SKIP
        >>> stage = TFNetTransformer(net, inputCols=["img"], task="classification")  # doctest: +SKIP
        >>> model = Pipeline(stages=[stage]).fit(df)                            # doctest: +SKIP
        >>> model.write().overwrite().save("/tmp/p"); PipelineModel.load("/tmp/p")  # doctest: +SKIP
    """

    batchPerThread = Param(Params._dummy(), "batchPerThread", "rows per model call in each worker",
                           typeConverter=TypeConverters.toInt)
    backend = Param(Params._dummy(), "backend", "'tensorflow' or 'openvino'", typeConverter=TypeConverters.toString)
    onError = Param(Params._dummy(), "onError", "'raise' or 'null'", typeConverter=TypeConverters.toString)
    errorCol = Param(Params._dummy(), "errorCol", "error column for onError='null'",
                     typeConverter=TypeConverters.toString)
    task = Param(Params._dummy(), "task", "'none', 'classification' or 'regression'",
                 typeConverter=TypeConverters.toString)
    fromLogits = Param(Params._dummy(), "fromLogits", "classification: the first output holds logits",
                       typeConverter=TypeConverters.toBoolean)

    def __init__(self, net: ModelSource | None = None, inputCols: list[str] | None = None,  # noqa: N803 (Spark ML names)
                 outputCols: list[str] | None = None, batchPerThread: int = 32, backend: str = "tensorflow",
                 onError: str = "raise", errorCol: str = "prediction_error", *, inputs=None, outputs=None,
                 predictionCol: str | None = None, task: str | None = None, fromLogits: bool | None = None,
                 rawPredictionCol: str = "rawPrediction", probabilityCol: str = "probability"):
        super().__init__()
        self._setDefault(batchPerThread=32, backend="tensorflow", onError="raise", errorCol="prediction_error",
                         predictionCol="prediction", task="none", rawPredictionCol="rawPrediction",
                         probabilityCol="probability")
        if task is None:
            task = "classification" if predictionCol else "none"
        self._set(batchPerThread=batchPerThread, backend=backend, onError=onError, errorCol=errorCol,
                  task=check_task(task), rawPredictionCol=rawPredictionCol, probabilityCol=probabilityCol)
        for name, value in (("inputCols", inputCols), ("outputCols", outputCols), ("predictionCol", predictionCol),
                            ("fromLogits", fromLogits)):
            if value is not None:
                self._set(**{name: value})
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

    def mlColumns(self) -> MLColumns:  # noqa: N802 (Spark ML names)
        """The Spark ML columns this stage adds (for ``task="none"``: none)."""
        return MLColumns(check_task(self.getOrDefault(self.task)), self.getOrDefault(self.predictionCol),
                         self.getOrDefault(self.rawPredictionCol), self.getOrDefault(self.probabilityCol))

    def outputColumns(self) -> list[str]:  # noqa: N802
        """The raw output columns, one per graph output, in output order."""
        if self.isDefined(self.outputCols):
            return list(self.getOrDefault(self.outputCols))
        return default_output_columns(self.snapshot.outputs)

    def scoresAreLogits(self) -> bool:  # noqa: N802
        """Whether the first output is read as logits: ``fromLogits`` when set, else the graph's
        own last op (Softmax or Sigmoid: probabilities)."""
        if self.isDefined(self.fromLogits):
            return self.getOrDefault(self.fromLogits)
        from tfnet.graph_io import read_graph_def

        return scores_are_logits(read_graph_def(self.snapshot.graph), self.snapshot.outputs[0].name)

    def _transform(self, dataset):
        inputs = self.getOrDefault(self.inputCols) if self.isDefined(self.inputCols) else None
        columns = self.mlColumns()
        outputs = self.outputColumns()
        if columns.task != "none":  # every column checked before the job
            first = self.snapshot.outputs[0]
            units(first.row_shape, first.name, columns.task)
            clash = [c for c in columns.names() if c in outputs or c in dataset.columns]
            if clash:
                raise ColumnError(
                    f"Column {clash[0]!r} (one of rawPredictionCol, probabilityCol, predictionCol) is "
                    f"{'an output column' if clash[0] in outputs else 'already in the DataFrame'}; choose another name. "
                    f"Output columns: {outputs}; DataFrame columns: {dataset.columns}.")
        out = self._predictor().predict(dataset, feature_cols=inputs, output_cols=outputs)
        if columns.task == "none":
            return out
        first = self.snapshot.outputs[0]
        return add_prediction_columns(out, outputs[0], first.row_shape, columns, self.scoresAreLogits(), first.name)

    def copy(self, extra=None) -> TFNetTransformer:
        that = super().copy(extra)
        that._predictors = self._predictors  # same model: share the broadcasts
        return that

    def write(self) -> MLWriter:
        return ModelFolderWriter(self, MODEL_FOLDER, self.snapshot.save)  # no model: the error comes now

    @classmethod
    def read(cls) -> MLReader:
        return ModelFolderReader(cls, MODEL_FOLDER, cls._load_snapshot, cls._upgrade)

    @staticmethod
    def _load_snapshot(instance, folder: str) -> None:
        instance._snapshot = ModelSnapshot.load(folder)

    @staticmethod
    def _upgrade(instance: TFNetTransformer, metadata: dict) -> None:
        """A transformer saved before ``task`` existed keeps what it wrote: its one raw output under
        ``"prediction"`` (the old default) and, with a ``predictionCol``, the class index (now as a
        classifier, which is also right for one sigmoid output)."""
        saved = {**metadata.get("defaultParamMap", {}), **metadata.get("paramMap", {})}
        if "task" in saved:
            return
        label = saved.get("predictionCol", "")
        instance._set(task="classification" if label else "none")
        if not label:
            instance._set(predictionCol="prediction")
        if "outputCols" not in saved and instance._snapshot is not None and len(instance._snapshot.outputs) == 1 \
                and label != "prediction":
            instance._set(outputCols=["prediction"])
