"""Keras callbacks in the training loop, as ``model.fit`` calls them. Runs wherever the loop runs: in this process for
a local run, on every rank of a distributed one (the callbacks themselves on rank 0 only).

``optimize(..., callbacks=[...])`` takes ``keras.callbacks.Callback`` objects (``EarlyStopping`` with
``restore_best_weights``, ``ReduceLROnPlateau``, ``TerminateOnNaN``, ``LambdaCallback``, a user's own subclass).
:class:`CallbackRun` calls ``on_train_begin``, ``on_epoch_begin``, ``on_epoch_end`` (the epoch's logs: the loss and
metrics summed over every rank, and the validation metrics when there is validation data), ``on_train_batch_end``
(the loss so far this epoch; only when a callback has batch hooks) and ``on_train_end``. Their ``self.model`` is a
:class:`ModelView`: ``stop_training``, ``get_weights``, ``set_weights`` and ``optimizer.learning_rate`` (read and
set: the rate is a multiplier of the method's own, a variable the compiled step reads; it scales the method's whole
update, which is the same as a new rate for SGD, Adam, AdamW, Adagrad and LARS, and for a method with momentum
scales the momentum already gathered too). What a callback decides on rank 0 reaches every rank at the same step:
after each epoch (and after each step when a callback has batch hooks) rank 0 broadcasts whether to stop, the rate's
multiplier, and its weights when a callback set them. A stop stops every rank there, after that epoch's checkpoint;
the run returns the weights the callbacks left (``restore_best_weights``). ``ModelCheckpoint`` writes Keras's own
files through ``self.model.save`` (the Keras model a net from ``TFNet.from_keras`` came from, with the net's weights).
Which of ``keras.callbacks`` run here, which tfnet carries out itself (``BackupAndRestore``, ``TensorBoard``) and which
it refuses before the first step: :mod:`optim.training.keras_callbacks`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from optim.callbacks import Callback

__all__ = ["CallbackRun", "ModelView", "ScaledRate", "callback_list", "shippable_callbacks"]

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def callback_list(callbacks) -> list:
    """``callbacks`` as a list, as Keras's ``fit`` takes them: None is none, one callback is a list of one.

    Raises:
        TypeError: neither a list nor a callback (Keras's, with ``on_epoch_end`` and ``set_model``, or tfnet's).
    """
    if callbacks is None:
        return []
    if isinstance(callbacks, (list, tuple)):
        return list(callbacks)
    if isinstance(callbacks, Callback) or (hasattr(callbacks, "on_epoch_end") and hasattr(callbacks, "set_model")):
        return [callbacks]
    raise TypeError(f"`callbacks` must be a list of keras.callbacks.Callback. Received: {callbacks!r}")


def shippable_callbacks(callbacks: list) -> None:
    """A distributed run's callbacks go to rank 0 with the job: they must pickle (cloudpickle, as Spark ships
    functions).

    Raises:
        TypeError: one cannot be pickled, naming it.
    """
    import cloudpickle

    for cb in callbacks:
        try:
            cloudpickle.dumps(cb)
        except Exception as exc:  # noqa: BLE001 - cloudpickle's many errors for what it cannot ship
            raise TypeError(f"The callback {cb!r} cannot be sent to the Spark workers (a distributed run calls its "
                            f"callbacks on rank 0): {type(exc).__name__}: {exc}") from None


class ScaledRate:
    """An ``init`` / ``update`` method whose updates are scaled by ``scale`` (a ``tf.Variable`` the compiled step
    reads): the learning rate times that multiplier, since every rule of tfnet's methods ends in its learning rate.
    ``learning_rate_at`` (the logged rate) is ``source``'s (default: the method's), times the multiplier."""

    def __init__(self, method, scale: tf.Variable, source=None):
        self.method, self.scale = method, scale
        self.source = source if source is not None else method

    def init(self, params):
        return self.method.init(params)

    def update(self, grads, state, params=None):
        updates, state = self.method.update(grads, state, params)
        return {k: u * tf.cast(self.scale, u.dtype) for k, u in updates.items()}, state

    def base_rate(self, step: int) -> float:
        fn = getattr(self.source, "learning_rate_at", None)
        return float(fn(step)) if fn is not None else float(getattr(self.source, "learning_rate", 1.0))

    def learning_rate_at(self, step: int) -> float:
        return self.base_rate(step) * float(self.scale.numpy())


class _OptimizerView:
    def __init__(self, view: ModelView):
        self._view = view

    @property
    def learning_rate(self) -> float:
        return self._view.rate.learning_rate_at(self._view.step)

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        base = self._view.rate.base_rate(self._view.step)
        scale = float(value) / base if base else 1.0
        method = self._view.rate.method
        if scale != 1.0 and not getattr(method, "scales_with_rate", True):
            raise TypeError(f"A callback set the learning rate of {type(method).__name__}, whose update is not its "
                            "rate times a direction (the rate or the weight decay inside it), so tfnet cannot scale "
                            "it as Keras would: give the method a schedule (optim.schedules) instead of "
                            "ReduceLROnPlateau or LearningRateScheduler.")
        self._view.rate.scale.assign(scale)


class ModelView:
    """What a Keras callback's ``self.model`` offers here: ``stop_training``, ``get_weights`` and ``set_weights``
    (every weight, in ``net.weight_names`` order), ``optimizer.learning_rate``, and ``save`` and ``save_weights`` (Keras's
    files, for a net from ``TFNet.from_keras``)."""

    def __init__(self, net, rate: ScaledRate):
        self.net, self.rate = net, rate
        self.stop_training = False
        self.weights_set = False
        self.step = 0
        self.optimizer = _OptimizerView(self)

    def get_weights(self) -> list[np.ndarray]:
        return list(self.net.get_weights().values())

    def save(self, filepath, overwrite: bool = True, **kwargs) -> None:
        """Keras's ``model.save`` (what ``ModelCheckpoint`` calls): the Keras model the net came from, with the net's
        weights (``TFNet.to_keras``), saved by Keras."""
        self.net.to_keras().save(filepath, overwrite=overwrite, **kwargs)

    def save_weights(self, filepath, overwrite: bool = True, **kwargs) -> None:
        """Keras's ``model.save_weights`` (``ModelCheckpoint(save_weights_only=True)``): a ``.weights.h5`` file the
        original Keras model loads."""
        self.net.to_keras().save_weights(filepath, overwrite=overwrite, **kwargs)

    def set_weights(self, weights) -> None:
        names = list(self.net.weight_names)
        if len(weights) != len(names):
            raise ValueError(f"set_weights takes {len(names)} arrays (the net's weights, in order); received "
                             f"{len(weights)}.")
        self.net.set_weights(dict(zip(names, weights)))
        self.weights_set = True


class CallbackRun:
    """The callbacks of one ``train`` call: ``chief`` (rank 0, or a local run) calls them; every rank takes the
    decisions through ``collective``."""

    def __init__(self, callbacks: list, net, method, collective, epochs: int, rate_source=None):
        self.callbacks, self.net, self.collective = callbacks, net, collective
        self.chief = collective.is_chief
        scale = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="tfnet_lr_scale")
        self.rate = ScaledRate(method, scale, rate_source)
        self.view = ModelView(net, self.rate)
        self.batch_hooks = any(_overrides(cb, _BATCH_HOOKS) for cb in callbacks)
        #: What the callbacks added to the last epoch's logs (rank 0), for the history, as Keras's History keeps it.
        self.added: dict[str, float] = {}
        self.callback_keys: set[str] = set()
        if self.chief:
            for cb in callbacks:
                cb.set_model(self.view)
                cb.set_params({"epochs": epochs, "verbose": 0})

    def train_begin(self) -> None:
        self._call("on_train_begin", {})

    def epoch_begin(self, epoch: int) -> None:
        self._call("on_epoch_begin", epoch, {})

    def batch_end(self, batch: int, step: int, logs: dict) -> bool:
        """After a step (only with batch hooks): rank 0's callbacks see the loss so far; True when every rank is
        to stop now."""
        if not self.batch_hooks:
            return False
        self.view.step = step
        self._call("on_train_batch_end", batch, {"loss": float(logs.get("loss", float("nan")))})
        return self._decide(weights=False)

    def epoch_end(self, epoch: int, step: int, logs: dict) -> bool:
        """After an epoch (its checkpoint written): rank 0's callbacks see its logs, one dict for all of them as in
        ``fit``; what they add to it (``ReduceLROnPlateau``'s and ``LearningRateScheduler``'s ``learning_rate``) is
        in :attr:`added` for the history. Every rank takes their decisions (the rate, the weights they set); True
        when every rank is to stop here."""
        self.view.step = step
        own = {k: float(v) for k, v in logs.items() if _number(v) and k not in self.callback_keys}
        shown = dict(own)  # the epoch's own logs: not what callbacks added to the history before
        self._call("on_epoch_end", epoch, shown)
        self.added = {k: float(v) for k, v in shown.items() if k not in own and _number(v)}
        self.callback_keys |= set(self.added)
        return self._decide(weights=True)

    def train_end(self, logs: dict) -> None:
        """At the end: the callbacks' ``on_train_end`` (``restore_best_weights`` sets the weights here), and every
        rank takes rank 0's weights if they were set."""
        self._call("on_train_end", {k: float(v) for k, v in logs.items() if _number(v)})
        self._decide(weights=True)

    def _call(self, hook: str, *args) -> None:
        if not self.chief:
            return
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    def _decide(self, weights: bool) -> bool:
        """Rank 0's decisions, broadcast: stop or not, the rate's multiplier, and its weights when set."""
        mine = {"stop": bool(self.view.stop_training), "scale": float(self.rate.scale.numpy()),
                "weights": bool(self.view.weights_set)} if self.chief else {}
        if self.collective.size == 1:
            decided = mine
        else:
            decided = self.collective.broadcast_json(mine)
            self.rate.scale.assign(decided["scale"])
            if weights and decided["weights"]:
                arrays = self.collective.broadcast(list(self.net.get_weights().values()))
                self.net.set_weights(dict(zip(self.net.weight_names, arrays)))
        self.view.weights_set = False
        self.view.stop_training = bool(decided["stop"])
        return self.view.stop_training


def _overrides(cb, hooks) -> bool:
    """Whether ``cb``'s class overrides one of ``hooks`` (Keras's base class defines them all as no-ops)."""
    import keras

    base = keras.callbacks.Callback
    return any(getattr(type(cb), h, None) is not getattr(base, h, None) for h in hooks if hasattr(type(cb), h))


def _number(v) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
