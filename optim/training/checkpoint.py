"""Checkpoints: weights, optimiser state, step, epoch and RNG state in one ``.npz`` file.

* Not a pickle: arrays and a JSON header only, read with ``allow_pickle=False``, so loading one
  cannot run code.
* Written atomically (:func:`tfnet.graph_io.write_bytes_atomic`).
* Checked: tfnet's container (:mod:`tfnet.container`) holds a SHA-256 of every array; a truncated
  or corrupt file is detected, skipped with a warning, and never loaded.
* Only the newest ``keep`` are kept.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optim.errors import CheckpointError, CheckpointWarning

__all__ = ["Checkpoint", "CheckpointManager", "CheckpointWarning", "CheckpointError"]

FORMAT = "tfnet-checkpoint-1"
_NAME = re.compile(r"^ckpt-(\d{9})\.npz$")




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
    """Writes and finds checkpoints in ``directory``.

    Args:
        directory: Where ``ckpt-<step>.npz`` files go (created if needed).
        keep: How many of the newest to keep. Default: 3.
    """

    def __init__(self, directory: str, keep: int = 3):
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"`keep_checkpoints` must be a positive integer. Received: {keep!r}")
        self.directory = directory
        self.keep = keep

    def path_for(self, step: int) -> str:
        return os.path.join(self.directory, f"ckpt-{step:09d}.npz")

    def save(self, ckpt: Checkpoint) -> str:
        from tfnet.container import ContainerError, pack
        from tfnet.graph_io import write_bytes_atomic

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
            "extra": ckpt.extra,
        }
        try:
            data = pack(FORMAT, header, arrays)
        except ContainerError as exc:
            raise CheckpointError(f"Checkpoint at step {ckpt.step}: {exc}") from None
        path = self.path_for(ckpt.step)
        write_bytes_atomic(path, data)
        self._prune()
        return path

    def all_steps(self) -> list[int]:
        steps = []
        for p in glob.glob(os.path.join(self.directory, "ckpt-*.npz")):
            m = _NAME.match(os.path.basename(p))
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def _prune(self) -> None:
        for step in self.all_steps()[: -self.keep]:
            try:
                os.unlink(self.path_for(step))
            except FileNotFoundError:
                pass

    @staticmethod
    def load(path: str) -> Checkpoint:
        """Loads and verifies one checkpoint.

        Raises:
            CheckpointError: the file is truncated, corrupt, or not a tfnet checkpoint.
        """
        from tfnet.container import ContainerError, unpack

        try:
            with open(path, "rb") as f:
                data = f.read()
            header, arrays = unpack(data, FORMAT, what=path)
        except OSError as exc:
            raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
        except ContainerError as exc:
            raise CheckpointError(str(exc)) from None
        names = header["weight_names"]
        weights = {name: arrays[f"w{i:05d}"] for i, name in enumerate(names)}
        state = [arrays[f"s{i:05d}"] for i in range(header["state_leaves"])]
        return Checkpoint(header["step"], header["epoch"], header["batch"], weights, state,
                          header.get("extra", {}), path)

    def latest_valid(self) -> Checkpoint | None:
        """The newest checkpoint that loads and verifies; corrupt ones are skipped with a warning."""
        for step in reversed(self.all_steps()):
            path = self.path_for(step)
            try:
                return self.load(path)
            except CheckpointError as exc:
                warnings.warn(f"Skipping checkpoint {exc}", CheckpointWarning, stacklevel=2)
        return None
