"""Checking a Spark ML evaluator against what a :class:`~optim.TFNetEstimator`'s model will write,
before any training. Driver side.

``CrossValidator`` and ``TrainValidationSplit`` fit a fold first and evaluate it afterwards, so an
evaluator that cannot read the model's columns (``BinaryClassificationEvaluator`` over a regressor,
a misspelt column, a binary evaluator over three classes) used to fail only after a fold had
trained, or, for the last case, not at all. :func:`tuning_evaluator` finds the evaluator of the
tuning run that is fitting an estimator, and :func:`check_evaluator` checks it.
"""

from __future__ import annotations

import sys

from optim.errors import ColumnError
from optim.predict.classification import MLColumns, classes

__all__ = ["check_evaluator", "tuning_evaluator"]

_TUNING = ("CrossValidator", "TrainValidationSplit")


def tuning_evaluator(estimator):
    """The evaluator of the ``CrossValidator`` or ``TrainValidationSplit`` whose ``fit`` is running
    and whose estimator is ``estimator`` or a ``Pipeline`` holding it (matched by uid), else None.

    The tuning classes fit each fold in a thread pool of their own, so this looks through the
    frames of every thread for their ``_fit``.
    """
    for frame in list(sys._current_frames().values()):
        seen = 0
        while frame is not None and seen < 200:
            if frame.f_code.co_name == "_fit" and "pyspark" in frame.f_code.co_filename:
                owner = frame.f_locals.get("self")
                if type(owner).__name__ in _TUNING and _holds(owner.getEstimator(), estimator.uid):
                    return owner.getEvaluator()
            frame, seen = frame.f_back, seen + 1
    return None


def _holds(stage, uid: str) -> bool:
    if getattr(stage, "uid", None) == uid:
        return True
    stages = stage.getStages() if hasattr(stage, "getStages") else getattr(stage, "stages", None)
    return any(_holds(s, uid) for s in stages or [])


def check_evaluator(evaluator, columns: MLColumns, label_col: str, first_output, dataset_columns=None) -> None:
    """Raises when ``evaluator`` cannot read what the estimator's model writes.

    Args:
        evaluator: A ``pyspark.ml.evaluation`` evaluator.
        columns: The Spark ML columns the model adds (its task and column names).
        label_col: The estimator's label column.
        first_output: The net's first output (a ``tf.TensorSpec``): its number of classes.
        dataset_columns: The columns of the DataFrame being fitted, or None (not checked).

    Raises:
        ColumnError: a column the evaluator reads that will not exist, a classification evaluator over
            a model that does not classify, or a binary evaluator over more than two classes; the
            message says what the model writes.
    """
    name = type(evaluator).__name__
    written = columns.names()
    task = columns.task

    def refuse(reason: str) -> None:
        raise ColumnError(f"{name} cannot evaluate this TFNetEstimator's model: {reason}. The model writes "
                          f"{written or 'no prediction columns'} (task={task!r}); nothing has trained yet.")

    def needs(param: str, kind: str) -> str:
        column = evaluator.getOrDefault(getattr(evaluator, param))
        if column not in written:
            where = {"rawPredictionCol": "rawPrediction", "probabilityCol": "probability",
                     "predictionCol": "prediction"}[param]
            refuse(f"it reads {param}={column!r} ({kind}), which the model does not write (the estimator's "
                   f"{param} names its {where} column)")
        return column

    if name == "BinaryClassificationEvaluator":
        if task != "classification":
            refuse("it needs class scores; set the estimator's task='classification' (or train with a "
                   "cross-entropy loss)")
        needs("rawPredictionCol", "the scores")
        shape = first_output.shape.as_list()[1:] if first_output.shape.rank is not None else None
        k = classes(shape)
        if k is not None and k > 2:
            refuse(f"the net's first output scores {k} classes and a binary evaluator reads two; use "
                   "MulticlassClassificationEvaluator")
    elif name == "MulticlassClassificationEvaluator":
        if task != "classification":
            refuse("it needs a class index in `prediction`; set the estimator's task='classification' (or train "
                   "with a cross-entropy loss)")
        needs("predictionCol", "the class index")
        if evaluator.getMetricName() == "logLoss":
            needs("probabilityCol", "the probabilities, for logLoss")
    elif name == "RegressionEvaluator":
        if task == "none":
            refuse("it needs a `prediction` double; set the estimator's task")
        needs("predictionCol", "the value")
    label = evaluator.getOrDefault(evaluator.labelCol) if evaluator.hasParam("labelCol") else None
    if label is not None and dataset_columns is not None and label not in dataset_columns and label not in written:
        refuse(f"it reads labelCol={label!r}, which is not in the DataFrame (the estimator's labelCol is "
               f"{label_col!r}; columns: {list(dataset_columns)})")
