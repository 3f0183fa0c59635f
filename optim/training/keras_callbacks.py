"""Keras's own callbacks (``keras.callbacks``) with tfnet, decided on the driver before the first step: each works as
in ``model.fit`` or is refused, in one line that names it and what to use. Driver side, pure.

* Called on rank 0 as ``fit`` calls them (:mod:`optim.training.callbacks`): ``EarlyStopping``,
  ``ReduceLROnPlateau``, ``TerminateOnNaN``, ``LambdaCallback``, ``LearningRateScheduler``, ``CSVLogger``,
  ``History``, a user's own subclass, and ``ModelCheckpoint``, which writes Keras's own ``.keras`` or ``.weights.h5``
  file through ``TFNet.to_keras`` (so only for a net from ``TFNet.from_keras``; on a distributed run, on rank 0's
  file system).
* Carried out by tfnet itself, not called: ``BackupAndRestore(backup_dir)`` (the run's checkpoints go to
  ``backup_dir`` and the run resumes the newest one there, as ``model_dir=backup_dir, resume=True``; an integer
  ``save_freq`` is ``checkpoint_every``), ``TensorBoard(log_dir)`` (tfnet's own event files, in ``log_dir``).
* ``SwapEMAWeights()`` (validation on ``use_ema``'s moving average, the training weights put back after it).
* Refused: ``ProgbarLogger`` (use ``verbose``), ``RemoteMonitor`` (use ``optim.MLflowLogger``),
  ``SwapEMAWeights(swap_on_epoch=True)``, ``TensorBoard`` asked for histograms, images, embeddings or a profile (tfnet
  writes scalars).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["KerasCallbackPlan", "UnsupportedCallbackError", "plan_keras_callbacks"]


class UnsupportedCallbackError(TypeError):
    """A Keras callback that tfnet cannot run as ``fit`` does; raised before the first step."""


@dataclass
class KerasCallbackPlan:
    """What the callbacks given to ``optimize`` come to: those to call, and the settings tfnet takes from the ones
    it carries out itself (None where none of them set it)."""

    run: list = field(default_factory=list)
    model_dir: str | None = None
    resume: bool = False
    checkpoint_every: int | None = None
    tensorboard_dir: str | None = None
    #: SwapEMAWeights: validation runs on use_ema's moving average
    swap_ema: bool = False


_REFUSED = {
    "ProgbarLogger": "tfnet prints its own progress: pass verbose=1 (a bar) or 2 (a line per epoch)",
    "RemoteMonitor": "send the metrics with optim.MLflowLogger, or read them from model_dir's TensorBoard events",
}
#: TensorBoard's options beyond scalars, and their "off" values (a profile shows as its stop batch)
_TENSORBOARD_EXTRAS = {"histogram_freq": 0, "write_images": False, "embeddings_freq": 0, "_stop_batch": 0}


def _keras_kind(cb) -> str | None:
    """The name of the ``keras.callbacks`` class ``cb`` is (not a subclass of it a user wrote), or None."""
    cls = type(cb)
    return cls.__name__ if cls.__module__.startswith("keras.") else None


def plan_keras_callbacks(callbacks: list, net, model_dir: str | None, method=None) -> KerasCallbackPlan:
    """Sorts ``callbacks`` (Keras's and the user's) into those to call and the settings tfnet takes from the rest;
    ``method``: the optimisation method, whose rate a callback may set.

    Raises:
        UnsupportedCallbackError: a callback tfnet cannot run as ``fit`` does, naming it and what to use.
    """
    plan = KerasCallbackPlan()
    for cb in callbacks:
        kind = _keras_kind(cb)
        if kind in _REFUSED:
            raise UnsupportedCallbackError(f"keras.callbacks.{kind} does not run with tfnet: {_REFUSED[kind]}.")
        if kind in ("ReduceLROnPlateau", "LearningRateScheduler") and not getattr(method, "scales_with_rate", True):
            raise UnsupportedCallbackError(
                f"keras.callbacks.{kind} sets the learning rate, and the update of {type(method).__name__} is not its "
                "rate times a direction (the rate or the weight decay is inside it), so tfnet cannot scale it as Keras "
                "would: give the method a schedule (optim.schedules, or a Keras LearningRateSchedule) instead.")
        if kind == "SwapEMAWeights":
            if not getattr(method, "use_ema", False):
                raise UnsupportedCallbackError("keras.callbacks.SwapEMAWeights swaps in the optimiser's moving average "
                                               "of the weights: the method needs use_ema=True, as Keras asks.")
            if cb.swap_on_epoch:
                raise UnsupportedCallbackError(
                    "keras.callbacks.SwapEMAWeights(swap_on_epoch=True) gives the epoch-end callbacks (a checkpoint's "
                    "file) the moving average; tfnet swaps it in for validation only (swap_on_epoch=False), and the "
                    "weights take it when training ends.")
            plan.swap_ema = True
            continue
        if kind == "ModelCheckpoint" and not getattr(net, "keras_source", None):
            raise UnsupportedCallbackError(
                "keras.callbacks.ModelCheckpoint writes Keras's own files, and this net has no Keras model behind it "
                "(only a net from TFNet.from_keras, before cut, add_head or with_lora, has one): keep checkpoints in "
                "TFOptimizer's model_dir, and save the net with net.save(folder).")
        if kind == "ModelCheckpoint":
            try:  # the model must come back here, before the first step, not on rank 0 after an epoch
                net.to_keras()
            except Exception as exc:  # noqa: BLE001 - Keras's errors for a model it cannot rebuild (a custom layer)
                raise UnsupportedCallbackError(
                    f"keras.callbacks.ModelCheckpoint writes Keras's own files, and this net's Keras model does not "
                    f"rebuild here ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
                    "); register its custom objects (keras.saving.register_keras_serializable), or save the net with "
                    "net.save(folder).") from None
        if kind == "BackupAndRestore":
            backup = os.fspath(cb.backup_dir)
            if model_dir and os.path.abspath(model_dir) != os.path.abspath(backup):
                raise UnsupportedCallbackError(
                    f"keras.callbacks.BackupAndRestore(backup_dir={backup!r}) and TFOptimizer's model_dir={model_dir!r} "
                    "are two places for the run's checkpoints: give one (model_dir=..., optimize(resume=True) is the "
                    "same as the callback).")
            plan.model_dir, plan.resume = backup, True
            if isinstance(cb.save_freq, int) and not isinstance(cb.save_freq, bool):
                plan.checkpoint_every = cb.save_freq
            continue
        if kind == "TensorBoard":
            asked = [k.replace("_stop_batch", "profile_batch") for k, off in _TENSORBOARD_EXTRAS.items()
                     if getattr(cb, k, off) not in (off, None)]
            if asked:
                raise UnsupportedCallbackError(
                    f"keras.callbacks.TensorBoard with {', '.join(sorted(asked))}: tfnet writes the scalars (loss, "
                    "metrics, learning rate, throughput) only; leave those options at their defaults.")
            plan.tensorboard_dir = os.fspath(cb.log_dir)
            continue
        plan.run.append(cb)
    return plan
