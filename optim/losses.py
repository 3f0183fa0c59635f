"""Losses: ``loss(y_true, y_pred) -> scalar tensor``, the mean over the batch.

Each built-in loss also checks label and prediction shapes before training starts
(:meth:`Loss.check_shapes`), so a wrong label shape is a clear error, not a broadcast.

A net of several outputs takes one loss per output, or one loss applied to each output, as Keras
compiles them (:func:`for_outputs`, :class:`MultiOutputLoss`); a loss that needs several outputs at
once (contrastive, triplet, a multi-task loss) is written over all of them and wrapped with
:func:`joint`.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

__all__ = [
    "Loss",
    "SparseCategoricalCrossentropy",
    "CategoricalCrossentropy",
    "BinaryCrossentropy",
    "MeanSquaredError",
    "MeanAbsoluteError",
    "Huber",
    "FunctionLoss",
    "KerasLoss",
    "from_keras",
    "MultiOutputLoss",
    "JointLoss",
    "joint",
    "SampleWeighted",
    "for_outputs",
    "output_index",
    "get",
    "LabelShapeError",
]

from optim.errors import LabelShapeError
from optim.keras_losses import KerasLoss, named
from optim.loss_base import Loss, SampleWeighted

_EPS = 1e-7



class SparseCategoricalCrossentropy(Loss):
    """Integer class labels ``[batch]`` (or ``[batch, 1]``) against scores ``[batch, classes]``.

    Args:
        from_logits: The predictions are logits (True) or probabilities (False). Default: False.
    """

    name = "sparse_categorical_crossentropy"

    def __init__(self, from_logits: bool = False):
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        y_true = tf.cast(tf.reshape(y_true, [-1]), tf.int64)
        if self.from_logits:
            return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_true, logits=y_pred)
        probs = y_pred / tf.reduce_sum(y_pred, axis=-1, keepdims=True)
        probs = tf.clip_by_value(probs, _EPS, 1 - _EPS)
        return -tf.math.log(tf.gather(probs, y_true, axis=-1, batch_dims=1))

    def check_shapes(self, y_true_shape, y_pred_shape):
        ok = len(y_pred_shape) == 2 and (
            len(y_true_shape) == 1 or (len(y_true_shape) == 2 and y_true_shape[1] == 1)
        ) and y_true_shape[0] == y_pred_shape[0]
        if not ok:
            raise LabelShapeError(
                "sparse_categorical_crossentropy needs integer labels of shape (batch,) or (batch, 1) "
                f"and predictions of shape (batch, classes); received labels {tuple(y_true_shape)} and "
                f"predictions {tuple(y_pred_shape)}."
            )

    def __repr__(self):
        return f"SparseCategoricalCrossentropy(from_logits={self.from_logits})"


class CategoricalCrossentropy(Loss):
    """One-hot (or soft) labels against scores, both ``[batch, classes]``."""

    name = "categorical_crossentropy"

    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0):
        self.from_logits = from_logits
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        y_true = tf.cast(y_true, y_pred.dtype)
        if self.label_smoothing:
            n = tf.cast(tf.shape(y_true)[-1], y_pred.dtype)
            y_true = y_true * (1.0 - self.label_smoothing) + self.label_smoothing / n
        if self.from_logits:
            return tf.nn.softmax_cross_entropy_with_logits(labels=y_true, logits=y_pred)
        probs = y_pred / tf.reduce_sum(y_pred, axis=-1, keepdims=True)
        probs = tf.clip_by_value(probs, _EPS, 1 - _EPS)
        return -tf.reduce_sum(y_true * tf.math.log(probs), axis=-1)


class BinaryCrossentropy(Loss):
    """0/1 labels against one probability (or logit) per output, same shape."""

    name = "binary_crossentropy"

    def __init__(self, from_logits: bool = False):
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        y_true = tf.cast(y_true, y_pred.dtype)
        if self.from_logits:
            per = tf.nn.sigmoid_cross_entropy_with_logits(labels=y_true, logits=y_pred)
        else:
            p = tf.clip_by_value(y_pred, _EPS, 1 - _EPS)
            per = -(y_true * tf.math.log(p) + (1 - y_true) * tf.math.log(1 - p))
        return tf.reduce_mean(per, axis=-1) if per.shape.rank and per.shape.rank > 1 else per

    def check_shapes(self, y_true_shape, y_pred_shape):
        if tuple(y_true_shape) == tuple(y_pred_shape):
            return
        if len(y_pred_shape) == 2 and y_pred_shape[1] == 1 and tuple(y_true_shape) == (y_pred_shape[0],):
            return
        super().check_shapes(y_true_shape, y_pred_shape)

    def align(self, y_true, y_pred):
        if y_pred.shape.rank == 2 and y_true.shape.rank == 1:
            y_true = tf.expand_dims(y_true, -1)
        return y_true


class RegressionLoss(Loss):
    """A loss of numbers (regression): labels of shape (n,) pair with outputs of shape (n, 1)."""

    def check_shapes(self, y_true_shape, y_pred_shape):
        if len(y_pred_shape) == 2 and y_pred_shape[1] == 1 and tuple(y_true_shape) == (y_pred_shape[0],):
            return
        super().check_shapes(y_true_shape, y_pred_shape)

    def align(self, y_true, y_pred):
        y_true = tf.cast(y_true, y_pred.dtype)
        if y_pred.shape.rank == 2 and y_true.shape.rank == 1:
            y_true = tf.expand_dims(y_true, -1)
        return y_true


class MeanSquaredError(RegressionLoss):
    name = "mse"

    def call(self, y_true, y_pred):
        return tf.reduce_mean(tf.square(y_pred - y_true), axis=-1)


class MeanAbsoluteError(RegressionLoss):
    name = "mae"

    def call(self, y_true, y_pred):
        return tf.reduce_mean(tf.abs(y_pred - y_true), axis=-1)


class Huber(RegressionLoss):
    """Quadratic within ``delta`` of the label, linear beyond. Default delta 1.0."""

    name = "huber"

    def __init__(self, delta: float = 1.0):
        if not delta > 0:
            raise ValueError(f"`delta` must be positive. Received: delta={delta}")
        self.delta = delta

    def call(self, y_true, y_pred):
        err = tf.abs(y_pred - y_true)
        d = tf.cast(self.delta, err.dtype)
        quad = tf.minimum(err, d)
        return tf.reduce_mean(0.5 * tf.square(quad) + d * (err - quad), axis=-1)


class FunctionLoss(Loss):
    """Wraps any ``(y_true, y_pred) -> scalar tensor`` callable. No shape check."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.name = getattr(fn, "__name__", None) or getattr(fn, "name", None) or "loss"

    def __call__(self, y_true, y_pred):
        if isinstance(y_true, SampleWeighted):
            raise TypeError(f"The loss {self.name!r} is a function of a whole batch and cannot weight examples; give an "
                            "optim.losses.Loss (a name such as 'mse'), or train without sample weights.")
        return self.fn(y_true, y_pred)

    def check_shapes(self, y_true_shape, y_pred_shape):
        return

    def __repr__(self):
        return f"FunctionLoss({self.name})"


_NAMES = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
    "mse": MeanSquaredError,
    "mean_squared_error": MeanSquaredError,
    "mae": MeanAbsoluteError,
    "mean_absolute_error": MeanAbsoluteError,
    "huber": Huber,
}


def get(loss) -> Loss:
    """A Loss from a name (``"sparse_categorical_crossentropy"``, ``"mse"``, ...), a Loss, or a
    callable ``(y_true, y_pred) -> scalar``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
        TypeError: neither a name nor a callable.
    """
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        key = loss.lower()
        if key in _NAMES:
            return _NAMES[key]()
        keras_loss = named(loss)  # any other name Keras's compile takes ("kld", "poisson", "log_cosh", ...)
        if keras_loss is None:
            raise ValueError(f"Unknown loss {loss!r}. Known losses: {sorted(_NAMES)}, any name keras.losses.get "
                             "takes, or pass a callable.")
        return keras_loss
    mapped = from_keras(loss)
    if mapped is not None:
        return mapped
    if callable(loss):
        return FunctionLoss(loss)
    raise TypeError(f"A loss is a name, an optim.losses.Loss or a callable (y_true, y_pred) -> scalar. Received: {loss!r}")


#: What tfnet's own losses compute of a Keras loss's options; a Keras loss set otherwise is called as it is (KerasLoss)
_PLAIN = {"reduction": "sum_over_batch_size", "axis": -1, "ignore_class": None, "dtype": None}


def from_keras(loss) -> Loss | None:
    """A Keras loss object as tfnet's own loss where that computes the same (the options it keeps, the rest at
    Keras's defaults), else the Keras loss itself (:class:`optim.keras_losses.KerasLoss`), so no option is dropped;
    None for anything that is not a ``keras.losses.Loss``."""
    try:
        import keras
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(loss, keras.losses.Loss):
        return None
    config = loss.get_config()
    plain = all(config.get(k, default) == default for k, default in _PLAIN.items())
    if type(loss) is keras.losses.BinaryCrossentropy and config.get("label_smoothing"):
        plain = False
    table = {
        keras.losses.SparseCategoricalCrossentropy: lambda c: SparseCategoricalCrossentropy(c.get("from_logits", False)),
        keras.losses.CategoricalCrossentropy: lambda c: CategoricalCrossentropy(
            c.get("from_logits", False), c.get("label_smoothing", 0.0)),
        keras.losses.BinaryCrossentropy: lambda c: BinaryCrossentropy(c.get("from_logits", False)),
        keras.losses.MeanSquaredError: lambda c: MeanSquaredError(),
        keras.losses.MeanAbsoluteError: lambda c: MeanAbsoluteError(),
        keras.losses.Huber: lambda c: Huber(c.get("delta", 1.0)),
    }
    make = table.get(type(loss)) if plain else None
    return make(config) if make is not None else KerasLoss(loss)


class MultiOutputLoss(Loss):
    """One loss per output of a multi-output net, weighted and summed, as Keras's
    ``compile(loss=[...] or {...}, loss_weights=...)`` does; an output without a loss (None) adds
    nothing. Labels are a list in output order.

    Args:
        losses: One Loss (or None) per output, in output order.
        weights: One weight per output. Default: 1.0 each.
        names: The outputs' names, for messages.
    """

    name = "loss"

    def __init__(self, losses: list, weights: list[float] | None = None, names: list[str] | None = None):
        self.losses = [None if x is None else get(x) for x in losses]
        if any(isinstance(x, JointLoss) for x in self.losses):
            raise TypeError("A joint loss (optim.losses.joint) takes every output at once; give it alone, not as one "
                            f"output's loss in a list or dict. Received: {losses!r}")
        self.weights = [1.0] * len(self.losses) if weights is None else [float(w) for w in weights]
        self.names = list(names or [f"output {i}" for i in range(len(self.losses))])
        if not any(x is not None for x in self.losses):
            raise ValueError(f"No output has a loss. Outputs: {self.names}")
        if len(self.weights) != len(self.losses):
            raise ValueError(f"`loss_weights` must have one weight per output ({len(self.losses)}). "
                             f"Received: {len(self.weights)} weights")

    def __call__(self, y_true, y_pred) -> tf.Tensor:
        if isinstance(y_true, SampleWeighted):  # the same weights for every output, or a list of each output's
            w = y_true.weights
            per = list(w) if isinstance(w, (list, tuple)) else [w] * len(self.losses)
            return self._sum([SampleWeighted(t, one) for t, one in zip(y_true.labels, per)], y_pred)
        return self._sum(y_true, y_pred)

    def _sum(self, y_true, y_pred) -> tf.Tensor:
        if not isinstance(y_true, (list, tuple)) or len(y_true) != len(self.losses):
            got = len(y_true) if isinstance(y_true, (list, tuple)) else 1
            raise LabelShapeError(
                f"The net has {len(self.losses)} outputs {self.names}; it needs one label array per output, a list "
                f"in that order. Received: {got} label array(s)."
            )
        total = None
        for loss, weight, t, p in zip(self.losses, self.weights, y_true, y_pred):
            if loss is None:
                continue
            term = tf.cast(loss(t, p), tf.float32) * weight
            total = term if total is None else total + term
        return total

    def check_shapes(self, y_true_shapes, y_pred_shapes) -> None:
        if len(y_true_shapes) != len(self.losses):
            raise LabelShapeError(
                f"The net has {len(self.losses)} outputs {self.names}; it needs one label array per output, a list "
                f"in that order. Received: {len(y_true_shapes)} label array(s)."
            )
        for loss, name, t, p in zip(self.losses, self.names, y_true_shapes, y_pred_shapes):
            if loss is not None and p is not None:
                try:
                    loss.check_shapes(t, p)
                except LabelShapeError as exc:
                    raise LabelShapeError(f"Output {name}: {exc}") from None

    def __repr__(self) -> str:
        return f"MultiOutputLoss({self.losses!r}, weights={self.weights})"


class JointLoss(Loss):
    """One loss over every output at once: ``fn(y_true_list, y_pred_list) -> scalar``, the labels
    and the outputs each a list in output order (see :func:`joint`)."""

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"optim.losses.joint takes a callable fn(y_true_list, y_pred_list) -> scalar. Received: "
                            f"{fn!r}")
        self.fn = fn
        self.name = getattr(fn, "__name__", None) or getattr(fn, "name", None) or "loss"

    def refuse_weights(self) -> None:
        """Raises the TypeError that says a joint loss cannot weight examples."""
        raise TypeError(f"The joint loss {self.name!r} is a function of whole batches of every output and cannot "
                        "weight examples; train without sample weights, or weight inside the loss.")

    def __call__(self, y_true, y_pred) -> tf.Tensor:
        if isinstance(y_true, SampleWeighted):
            self.refuse_weights()
        labels = list(y_true) if isinstance(y_true, (list, tuple)) else [y_true]
        outputs = list(y_pred) if isinstance(y_pred, (list, tuple)) else [y_pred]
        if len(labels) != len(outputs):
            raise LabelShapeError(f"The joint loss {self.name!r} takes one label array per output, a list in output "
                                  f"order: the net has {len(outputs)} output(s). Received: {len(labels)} label "
                                  "array(s).")
        return self.fn(labels, outputs)

    def check_shapes(self, y_true_shapes, y_pred_shapes) -> None:
        """Only the number of label arrays (one per output): the function decides what fits."""
        if y_pred_shapes and isinstance(y_pred_shapes[0], (list, tuple)) and len(y_true_shapes) != len(y_pred_shapes):
            raise LabelShapeError(f"The joint loss {self.name!r} takes one label array per output, a list in output "
                                  f"order: the net has {len(y_pred_shapes)} output(s). Received: {len(y_true_shapes)} "
                                  "label array(s).")

    def __repr__(self) -> str:
        return f"joint({self.name})"


def joint(fn: Callable) -> JointLoss:
    """A loss over several outputs at once, as an Analytics Zoo user wrote a loss tensor over
    several outputs: ``fn(y_true_list, y_pred_list) -> scalar``, called with the labels and the
    outputs each as a list in output order. Use it where one loss per output cannot say what to
    learn: a contrastive or triplet loss over the embeddings of two or three inputs, a multi-task
    loss that mixes the outputs. Without it, one callable on a net of several outputs is applied to
    each output and summed, as Keras does.

    It goes wherever a loss goes: ``TFOptimizer(net, optim.losses.joint(fn), ...)``,
    ``TFOptimizer.from_loss``, and over Spark (``fn`` is pickled to the ranks with cloudpickle).
    The value should be a mean over the batch, as every loss here is, so that the ranks' average is
    the global batch's loss. Sample weights and ``loss_weights`` do not apply (weigh inside
    ``fn``).

    Example::

        def contrastive(y_true, y_pred, margin=1.0):
            same = tf.cast(tf.equal(y_true[0], y_true[1]), tf.float32)      # labels of the two images
            d2 = tf.reduce_sum(tf.square(y_pred[0] - y_pred[1]), axis=-1)    # their embeddings' distance
            far = tf.nn.relu(margin - tf.sqrt(d2 + 1e-9))
            return tf.reduce_mean(same * d2 + (1.0 - same) * tf.square(far))

        opt = TFOptimizer(siamese_net, optim.losses.joint(contrastive), optim.SGD(0.1))
        opt.optimize(([x_a, x_b], [y_a, y_b]))

    Args:
        fn: ``fn(y_true_list, y_pred_list) -> scalar tensor``.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    return JointLoss(fn)


def output_index(key: str, names: list[str], where: str = "the loss or loss_weights dict") -> int:
    """The output ``key`` names: its tensor name, the name without ``:0``, or the layer it comes
    from (``head/logits:0`` for ``logits``).

    Raises:
        ValueError: no output of that name; ``where`` says which dict named it.
    """
    for i, n in enumerate(names):
        base = n.split(":")[0]
        if key in (n, base) or base.split("/")[-1] == key or base.split("/")[0] == key:
            return i
    raise ValueError(f"Unknown output {key!r} in {where}. Outputs: {names}")


def for_outputs(loss, output_names: list[str], loss_weights=None) -> Loss:
    """The loss for a net with these outputs: a list (one per output) or a dict by output name
    becomes a :class:`MultiOutputLoss`; one loss on a net of several outputs is applied to each
    output, as Keras does. ``loss_weights`` is a list or a dict by output name.

    Raises:
        ValueError: a list of the wrong length, an unknown output name, weights without outputs.
    """
    k = len(output_names)
    if isinstance(loss, JointLoss):
        if loss_weights is not None:
            raise ValueError("`loss_weights` weigh per-output losses; a joint loss (optim.losses.joint) weighs its "
                             f"outputs itself. Received: loss_weights={loss_weights!r}")
        return loss
    if isinstance(loss, dict):
        losses: list = [None] * k
        for key, value in loss.items():
            losses[output_index(key, output_names)] = value
    elif isinstance(loss, (list, tuple)):
        if len(loss) != k:
            raise ValueError(f"The loss list must have one loss per output ({k}: {output_names}). "
                             f"Received: {len(loss)} losses")
        losses = list(loss)
    elif k > 1 or loss_weights is not None:
        losses = [loss] * k
    else:
        return get(loss)
    weights = None
    if isinstance(loss_weights, dict):
        weights = [1.0] * k
        for key, value in loss_weights.items():
            weights[output_index(key, output_names)] = float(value)
    elif loss_weights is not None:
        weights = list(loss_weights)
    return MultiOutputLoss(losses, weights, output_names)
