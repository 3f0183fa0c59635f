"""Loss and metric accumulation: one epoch's sums (mergeable across ranks and Spark partitions), and
evaluation over a dataset. Runs wherever the loop runs (locally, on every rank, in Spark tasks)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from optim import losses as L
from optim import metrics as M
from optim.data.base import DataAdapter as TFDataset
from optim.training.checks import check_batch_labels
from optim.training.collective import Collective, LocalCollective
from optim.training.liveness import Liveness

__all__ = ["Accumulators", "accumulate", "batch_len", "evaluate", "logs_from_states", "metrics_copy", "update_metrics"]


def update_metrics(metrics: Sequence[M.Metric], labels, outputs) -> None:
    """Updates each metric with its output and that output's labels (``output_index``; the first output where it
    has none); the weighted metrics (``weighted_metrics``, as Keras's, and each output's loss) by the sample weights
    when the data has them, the others unweighted, as Keras does."""
    weights = None
    if isinstance(labels, L.SampleWeighted):
        labels, weights = labels.labels, labels.weights
    several = isinstance(outputs, (list, tuple))
    for m in metrics:
        i = m.output_index or 0
        out = outputs[i] if several else outputs
        y = labels[i] if several and isinstance(labels, (list, tuple)) else labels
        if weights is None or not getattr(m, "weighted", False):
            m.update(y, out)
        else:  # the weights of the metric's output, where each output has its own
            m.update(y, out, sample_weight=np.asarray(weights[i] if isinstance(weights, (list, tuple)) else weights))


def batch_len(features) -> int:
    return int(np.shape(features[0])[0]) if features else 0


class Accumulators:
    """Loss and metric accumulators for one epoch (mergeable across ranks and partitions)."""

    def __init__(self, metrics: Sequence[M.Metric]):
        self.loss = M.Mean()
        self.metrics = list(metrics)
        for m in self.metrics:
            m.reset()

    def states(self) -> list[np.ndarray]:
        return [self.loss.state] + [m.state for m in self.metrics]

    def load(self, states: Sequence) -> None:
        self.loss.state = np.asarray(states[0], np.float64)
        for m, s in zip(self.metrics, states[1:]):
            m.state = np.asarray(s, np.float64)

    def logs(self, prefix: str = "") -> dict[str, float]:
        out = {prefix + "loss": self.loss.result()}
        out.update({prefix + m.name: m.result() for m in self.metrics})
        return out

    def reduce(self, collective: Collective) -> None:
        flat = np.concatenate([s.ravel() for s in self.states()])
        total = collective.allreduce_sum(flat)
        out, i = [], 0
        for s in self.states():
            out.append(total[i:i + s.size].reshape(s.shape))
            i += s.size
        self.load(out)


def accumulate(net, loss: L.Loss, metrics: Sequence[M.Metric], data: TFDataset, batch_size: int, *, rank: int = 0,
               size: int = 1, liveness: Liveness | None = None) -> Accumulators:
    """The loss and metric accumulators over this shard of ``data`` (sums: mergeable across
    ranks or partitions)."""
    alive = liveness or Liveness()
    acc = Accumulators(metrics)
    # the weights' regularizers, as Keras's evaluate adds model.losses to each batch's loss (the weights stay put)
    extra = float(net.regularization_loss()) if net.regularizers else 0.0
    checked = False
    for features, labels in data.batches(batch_size, shuffle=False, rank=rank, size=size):
        n = batch_len(features)
        if n == 0:
            continue
        if not checked:  # the labels' number and shapes against the outputs, as before a first training step
            check_batch_labels(loss, labels, net, n, metrics)
            checked = True
        # with the model's add_loss and activity terms (0 for a net without), as Keras's evaluate adds model.losses
        outputs, added = net.forward(features, as_tensors=True, return_losses=True)
        labels_t = tf.nest.map_structure(tf.convert_to_tensor, labels)
        acc.loss.update_value(float(loss(labels_t, outputs)) + extra + float(added), n)
        update_metrics(acc.metrics, labels, outputs)
        alive.kick("validation")
    return acc


def evaluate(net, loss: L.Loss, metrics: Sequence[M.Metric], data: TFDataset, batch_size: int,
             collective: Collective | None = None, prefix: str = "", liveness: Liveness | None = None) -> dict[str, float]:
    """Loss and metrics over ``data`` (this rank's shard, summed over ranks)."""
    collective = collective or LocalCollective()
    alive = liveness or Liveness()
    acc = accumulate(net, loss, metrics, data, batch_size, rank=collective.rank, size=collective.size, liveness=alive)
    with alive.phase("waiting for the other ranks' validation"):
        acc.reduce(collective)
    return acc.logs(prefix)


def logs_from_states(metrics: Sequence[M.Metric], states: Sequence[np.ndarray], prefix: str = "") -> dict[str, float]:
    """``evaluate``'s result from accumulator states summed elsewhere (over Spark partitions)."""
    acc = Accumulators(metrics_copy(metrics))
    acc.load(states)
    return acc.logs(prefix)


def metrics_copy(metrics: Sequence[M.Metric]) -> list[M.Metric]:
    """Fresh metrics of the same kinds (validation must not disturb the training accumulators)."""
    out = []
    for m in metrics:
        c = copy.copy(m)
        c.reset()
        out.append(c)
    return out
