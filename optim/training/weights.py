"""``class_weight``, as Keras defines it: each training example weighs ``class_weight[its class]`` (1.0 for a class
the dict leaves out), times its sample weight when it has one. Runs in the loop, on every batch of every data road
(numpy arrays, ``tf.data``, a DataFrame, Parquet files), on the training batches only."""

from __future__ import annotations

import numpy as np

from optim.losses import SampleWeighted

__all__ = ["ClassWeights"]


class ClassWeights:
    """Turns a batch's labels into labels with sample weights: the class weights (times the batch's own sample
    weights, when it has them). One-hot labels take their class from the largest entry, as Keras does."""

    def __init__(self, class_weight: dict[int, float]):
        self.class_weight = dict(class_weight)

    def __call__(self, labels):
        own = None
        if isinstance(labels, SampleWeighted):
            labels, own = labels.labels, labels.weights
        if isinstance(labels, (list, tuple)):
            raise ValueError("`class_weight` weights the classes of one output; this net has several. Give "
                             "per-example weights instead (sample_weight=, or a weight column).")
        y = np.asarray(labels)
        if y.ndim > 1:
            y = np.argmax(y, axis=-1) if y.shape[-1] != 1 else y.reshape(len(y))
        ids = np.round(y.astype(np.float64)).astype(np.int64)
        weights = np.array([self.class_weight.get(int(c), 1.0) for c in ids], np.float32)
        if own is not None:
            weights = weights * np.asarray(own, np.float32).reshape(-1)
        return SampleWeighted(labels, weights)
