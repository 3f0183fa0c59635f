"""The settings of one training run (:func:`optim.training.loop.train`), checked before it starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optim.sync import check_sync
from optim.training.callbacks import check_callbacks
from optim.training.checkpoint import RUN_ID
from optim.training.reporting import tensorboard_dir
from optim.training.weights import check_class_weight

__all__ = ["TrainConfig"]


@dataclass
class TrainConfig:
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

    def events_dir(self) -> str | None:
        """Where this run's TensorBoard events go, or None (no model_dir and no TensorBoard callback)."""
        if self.tensorboard_dir:
            return self.tensorboard_dir
        return tensorboard_dir(self.model_dir, self.run_id) if self.model_dir else None

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
