"""The metrics of a net with several outputs, as Keras's ``compile`` keeps them: metrics given per output
(``metrics={"score": ["accuracy"], "vec": ["mae"]}``, or Keras's list of one entry per output), each updated with its
own output and labels and reported as ``score_accuracy``; and each output's own loss (``score_loss``), which Keras's
history shows beside the total. Built on the driver; updated wherever the loop runs
(:func:`optim.training.evaluation.update_metrics` reads :attr:`~optim.metrics.Metric.output_index`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from optim import metrics as M
from optim.loss_base import Loss, SampleWeighted
from optim.losses import MultiOutputLoss, output_index

__all__ = ["OutputLoss", "for_outputs", "loss_trackers", "output_label", "unique_names"]


def output_label(name: str) -> str:
    """An output's name as a history key's prefix: ``score:0`` -> ``score``, ``head/logits:0`` -> ``head_logits``."""
    return name.split(":")[0].replace("/", "_")


class OutputLoss(M.Metric):
    """One output's loss over the epoch (its ``loss_weights`` weight left out, its sample weights applied), as
    Keras's compiled loss tracks each output's: the mean of each batch's value, weighted by the batch's size.

    Args:
        loss: That output's loss.
        index: The output's position.
        name: The history key (``score_loss``).
    """

    weighted = True  # the sample weights apply, as in the loss the step takes

    def __init__(self, loss: Loss, index: int, name: str):
        self.loss = loss
        self.output_index = index
        super().__init__(name)

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        out = tf.convert_to_tensor(y_pred)
        labels = tf.convert_to_tensor(y_true)
        if sample_weight is not None:
            labels = SampleWeighted(labels, tf.convert_to_tensor(sample_weight))
        n = int(out.shape[0])
        self.state = self.state + np.array([float(self.loss(labels, out)) * n, n])


def loss_trackers(loss, output_names: list[str]) -> list[OutputLoss]:
    """An :class:`OutputLoss` per output with a loss, where more than one output has one (Keras's rule: a net of
    one loss reports only ``loss``)."""
    if not isinstance(loss, MultiOutputLoss):
        return []
    given = [(i, x) for i, x in enumerate(loss.losses) if x is not None]
    if len(given) < 2:
        return []
    return [OutputLoss(x, i, f"{output_label(output_names[i])}_loss") for i, x in given]


def _one_output(metrics, index: int, prefix: str) -> list[M.Metric]:
    chosen = metrics if isinstance(metrics, (list, tuple)) else [] if metrics is None else [metrics]
    out = []
    for m in chosen:
        metric = copy.copy(M.get(m))  # a metric object given for two outputs is two metrics
        metric.output_index = index
        metric.name = f"{prefix}_{metric.name}"
        out.append(metric)
    return out


def for_outputs(metrics, output_names: list[str], *, per_output_list: bool = False) -> list[M.Metric]:
    """The metrics as the loop updates them: a dict by output name gives each output its metrics (one, a list, or
    None), named ``{output}_{metric}``; a list goes to the first output, as before, unless ``per_output_list``
    (Keras's ``compile`` on a net of several outputs), where a list of one entry per output is read as the dict.

    Raises:
        ValueError: a dict key that names no output; with ``per_output_list``, a list whose length is neither
            one entry per output (Keras refuses it too).
    """
    if not metrics:
        return []
    if isinstance(metrics, Mapping):
        by_index: dict[int, object] = {}
        for key, value in metrics.items():
            by_index[output_index(str(key), output_names, "the metrics dict")] = value
        return [m for i in sorted(by_index) for m in _one_output(by_index[i], i, output_label(output_names[i]))]
    if per_output_list and len(output_names) > 1:
        if len(metrics) != len(output_names):
            raise ValueError(f"For a model with {len(output_names)} outputs, a list of metrics has one entry (a metric, "
                             f"a list of them, or None) per output, as Keras's compile reads it; received {len(metrics)} "
                             f"entries. Outputs: {[output_label(n) for n in output_names]}")
        return [m for i, entry in enumerate(metrics) for m in _one_output(entry, i, output_label(output_names[i]))]
    return [M.get(m) for m in metrics]


def unique_names(metrics: list[M.Metric], taken: set[str] | None = None) -> list[M.Metric]:
    """Two metrics of one name (``AUC()`` and ``"auc"``) are told apart as Keras's compile does: ``auc``, ``auc_1``;
    ``taken`` holds the names already given (and gets these)."""
    seen = set() if taken is None else taken
    for m in metrics:
        base, k = m.name, 0
        while m.name in seen:
            k += 1
            m.name = f"{base}_{k}"
        seen.add(m.name)
    return metrics
