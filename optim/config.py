"""The settings of one training run (:func:`optim.training.loop.train`), checked before it starts. Both sides.

:class:`TrainConfig` is plain data: the driver builds and checks it (``optimize()``), and it reaches every rank in
the job's :class:`~optim.protocol.TrainSpec`. Its checks are pure (no TensorFlow, no Spark), so it lives in the core
layer beside the protocol that carries it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optim.sync import check_sync

__all__ = ["RUN_ID", "TrainConfig", "check_callbacks", "check_class_weight"]

#: A run id: the UTC start time to the microsecond, then 4 random hex digits (sorts in start order;
#: :func:`optim.training.checkpoint.new_run_id` makes them).
RUN_ID = re.compile(r"^\d{8}-\d{6}-\d{6}-[0-9a-f]{4}$")


def check_callbacks(callbacks) -> list:
    """``callbacks`` as a list, each one with Keras's callback methods (:mod:`optim.training.callbacks` runs them).

    Raises:
        TypeError: not a list, or an entry that is no callback.
    """
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"`callbacks` must be a list of keras.callbacks.Callback. Received: {callbacks!r}")
    for cb in callbacks:
        if not (hasattr(cb, "on_epoch_end") and hasattr(cb, "set_model")):
            raise TypeError(f"`callbacks` entries must be keras.callbacks.Callback objects (on_epoch_end, set_model). "
                            f"Received: {cb!r}")
    return list(callbacks)


def check_class_weight(class_weight) -> dict[int, float] | None:
    """``class_weight`` as ``{class id: weight}``, checked (:mod:`optim.training.weights` applies it).

    Raises:
        TypeError: not a dict.
        ValueError: a key that is not a class id (an integer >= 0) or a weight that is not a finite number >= 0.
    """
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict):
        raise TypeError(f"`class_weight` must be a dict {{class id: weight}}. Received: class_weight={class_weight!r}")
    out = {}
    for k, v in class_weight.items():
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"`class_weight` keys are class ids (integers >= 0). Received: {k!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not math.isfinite(float(v)) or v < 0:
            raise ValueError(f"`class_weight` values are finite weights >= 0. Received: {k!r}: {v!r}")
        out[int(k)] = float(v)
    return out


@dataclass
class TrainConfig:
    """What one run does: epochs, batch (global on the driver, per rank in the ranks' copy), shuffling, validation
    and checkpoint cadence, where it writes, what it resumes, and the loop's options. :meth:`check` checks every
    field and normalises ``sync``, ``callbacks`` and ``class_weight``."""

    epochs: int = 1
    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    validate_every: int | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
    model_dir: str | None = None
    #: False, True (the newest run in model_dir), a run id, or a checkpoint path
    resume: bool | str = False
    #: this run's id (``optimize()`` makes one per call; its retries keep it)
    run_id: str | None = None
    #: fsspec options for a URI model_dir (endpoint, credentials); None for the library's defaults
    storage_options: dict | None = None
    #: stop when the global step reaches this (Analytics Zoo's MaxIteration); None: run every epoch
    max_steps: int | None = None
    on_nonfinite: str = "raise"
    drop_remainder: bool = False
    validation_batch_size: int | None = None
    #: the training step's precision: "fp32" or "bf16" (tfnet.precision)
    precision: str = "fp32"
    #: how often the ranks exchange (optim.sync): None (every step), LocalSGD or Asynchronous
    sync: Any = None
    #: Keras callbacks, called on rank 0 as ``model.fit`` calls them (optim.training.callbacks)
    callbacks: list = field(default_factory=list)
    #: {class id: weight} for the training loss (optim.training.weights), as Keras's class_weight
    class_weight: dict | None = None
    #: where rank 0 writes TensorBoard events (Keras's TensorBoard callback's log_dir); None: model_dir/tensorboard/<run>
    tensorboard_dir: str | None = None
    #: validate on use_ema's moving average of the weights (Keras's SwapEMAWeights callback)
    swap_ema: bool = False

    def events_dir(self) -> str | None:
        """Where this run's TensorBoard events go, or None (no model_dir and no TensorBoard callback)."""
        if self.tensorboard_dir:
            return self.tensorboard_dir
        if not self.model_dir:
            return None
        from tfnet import storage  # model_dir/tensorboard/<run id>: TensorBoard shows each run as its own line

        return storage.join(self.model_dir, "tensorboard", self.run_id or "")

    def check(self) -> None:
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={v!r}")
        for name in ("validate_every", "checkpoint_every", "validation_batch_size", "max_steps"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"`{name}` must be a positive integer or None. Received: {name}={v!r}")
        if self.on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"`on_nonfinite` must be 'raise' or 'skip'. Received: {self.on_nonfinite!r}")
        if not isinstance(self.resume, (bool, str)):
            raise TypeError(f"`resume` must be a bool, a run id or a checkpoint path. Received: resume={self.resume!r}")
        if self.resume is True and not self.model_dir:
            raise ValueError("`resume=True` needs a `model_dir` to find checkpoints in.")
        if isinstance(self.resume, str) and RUN_ID.match(self.resume) and not self.model_dir:
            raise ValueError(f"`resume={self.resume!r}` names a run; it needs the `model_dir` the run wrote to.")
        self.sync = check_sync(self.sync)
        self.callbacks = check_callbacks(self.callbacks)
        self.class_weight = check_class_weight(self.class_weight)
