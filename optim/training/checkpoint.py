"""Checkpoints: weights, optimiser state, step, epoch and RNG state in one ``.npz`` file.

* Named by run: every ``optimize()`` call makes a run id (:func:`new_run_id`, kept across the
  retries of its stage) and writes only under ``checkpoints/<run id>/``. A run never prunes or
  loads another run's files unless the user asks for it (:func:`resolve_resume`); two runs side by
  side in one ``model_dir`` each keep their own. Old runs' folders stay until the user deletes them.
* Not a pickle: arrays and a JSON header only, read with ``allow_pickle=False``, so loading one
  cannot run code.
* Written atomically (:func:`tfnet.storage.write_bytes_atomic`), to a local folder or any URI
  fsspec understands (``s3://...``).
* Checked: tfnet's container (:mod:`tfnet.container`) holds a SHA-256 of every array; a truncated
  or corrupt file is detected, skipped with a warning, and never loaded.
* Only the newest ``keep`` of the run are kept; temporary files of a killed writer are swept at
  the run's next write (:func:`tfnet.atomic.sweep_stale_temporaries`).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optim.config import RUN_ID
from optim.errors import CheckpointError, CheckpointWarning, StorageError
from tfnet import storage

__all__ = ["Checkpoint", "CheckpointManager", "CheckpointWarning", "CheckpointError", "new_run_id", "list_runs",
           "resolve_resume"]

FORMAT = "tfnet-checkpoint-1"
_NAME = re.compile(r"^ckpt-(\d{9})\.npz$")
log = logging.getLogger("tfnet.training.checkpoint")


def new_run_id() -> str:
    """A fresh run id, ``YYYYmmdd-HHMMSS-ffffff-xxxx`` (UTC start time and 16 random bits: :data:`optim.config.RUN_ID`)."""
    now = time.time()
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{int(now % 1 * 1e6):06d}-{secrets.token_hex(2)}"


def list_runs(root: str, storage_options=None) -> list[str]:
    """The run ids under ``root`` (``model_dir/checkpoints``, a path or a URI) that hold at least
    one checkpoint file, oldest first (run ids sort in start order)."""
    runs = [d for d in storage.listdir(root, storage_options) if RUN_ID.match(d)]
    return sorted(r for r in runs if CheckpointManager(root, run_id=r, storage_options=storage_options).all_steps())



@dataclass
class Checkpoint:
    step: int
    epoch: int
    batch: int
    weights: dict[str, np.ndarray]
    state: list[np.ndarray]
    extra: dict[str, Any] = field(default_factory=dict)
    path: str | None = None


class CheckpointManager:
    """Writes and finds one run's checkpoints.

    Args:
        root: The checkpoint folder (``model_dir/checkpoints``).
        keep: How many of the run's newest to keep. Default: 3.
        run_id: The run; its files go to ``root/<run_id>/ckpt-<step>.npz``. Default: none, the
            files directly in ``root`` (the layout before run ids, read-only in practice).
        storage_options: For a URI ``root``: fsspec's options (endpoint, credentials). Default: none.
    """

    def __init__(self, root: str, keep: int = 3, run_id: str | None = None, storage_options=None):
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"`keep_checkpoints` must be a positive integer. Received: {keep!r}")
        if run_id is not None and not RUN_ID.match(run_id):
            raise ValueError(f"Not a run id: {run_id!r}; expected YYYYmmdd-HHMMSS-ffffff-xxxx.")
        self.root = root
        self.run_id = run_id
        self.storage_options = storage_options
        self.directory = storage.join(root, run_id) if run_id else root
        self.keep = keep

    def path_for(self, step: int) -> str:
        return storage.join(self.directory, f"ckpt-{step:09d}.npz")

    def save(self, ckpt: Checkpoint) -> str:
        from tfnet.container import ContainerError, pack

        arrays: dict[str, np.ndarray] = {}
        for i, name in enumerate(ckpt.weights):
            arrays[f"w{i:05d}"] = np.asarray(ckpt.weights[name])
        for i, leaf in enumerate(ckpt.state):
            arrays[f"s{i:05d}"] = np.asarray(leaf)
        header = {
            "step": int(ckpt.step),
            "epoch": int(ckpt.epoch),
            "batch": int(ckpt.batch),
            "weight_names": list(ckpt.weights),
            "state_leaves": len(ckpt.state),
            "run_id": self.run_id,
            "extra": ckpt.extra,
        }
        try:
            data = pack(FORMAT, header, arrays)
        except ContainerError as exc:
            raise CheckpointError(f"Checkpoint at step {ckpt.step}: {exc}") from None
        from tfnet.atomic import sweep_stale_temporaries

        path = self.path_for(ckpt.step)
        if not storage.is_remote(self.directory):
            sweep_stale_temporaries(self.directory)
        try:
            storage.write_bytes_atomic(path, data, self.storage_options)
        except OSError as exc:
            # a full disk, a read-only or vanished folder: a retry would fail the same way
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._full(path, len(data), exc) from exc
            raise CheckpointError(
                f"Cannot write the checkpoint {path} ({type(exc).__name__}: {exc}); training stopped so that "
                "no progress is lost silently. Free space or give model_dir another place."
            ) from exc
        self._prune()
        return path

    def _full(self, path: str, needed: int, exc: OSError) -> StorageError:
        """The error for a checkpoint that does not fit: the folder, the bytes it needed (and had, on a local
        disk), and the newest checkpoint that stays (the write left nothing: it was to a temporary name)."""
        free = ""
        if not storage.is_remote(self.directory):
            try:
                free = f", {shutil.disk_usage(self.directory).free:,} free"
            except OSError:
                pass
        steps = self.all_steps()
        kept = f"the newest that stays is {self.path_for(steps[-1])}" if steps else "no earlier one was written"
        err = StorageError(
            f"Cannot write the checkpoint {path}: {self.directory} is full ({os.strerror(exc.errno)}); the checkpoint "
            f"needs {needed:,} bytes there{free}. Training stopped so that no progress is lost silently; the earlier "
            f"checkpoints are intact ({kept}). Free space, or give model_dir another place, and resume from it "
            "(resume=True, or resume='<that checkpoint>')."
        )
        err.folder, err.needed = self.directory, needed  # type: ignore[attr-defined]
        return err

    def all_steps(self) -> list[int]:
        names = storage.listdir(self.directory, self.storage_options)
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def _prune(self) -> None:
        for step in self.all_steps()[: -self.keep]:
            storage.remove(self.path_for(step), self.storage_options)

    @staticmethod
    def load(path: str, storage_options=None) -> Checkpoint:
        """Loads and verifies one checkpoint.

        Raises:
            CheckpointError: the file is truncated, corrupt, or not a tfnet checkpoint.
        """
        from tfnet.container import ContainerError, unpack

        try:
            data = storage.read_bytes(path, storage_options)
            header, arrays = unpack(data, FORMAT, what=path)
        except OSError as exc:
            raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
        except ContainerError as exc:
            raise CheckpointError(str(exc)) from None
        names = header["weight_names"]
        weights = {name: arrays[f"w{i:05d}"] for i, name in enumerate(names)}
        state = [arrays[f"s{i:05d}"] for i in range(header["state_leaves"])]
        extra = dict(header.get("extra", {}))
        extra.setdefault("run_id", header.get("run_id"))
        return Checkpoint(header["step"], header["epoch"], header["batch"], weights, state, extra, path)

    def latest_valid(self) -> Checkpoint | None:
        """The newest checkpoint that loads and verifies; corrupt ones are skipped with a warning."""
        for step in reversed(self.all_steps()):
            path = self.path_for(step)
            try:
                return self.load(path, self.storage_options)
            except CheckpointError as exc:
                warnings.warn(f"Skipping checkpoint {exc}", CheckpointWarning, stacklevel=2)
        return None


def resolve_resume(root: str, resume, own_run: str | None = None, storage_options=None) -> tuple[str | None, str]:
    """What a run resumes from, as ``(source, description)``: ``source`` is a run id (its newest
    valid checkpoint), a checkpoint path, or None (a fresh start).

    * The run's own checkpoints come first (a retried stage continues where it stopped).
    * ``resume=True``: the newest other run in ``root`` that has a checkpoint.
    * ``resume="<run id>"`` or a checkpoint path: that one.
    * ``resume=False``: nothing.

    Raises:
        CheckpointError: the named run or file does not exist.
    """
    runs = list_runs(root, storage_options)
    if own_run and own_run in runs:
        return own_run, f"this run's ({own_run}) newest checkpoint"
    if resume is False or resume is None:
        return None, "a fresh start"
    if resume is True:
        others = [r for r in runs if r != own_run]
        if not others:
            return None, f"a fresh start (resume=True, but {root} holds no run's checkpoint)"
        return others[-1], f"the newest run in {root}, {others[-1]}"
    if not isinstance(resume, str):
        raise TypeError(f"`resume` must be a bool, a run id or a checkpoint path. Received: {resume!r}")
    if RUN_ID.match(resume):
        if resume not in runs:
            raise CheckpointError(f"resume={resume!r}: no checkpoint of that run in {root}. Runs there: {runs or 'none'}")
        return resume, f"run {resume}"
    if not storage.exists(resume, storage_options) or storage.isdir(resume, storage_options):
        raise CheckpointError(
            f"resume={resume!r} is neither a run id (YYYYmmdd-HHMMSS-ffffff-xxxx) nor a checkpoint file. Runs in "
            f"{root}: {runs or 'none'}"
        )
    return resume, f"the checkpoint {resume}"


def load_resume(root: str, source: str | None, keep: int = 3, storage_options=None) -> Checkpoint | None:
    """The checkpoint named by :func:`resolve_resume`'s ``source``: a run's newest valid one (None
    when all of that run's files are corrupt, each skipped with a warning), or the given file."""
    if source is None:
        return None
    if RUN_ID.match(source):
        return CheckpointManager(root, keep, run_id=source, storage_options=storage_options).latest_valid()
    return CheckpointManager.load(source, storage_options)
