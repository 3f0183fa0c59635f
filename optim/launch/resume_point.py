"""Where the next attempt of a run resumes, as far as the staging of its data cares: the ranks that began the epoch
it resumes in (:mod:`optim.data.virtual_shards`). Driver side; rank 0 reads the same checkpoint again when it starts."""

from __future__ import annotations

import logging
import warnings

from optim.config import TrainConfig
from tfnet import storage

__all__ = ["resumed_epoch_shards"]

log = logging.getLogger("tfnet.spark")


def resumed_epoch_shards(config: TrainConfig, n: int) -> int:
    """The shards (the ranks that began it) of the epoch the run resumes in, where the resume is inside an epoch
    that more than ``n`` ranks began; else 0. Reads the checkpoint rank 0 will start from (the run's own newest, or
    what ``resume`` names); a checkpoint that cannot be read is rank 0's to report, here it counts as none."""
    from optim.training.checkpoint import load_resume, resolve_resume

    if not config.model_dir:
        return 0
    root = storage.join(config.model_dir, "checkpoints")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            source, _ = resolve_resume(root, config.resume, config.run_id, config.storage_options)
            ckpt = load_resume(root, source, config.keep_checkpoints, config.storage_options)
    except Exception as exc:  # noqa: BLE001 - rank 0 meets the same checkpoint and says what is wrong with it
        log.debug("No resume point read for staging: %s", exc)
        return 0
    if ckpt is None or not ckpt.batch:
        return 0
    shards = int(ckpt.extra.get("epoch_shards", 0))
    return shards if shards > n else 0
