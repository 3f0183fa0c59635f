"""Checks of a training run against the net, in the loop and before it: the first batch's labels against
the outputs (:func:`check_batch_labels`), and a loss that expects probabilities on an output that makes
logits (:func:`warn_if_logits_to_probability_loss`). The checks of the data's own values (labels, NaN and
Inf) are :mod:`optim.data.values`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optim import losses as L
from optim import metrics as M
from optim.errors import LabelShapeError

__all__ = ["check_batch_labels", "graph_output_op", "output_op", "warn_if_logits_to_probability_loss"]


#: Losses that, given by name, expect probabilities (Keras's default ``from_logits=False``).
PROBABILITY_LOSSES = {"sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy"}
_PROBABILITY_OPS = {"Softmax", "Sigmoid"}
_PASS_THROUGH = {"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient"}


def output_op(net, index: int = 0) -> str | None:
    """The op that makes output ``index`` (through identities and reshapes), or None."""
    return graph_output_op(net.frozen_graph_def(), net.output_names[index])


def graph_output_op(graph_def, output_name: str) -> str | None:
    """The op that makes the tensor ``output_name`` of ``graph_def`` (through identities and
    reshapes), or None."""
    nodes = {n.name: n for n in graph_def.node}
    name = output_name.split(":")[0]
    for _ in range(20):
        node = nodes.get(name)
        if node is None:
            return None
        if node.op not in _PASS_THROUGH or not node.input:
            return node.op
        name = node.input[0].split(":")[0].lstrip("^")
    return None


def warn_if_logits_to_probability_loss(loss_name, net) -> None:
    """A loss given by name that expects probabilities, on an output no Softmax or Sigmoid makes,
    trains on logits as if they were probabilities and silently does not learn: warn, once."""
    import warnings

    if not isinstance(loss_name, str) or loss_name.lower() not in PROBABILITY_LOSSES:
        return
    op = output_op(net)
    if op is None or op in _PROBABILITY_OPS:
        return
    warnings.warn(
        f"The loss {loss_name!r} expects probabilities (from_logits=False, as in Keras), but the net's output "
        f"{net.output_names[0]} comes from a {op} op, not a softmax or sigmoid: it looks like logits, and training "
        f"would not learn. Pass optim.losses.{_class_name(loss_name)}(from_logits=True) instead.",
        UserWarning, stacklevel=4,
    )


def _class_name(loss_name: str) -> str:
    return {"sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
            "categorical_crossentropy": "CategoricalCrossentropy",
            "binary_crossentropy": "BinaryCrossentropy"}[loss_name.lower()]


def check_batch_labels(loss: L.Loss, labels, net, batch: int, metrics: Sequence[M.Metric] = ()) -> None:
    """Checks the labels against the outputs before the first step: their number (one array per
    output of a multi-output net) and, where the loss knows them, their shapes; sample weights,
    one per example, need a loss and metrics that can weight examples."""
    if isinstance(labels, L.SampleWeighted):
        per_output = isinstance(labels.weights, (list, tuple))
        for w in labels.weights if per_output else [labels.weights]:
            if len(np.reshape(w, [-1])) != batch:
                raise LabelShapeError(f"Sample weights need one weight per example: {batch} in this batch. Received: "
                                      f"{len(np.reshape(w, [-1]))} weights")
        outputs = len(loss.losses) if isinstance(loss, L.MultiOutputLoss) else 1
        if per_output and len(labels.weights) != outputs:
            raise LabelShapeError(f"Sample weights per output need one array per output of the net ({outputs}). "
                                  f"Received: {len(labels.weights)} arrays")
        for m in metrics:
            if getattr(m, "weighted", False) and not m.supports_weights:
                raise TypeError(f"The metric {m.name!r} cannot weight examples (a function of a whole batch); give an "
                                "optim.metrics.Metric, or train without sample weights.")
        if isinstance(loss, L.JointLoss):
            loss.refuse_weights()
        if isinstance(loss, L.FunctionLoss):
            raise TypeError(f"The loss {loss.name!r} cannot weight examples (a function of a whole batch); give an "
                            "optim.losses.Loss (a name such as 'mse'), or train without sample weights.")
        labels = labels.labels
    outs = net.output_specs
    shapes = [(batch,) + tuple(o.shape.as_list()[1:]) if o.shape.rank is not None else None for o in outs]
    if isinstance(loss, (L.MultiOutputLoss, L.JointLoss)):
        got = [tuple(np.shape(t)) for t in labels] if isinstance(labels, (list, tuple)) else [tuple(np.shape(labels))]
        loss.check_shapes(got, shapes)
        return
    if len(outs) != 1:
        return
    if isinstance(labels, (list, tuple)):
        if len(labels) != 1:
            raise LabelShapeError(f"The net has one output {net.output_names}; received {len(labels)} label arrays.")
        labels = labels[0]
    if labels is None or shapes[0] is None:
        return
    loss.check_shapes(tuple(np.shape(labels)), shapes[0])
