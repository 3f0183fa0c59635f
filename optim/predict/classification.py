"""Spark ML's prediction columns from a model's raw output column. Driver side: every column is a
Spark SQL expression (no Python UDF), computed by Spark after the model's Arrow UDF.

tfnet follows Spark ML's conventions (``pyspark.ml.classification``):

* a classifier adds ``rawPrediction`` and ``probability`` (``VectorUDT``, one value per class) and
  ``prediction`` (a double: the class index);
* a regressor adds ``prediction`` (a double: the value).

``prediction`` means that and only that across tfnet; the model's raw outputs are array columns
named ``output`` (one output) or after the outputs.

How the scores become these columns, for the first output with ``k`` values per row:

============================  =====================  ====================  ======================
output                        rawPrediction          probability           prediction
============================  =====================  ====================  ======================
one logit ``z`` (k=1)         ``[-z, z]``            ``[1-s(z), s(z)]``    ``1.0 if z > 0``
one probability ``p`` (k=1)   ``[1-p, p]``           ``[1-p, p]``          ``1.0 if p > 0.5``
k >= 2 logits                 the logits             their softmax         index of the largest
k >= 2 probabilities          the probabilities      the probabilities     index of the largest
============================  =====================  ====================  ======================

(``s`` is the sigmoid; ``[-z, z]`` is what Spark's ``LogisticRegression`` writes for a binary
model.) Rows whose outputs are null (``onError="null"``) get null columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from optim.errors import ColumnError

__all__ = ["TASKS", "MLColumns", "check_task", "add_prediction_columns", "scores_are_logits", "task_for_loss"]

#: ``"none"``: the raw outputs only; ``"classification"``; ``"regression"``.
TASKS = ("none", "classification", "regression")

_PROBABILITY_OPS = {"Softmax", "Sigmoid"}


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {list(TASKS)}. Received: task={task!r}")
    return task


@dataclass(frozen=True)
class MLColumns:
    """The Spark ML columns a stage adds (an empty name: not added)."""

    task: str
    prediction: str
    raw_prediction: str = ""
    probability: str = ""

    def names(self) -> list[str]:
        if self.task == "classification":
            return [c for c in (self.raw_prediction, self.probability, self.prediction) if c]
        if self.task == "regression":
            return [self.prediction] if self.prediction else []
        return []


def scores_are_logits(graph_def, output_name: str) -> bool:
    """False when a Softmax or Sigmoid op makes the output (probabilities), else True (logits)."""
    from optim.training.checks import graph_output_op

    return graph_output_op(graph_def, output_name) not in _PROBABILITY_OPS


def task_for_loss(loss) -> str:
    """The Spark ML task a loss trains for: ``"classification"`` for the cross-entropies over one
    output, ``"regression"`` for mse, mae and Huber, else ``"none"``."""
    from optim import losses as L

    if isinstance(loss, (L.SparseCategoricalCrossentropy, L.CategoricalCrossentropy, L.BinaryCrossentropy)):
        return "classification"
    if isinstance(loss, L.RegressionLoss):
        return "regression"
    return "none"


def units(row_shape, output: str, task: str) -> int:
    """Values per row of the output a ``task`` reads: a scalar or a vector with a known length.

    Raises:
        ColumnError: any other shape (the message names the output and its shape).
    """
    if row_shape is not None and len(row_shape) == 0:
        return 1
    if row_shape is None or len(row_shape) != 1 or row_shape[0] is None:
        shape = "unknown" if row_shape is None else tuple(row_shape)
        raise ColumnError(
            f"task={task!r} reads the first output, which must have one value per row (regression) or one score per "
            f"class (classification): a per-row shape () or (k,). Output {output!r} has per-row shape {shape}.")
    if task == "regression" and row_shape[0] != 1:
        raise ColumnError(
            f"task='regression' gives a double `prediction` from an output with one value per row; output {output!r} "
            f"has {row_shape[0]} values per row (per-row shape {tuple(row_shape)}). Use task='none' for vector outputs.")
    return int(row_shape[0])


def add_prediction_columns(df, output_col: str, row_shape, columns: MLColumns, from_logits: bool, output: str = ""):
    """``df`` with ``columns`` computed from the raw output column ``output_col`` (per-row shape
    ``row_shape``).

    Raises:
        ColumnError: an output that does not fit the task, or a column name already taken.
    """
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    if columns.task == "none":
        return df
    k = units(row_shape, output or output_col, columns.task)
    names = columns.names()
    taken = [c for c in names if c in df.columns]
    repeated = sorted({c for c in names if names.count(c) > 1})
    if taken or repeated:
        bad = taken[0] if taken else repeated[0]
        raise ColumnError(
            f"Column {bad!r} (rawPredictionCol, probabilityCol or predictionCol) "
            f"{'already exists in the DataFrame' if taken else 'is named twice'}; choose another name. "
            f"Columns: {df.columns}.")
    raw = F.col(output_col)
    scalar = row_shape is not None and len(row_shape) == 0
    present = raw.isNotNull()

    def put(frame, name, expr):
        return frame.withColumn(name, F.when(present, expr)) if name else frame

    if columns.task == "regression":
        value = raw if scalar else raw.getItem(0)
        return put(df, columns.prediction, value.cast("double"))
    if k == 1:
        z = (raw if scalar else raw.getItem(0)).cast("double")
        if from_logits:
            p = F.lit(1.0) / (F.lit(1.0) + F.exp(-z))
            raw_vec, label = F.array(-z, z), (z > 0)
        else:
            p = z
            raw_vec, label = F.array(F.lit(1.0) - p, p), (p > F.lit(0.5))
        prob_vec = F.array(F.lit(1.0) - p, p)
    else:
        scores = F.transform(raw, lambda v: v.cast("double"))
        label = F.array_position(raw, F.array_max(raw)) - 1
        raw_vec = scores
        if from_logits:
            top = F.array_max(scores)
            exps = F.transform(scores, lambda v: F.exp(v - top))
            total = F.aggregate(exps, F.lit(0.0), lambda acc, v: acc + v)
            prob_vec = F.transform(exps, lambda v: v / total)
        else:
            prob_vec = scores
    df = put(df, columns.raw_prediction, array_to_vector(raw_vec))
    df = put(df, columns.probability, array_to_vector(prob_vec))
    return put(df, columns.prediction, label.cast("double"))


def is_binary(row_shape) -> bool:
    """True for an output with one or two scores per row (what a binary evaluator reads)."""
    if row_shape is None:
        return False
    return len(row_shape) == 0 or (len(row_shape) == 1 and row_shape[0] in (1, 2))


def classes(row_shape) -> int | None:
    """The number of classes a classification output gives: 2 for one score, else its length."""
    if row_shape is None or len(row_shape) > 1:
        return None
    k = 1 if len(row_shape) == 0 else row_shape[0]
    return None if k is None else max(2, int(k))
