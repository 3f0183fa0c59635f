"""How each attempt's data is staged, as far as a change of rank count inside an epoch cares
(:mod:`optim.data.virtual_shards`): in an order of the rows' values for a run that may shrink (and a call that resumes
one), and, for an attempt that resumes an epoch more ranks began, each rank with those ranks' shards. Driver side; rank
0 reads the same checkpoint again when it starts."""

from __future__ import annotations

import logging
import warnings

from optim.config import TrainConfig
from optim.data.base import DataAdapter, Staged
from tfnet import storage

__all__ = ["ORDER_RECORD", "order_rows", "record_staging_order", "resumed_epoch_shards", "resumes_in_order", "staged_for"]

log = logging.getLogger("tfnet.spark")

#: The file (under ``model_dir/ranks/<run id>/``) that says a run staged its DataFrame's rows in an order of their
#: values (:func:`optim.launch.backends.base.in_canonical_order`): a later staging of the same rows finds each
#: partition's rows in the same order.
ORDER_RECORD = "staging.json"


def record_staging_order(config: TrainConfig) -> None:
    """Writes :data:`ORDER_RECORD` for this run (best effort: without it, a resume on fewer ranks stages as it is)."""
    import json

    try:
        storage.write_bytes_atomic(storage.join(config.model_dir, "ranks", config.run_id, ORDER_RECORD),
                                   json.dumps({"rows": "in_canonical_order"}).encode(), config.storage_options)
    except OSError as exc:
        log.warning("Cannot record the staging order of run %s (%s).", config.run_id, exc)


def resumes_in_order(config: TrainConfig) -> bool:
    """Whether the run this call resumes (``resume``: a run id, a checkpoint path, or True for the newest run) staged
    its rows in an order of their values (:data:`ORDER_RECORD`): then this call stages them so too, and an epoch it
    resumes on fewer ranks finds each shard as it was."""
    from optim.training.checkpoint import resolve_resume

    if not config.model_dir or config.resume in (False, None):
        return False
    root = storage.join(config.model_dir, "checkpoints")
    try:
        source, _ = resolve_resume(root, config.resume, config.run_id, config.storage_options)
    except Exception as exc:  # noqa: BLE001 - rank 0 meets the same source and says what is wrong with it
        log.debug("No resume source read for staging: %s", exc)
        return False
    if source is None:
        return False
    record = _order_record(source) if source.endswith(".npz") else \
        storage.join(config.model_dir, "ranks", source, ORDER_RECORD)
    return record is not None and storage.exists(record, config.storage_options)


def resumed_epoch_shards(config: TrainConfig, n: int) -> int:
    """The shards (the ranks that began it) of the epoch the run resumes in, where the resume is inside an epoch that
    more than ``n`` ranks began; else 0. Reads the checkpoint rank 0 will start from (the run's own newest, or what
    ``resume`` names); a checkpoint that cannot be read is rank 0's to report, here it counts as none."""
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


def _order_record(path: str) -> str | None:
    """The :data:`ORDER_RECORD` of the run that wrote the checkpoint at ``path``
    (``<its model_dir>/checkpoints/<run id>/ckpt-<step>.npz``: the run resumed may be another ``model_dir``'s); None
    for a file outside that layout (no run's record)."""
    parts = str(path).replace("\\", "/").rsplit("/", 3)
    if len(parts) == 4 and parts[1] == "checkpoints":
        return storage.join(parts[0], "ranks", parts[2], ORDER_RECORD)
    return None


def order_rows(host, config: TrainConfig, elastic: bool) -> None:
    """Whether ``host`` (the call's backend) stages a DataFrame's rows in an order of their values
    (:func:`optim.launch.backends.base.in_canonical_order`): for an elastic run, which may go on with fewer ranks
    inside an epoch, and a call that resumes such a run; recorded for a later call (:data:`ORDER_RECORD`)."""
    host.canonical_order = elastic or resumes_in_order(config)
    if host.canonical_order and config.model_dir:
        record_staging_order(config)


def staged_for(dataset: DataAdapter, host, n: int, per_rank: int, config: TrainConfig, *, resuming: bool, cleanup,
               validation, timeout_s: float) -> Staged:
    """``dataset`` staged for an attempt on ``n`` ranks: where the attempt may resume (``resuming``) an epoch that
    more ranks began, each rank with their shards (:meth:`~optim.data.base.DataAdapter.stage_resumed`), else as for
    a fresh epoch (:meth:`~optim.data.base.DataAdapter.stage`)."""
    if resuming and type(dataset).stage_resumed is not DataAdapter.stage_resumed:
        shards = resumed_epoch_shards(config, n)
        if shards:
            staged = dataset.stage_resumed(host, n, per_rank, shards, cleanup=cleanup, validation=validation,
                                           timeout_s=timeout_s)
            if staged is not None:
                return staged
    return dataset.stage(host, n, per_rank, cleanup=cleanup, validation=validation, timeout_s=timeout_s)
