"""Metrics. Each keeps its state as a small vector of sums, so that results over several workers
are exact: add the states (one allreduce), then read the result.

    m = Accuracy(); m.update(y_true, y_pred); m.result()
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Metric", "Mean", "Accuracy", "TopKAccuracy", "MeanAbsoluteError", "MeanSquaredError", "AUC",
           "FunctionMetric", "KerasMetric", "get"]


def _np(x) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


class Metric:
    """Base class: ``state`` is a float64 vector of sums; ``update`` adds to it."""

    name = "metric"

    def __init__(self, name: str | None = None):
        if name:
            self.name = name
        self.reset()

    def reset(self) -> None:
        self.state = np.zeros(self._state_size(), np.float64)

    def _state_size(self) -> int:
        return 2

    #: whether ``update`` takes ``sample_weight`` (every built-in metric but FunctionMetric)
    supports_weights = True
    #: the output it follows on a net of several outputs (:mod:`optim.output_metrics`); None: the first
    output_index: int | None = None

    def update(self, y_true, y_pred, sample_weight=None) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def merge(self, state: np.ndarray) -> None:
        self.state = self.state + np.asarray(state, np.float64)

    def result(self) -> float:
        total, count = self.state
        return float(total / count) if count else float("nan")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Mean(Metric):
    """A weighted mean of values (the training loss uses it)."""

    name = "loss"

    def update_value(self, value: float, weight: float = 1.0) -> None:
        self.state = self.state + np.array([float(value) * weight, weight])

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        raise TypeError("Mean is fed with update_value(value, weight).")


class Accuracy(Metric):
    """Fraction of correct predictions. Labels decide the kind: class ids ``[batch]`` or
    ``[batch, 1]`` against scores ``[batch, classes]`` (sparse), one-hot labels shaped like the
    scores (categorical), or 0/1 labels against one probability per example (binary, threshold
    0.5)."""

    name = "accuracy"

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        y_true, y_pred = _np(y_true), _np(y_pred)
        if y_pred.ndim >= 2 and y_pred.shape[-1] > 1:
            pred = y_pred.argmax(-1)
            if y_true.shape == y_pred.shape:
                true = y_true.argmax(-1)
            else:
                true = y_true.reshape(pred.shape)
        else:
            pred = (y_pred.reshape(-1) > 0.5).astype(np.int64)
            true = y_true.reshape(-1)
        correct = pred.reshape(-1) == true.reshape(-1).astype(pred.dtype)
        self.state = self.state + _weighted(correct, len(y_pred), sample_weight)


class TopKAccuracy(Metric):
    """Fraction of examples whose label is among the ``k`` highest scores. Default k=5."""

    def __init__(self, k: int = 5, name: str | None = None):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be a positive integer. Received: k={k!r}")
        self.k = k
        super().__init__(name or f"top{k}_accuracy")

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        y_true, y_pred = _np(y_true), _np(y_pred)
        if y_true.shape == y_pred.shape:
            y_true = y_true.argmax(-1)
        y_true = y_true.reshape(-1).astype(np.int64)
        k = min(self.k, y_pred.shape[-1])
        top = np.argpartition(-y_pred, k - 1, axis=-1)[:, :k]
        hits = (top == y_true[:, None]).any(axis=1)
        self.state = self.state + _weighted(hits, len(y_true), sample_weight)


class MeanAbsoluteError(Metric):
    name = "mae"

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        y_true, y_pred = _np(y_true).astype(np.float64), _np(y_pred).astype(np.float64)
        y_true = y_true.reshape(y_pred.shape) if y_true.size == y_pred.size else y_true
        self.state = self.state + _weighted(np.abs(y_pred - y_true), len(y_pred), sample_weight)


class MeanSquaredError(Metric):
    name = "mse"

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        y_true, y_pred = _np(y_true).astype(np.float64), _np(y_pred).astype(np.float64)
        y_true = y_true.reshape(y_pred.shape) if y_true.size == y_pred.size else y_true
        self.state = self.state + _weighted(np.square(y_pred - y_true), len(y_pred), sample_weight)


class AUC(Metric):
    """Area under the ROC curve for 0/1 labels and scores in [0, 1] (or logits with
    ``from_logits=True``), from histograms of the scores over ``num_thresholds`` bins: mergeable
    across workers, and within about ``1 / num_thresholds`` of the exact AUC."""

    name = "auc"

    def __init__(self, num_thresholds: int = 1000, from_logits: bool = False, name: str | None = None):
        if not isinstance(num_thresholds, int) or num_thresholds < 2:
            raise ValueError(f"`num_thresholds` must be an integer >= 2. Received: {num_thresholds!r}")
        self.num_thresholds = num_thresholds
        self.from_logits = from_logits
        super().__init__(name)

    def _state_size(self) -> int:
        return 2 * self.num_thresholds

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        y_true = _np(y_true).reshape(-1)
        score = _np(y_pred).astype(np.float64).reshape(-1)
        w = np.ones_like(score) if sample_weight is None else np.repeat(
            _np(sample_weight).astype(np.float64).reshape(-1), score.size // max(len(_np(sample_weight).reshape(-1)), 1))
        if self.from_logits:
            score = 1.0 / (1.0 + np.exp(-score))
        if not np.isin(y_true, (0, 1)).all():
            raise ValueError("AUC needs binary labels (0 or 1).")
        bins = np.clip((score * self.num_thresholds).astype(np.int64), 0, self.num_thresholds - 1)
        pos = np.bincount(bins[y_true == 1], weights=w[y_true == 1], minlength=self.num_thresholds)
        neg = np.bincount(bins[y_true == 0], weights=w[y_true == 0], minlength=self.num_thresholds)
        self.state = self.state + np.concatenate([pos, neg])

    def result(self) -> float:
        n = self.num_thresholds
        pos, neg = self.state[:n], self.state[n:]
        if pos.sum() == 0 or neg.sum() == 0:
            return float("nan")
        # Scores in the same bin are ties: count half. P(score_pos > score_neg).
        neg_below = np.cumsum(neg) - neg
        return float((pos * (neg_below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))


class FunctionMetric(Metric):
    """Any ``(y_true, y_pred) -> scalar`` (or per-example values, averaged) callable, averaged over examples
    (batch-size weighted): a Keras metric function or one's own, as ``compile`` averages them."""

    supports_weights = False  # the callable gives a batch's value, not one per example

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        super().__init__(name or getattr(fn, "__name__", "metric"))

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        if sample_weight is not None:
            raise TypeError(f"The metric {self.name!r} is a function of a whole batch and cannot weight examples; "
                            "give an optim.metrics.Metric, or train without sample weights.")
        value = float(np.mean(_np(self.fn(y_true, y_pred))))  # per-example values too, averaged as Keras's compile does
        n = len(_np(y_pred))
        self.state = self.state + np.array([value * n, n])


class KerasMetric(Metric):
    """A Keras metric (``keras.metrics.AUC(curve="PR")``, ``Precision``, ``BinaryAccuracy(threshold=0.7)``, ...),
    updated as Keras's ``fit`` updates it, so its result is Keras's. Its state is the Keras metric's variables (totals,
    counts, confusion counts: sums, as every tfnet metric keeps), so ranks and partitions merge by adding. The metric
    travels as Keras's serialized config and is rebuilt where it runs. A metric whose variables Keras makes from the
    first batch's shape (``F1Score``, ``FBetaScore``) is built on its output's shape (:meth:`bind_shape`, which
    ``TFOptimizer`` calls) before any batch.

    Raises:
        TypeError: a metric whose variables are not sums Keras makes up front or from a shape, which ranks could not
            merge; or one Keras cannot rebuild from its config (a class of one's own not registered).
    """

    def __init__(self, metric):
        import keras

        self.config = keras.metrics.serialize(metric)
        self._live = None
        self.sizes: list[int] = []
        #: the output's shape a metric built from a shape needs (None: built up front, or not bound yet)
        self.shape: tuple | None = None
        super().__init__(metric.name)
        self.pending = not self.sizes and callable(getattr(self._metric(), "_build", None))
        if not self.sizes and not self.pending:
            raise TypeError(f"The Keras metric {type(metric).__name__} makes its state on its first batch; tfnet "
                            "cannot merge it over ranks. Use a metric that makes it up front, or compute it after "
                            "training with net.forward.")
        if not self.pending:
            self._check_scalar()

    def _check_scalar(self) -> None:
        """Refuses a metric whose result is several numbers (one per class or threshold): the history holds one."""
        if np.ndim(self._metric().result()) > 0:
            raise TypeError(f"The Keras metric {self.name!r} gives one result per class or threshold "
                            f"({tuple(np.shape(self._metric().result()))}); tfnet's history holds one number per "
                            "metric: average it in the metric (F1Score(average='macro'), one threshold), or compute it "
                            "after training with net.forward.")

    def bind_shape(self, shape) -> None:
        """Builds a metric that makes its variables from the shapes it sees (``F1Score``: one count per class) on its
        output's shape, ``(None, classes)``, as Keras's first update would.

        Raises:
            TypeError: a shape Keras refuses (not 2-D, its classes unknown), with Keras's reason.
        """
        if not self.pending:
            return
        self.shape, self._live = tuple(shape), None
        try:
            self.reset()
        except ValueError as exc:
            raise TypeError(f"The Keras metric {self.name!r} is built from its output's shape {self.shape}, which "
                            f"Keras refuses: {str(exc).splitlines()[0]}") from None
        self.pending = False
        self._check_scalar()

    def _metric(self):
        if self._live is None:
            import keras

            try:
                live = keras.metrics.deserialize(self.config)
            except (TypeError, ValueError) as exc:  # Keras's errors for a class it cannot find or a config it refuses
                live = exc
            if not isinstance(live, keras.metrics.Metric):  # or Keras gives the name back
                raise TypeError(f"Keras cannot rebuild the metric {self.name!r} from its config ({live}); a metric "
                                "class of your own must be decorated with @keras.saving.register_keras_serializable() "
                                "and imported where tfnet trains.") from None
            if self.shape is not None:
                live._build(self.shape, self.shape)  # Keras's own build from the shapes (F1Score's per-class counts)
            self._live = live
            self.sizes = [int(np.prod(v.shape)) for v in self._live.variables]
        return self._live

    def _state_size(self) -> int:
        self._metric()
        return sum(self.sizes)

    def reset(self) -> None:
        self._metric().reset_state()
        self.state = self._read()

    def _read(self) -> np.ndarray:
        values = [np.asarray(v.numpy(), np.float64).ravel() for v in self._metric().variables]
        return np.concatenate(values) if values else np.zeros(0)

    def _load(self) -> None:
        """The Keras metric's variables from :attr:`state` (merged or loaded from elsewhere)."""
        parts = np.split(self.state, np.cumsum(self.sizes)[:-1])
        for v, part in zip(self._metric().variables, parts):
            v.assign(part.reshape(v.shape).astype(v.dtype))

    def update(self, y_true, y_pred, sample_weight=None) -> None:
        if self.pending:  # not bound by TFOptimizer: built on this batch's shape, as Keras builds it
            self.bind_shape((None,) + tuple(np.shape(y_pred))[1:])
        self._load()
        self._metric().update_state(y_true, y_pred, sample_weight=sample_weight)
        self.state = self._read()

    def result(self) -> float:
        self._load()
        return float(self._metric().result())

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_live"] = None  # rebuilt from the config where it runs
        return state

    def __copy__(self):
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__getstate__())
        twin.state = np.array(self.state, copy=True)
        return twin


def _weighted(values: np.ndarray, n: int, sample_weight) -> np.ndarray:
    """``[sum of the values, their count]``, each example's values weighted by its sample weight
    (Keras's weighted metrics: sum(w * v) / sum(w), a weight spread over an example's elements)."""
    values = np.asarray(values, np.float64).reshape(n, -1)
    if sample_weight is None:
        return np.array([values.sum(), values.size])
    w = _np(sample_weight).astype(np.float64).reshape(n, 1)
    return np.array([(w * values).sum(), w.sum() * values.shape[1]])


_NAMES = {
    "accuracy": Accuracy, "acc": Accuracy,
    "top5_accuracy": lambda: TopKAccuracy(5), "top_k_accuracy": lambda: TopKAccuracy(5),
    "sparse_top_k_categorical_accuracy": lambda: TopKAccuracy(5),
    "mae": MeanAbsoluteError, "mean_absolute_error": MeanAbsoluteError,
    "mse": MeanSquaredError, "mean_squared_error": MeanSquaredError,
    "auc": AUC,
    "sparse_categorical_accuracy": Accuracy, "categorical_accuracy": Accuracy, "binary_accuracy": Accuracy,
}


def get(metric) -> Metric:
    """A Metric from a name (``"accuracy"``, ``"top5_accuracy"``, ``"mae"``, ``"mse"``,
    ``"auc"``), a Metric, or a callable ``(y_true, y_pred) -> scalar``."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        key = metric.lower()
        if key.startswith("top") and key.endswith("_accuracy") and key[3:-9].isdigit():
            return TopKAccuracy(int(key[3:-9]))
        if key not in _NAMES:
            raise ValueError(f"Unknown metric {metric!r}. Known metrics: {sorted(_NAMES)}, or pass a callable.")
        return _NAMES[key]()
    if _is_keras_metric(metric):  # stateful: its call gives the running result, not the batch's
        return KerasMetric(metric)
    if callable(metric):
        return FunctionMetric(metric)
    raise TypeError(f"A metric is a name, an optim.metrics.Metric or a callable. Received: {metric!r}")


def _is_keras_metric(metric) -> bool:
    try:
        import keras
    except ImportError:  # pragma: no cover
        return False
    return isinstance(metric, keras.metrics.Metric)
