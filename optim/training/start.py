"""Where a training run starts: fresh, from the optimiser state the caller kept, or from a checkpoint
(rank 0 reads it; the loop broadcasts what it found). Runs wherever the loop runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from optim.training.checkpoint import Checkpoint, load_resume, resolve_resume
from optim.training.restore import fits, load_state

__all__ = ["Start", "load_initial_state", "previous_server_state", "resume_checkpoint"]

log = logging.getLogger("tfnet.training")


class Start(NamedTuple):
    """Where training starts: the global step, epoch and batch, and what a checkpoint carried."""

    step: int
    epoch: int = 0
    batch: int = 0
    history: dict | None = None
    epoch_states: list | None = None
    skipped: int = 0
    #: The ranks that began the epoch the checkpoint is in, and that epoch's steps (0 and None: not recorded).
    shards: int = 0
    epoch_steps: int | None = None

    def plan(self, epoch: int, size: int, steps: int | None, fixed: int | None) -> tuple[int, int | None, int | None, int]:
        """``(skip, steps, fixed steps, shards)`` of ``epoch`` on ``size`` ranks (``steps`` and ``fixed``: the run's):
        the batch a resumed epoch starts at, and, for an epoch other ranks began, their steps and shards
        (:mod:`optim.data.virtual_shards`; 0 shards: the epoch is this run's own)."""
        skip = self.batch if epoch == self.epoch else 0
        if skip and self.shards and self.shards != size and (self.epoch_steps or fixed) is not None:
            theirs = self.epoch_steps or fixed
            return skip, theirs, theirs, self.shards
        return skip, steps, fixed, 0

    @classmethod
    def of(cls, ckpt: Checkpoint) -> Start:
        return cls(ckpt.step, ckpt.epoch, ckpt.batch, ckpt.extra.get("history", {}), ckpt.extra.get("epoch_states"),
                   ckpt.extra.get("skipped", 0), int(ckpt.extra.get("epoch_shards", 0)), ckpt.extra.get("epoch_steps"))


def load_initial_state(step_fn, template, initial_state: Sequence[np.ndarray] | None) -> None:
    """The step holds the optimiser state in variables and updates it in place; it starts from
    the caller's state (the optimiser owns it between calls) or fresh."""
    if initial_state is not None and fits(initial_state, template):
        load_state(step_fn, initial_state, template)
        return
    if initial_state is not None:
        log.warning("The optimiser state from the previous optimize() call does not fit this one (another "
                    "method or trainable set); starting with fresh state.")
    step_fn.set_state(step_fn.init_state())


def previous_server_state(exchange, leaves: Sequence[np.ndarray] | None) -> list:
    """The previous call's server-method state when it fits this call's (the same arrays'
    shapes and dtypes), else none: a fresh start, with a warning when there was one that does not
    fit (another server method, or a net whose trainable set changed)."""
    if not leaves:
        return []
    fresh = exchange.fresh_state()
    if fresh and len(fresh) == len(leaves) and all(
            np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype for a, b in zip(fresh, leaves)):
        return [np.asarray(a) for a in leaves]
    if fresh:
        log.warning("The server method's state from the previous optimize() call does not fit this one; "
                    "starting it fresh.")
    return []


def resume_checkpoint(manager, config, run_id: str) -> Checkpoint | None:
    """The checkpoint to start from (rank 0): this run's own newest (a retried stage), else
    what ``resume`` names (:func:`~optim.training.checkpoint.resolve_resume`). ``manager``: the run's
    checkpoint manager, or None without ``model_dir``."""
    if manager is None:
        if config.resume not in (False, None) and not isinstance(config.resume, bool):
            return load_resume("", config.resume, storage_options=config.storage_options)
        return None
    options = config.storage_options
    source, why = resolve_resume(manager.root, config.resume, run_id, options)
    ckpt = load_resume(manager.root, source, config.keep_checkpoints, options)
    if ckpt is not None:
        log.info("Run %s resumes from %s: %s (step %d).", run_id, why, ckpt.path, ckpt.step)
    elif source is not None:
        log.warning("Run %s found no valid checkpoint in %s; it starts afresh.", run_id, why)
    return ckpt
