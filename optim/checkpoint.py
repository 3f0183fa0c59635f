"""Checkpoints: weights, optimiser state, step, epoch and RNG state in one ``.npz`` file.

* Not a pickle: arrays and a JSON header only, read with ``allow_pickle=False``, so loading one
  cannot run code.
* Written atomically: a temporary file in the same folder, fsync, then a rename.
* Checked: the header holds a SHA-256 of every array; a truncated or corrupt file is detected,
  skipped with a warning, and never loaded.
* Only the newest ``keep`` are kept.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfnet.errors import TFNetError

__all__ = ["Checkpoint", "CheckpointManager", "CheckpointWarning", "CheckpointError"]

FORMAT = "tfnet-checkpoint-1"
_NAME = re.compile(r"^ckpt-(\d{9})\.npz$")


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped because it is truncated or corrupt."""


class CheckpointError(TFNetError, ValueError):
    """A checkpoint does not match the model or optimiser it is loaded into."""


@dataclass
class Checkpoint:
    step: int
    epoch: int
    batch: int
    weights: dict[str, np.ndarray]
    state: list[np.ndarray]
    extra: dict[str, Any] = field(default_factory=dict)
    path: str | None = None


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode())
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


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
        arrays: dict[str, np.ndarray] = {}
        for i, name in enumerate(ckpt.weights):
            arrays[f"w{i:05d}"] = np.asarray(ckpt.weights[name])
        for i, leaf in enumerate(ckpt.state):
            arrays[f"s{i:05d}"] = np.asarray(leaf)
        for key, a in arrays.items():
            if a.dtype == object:
                raise CheckpointError(f"Checkpoint array {key} has dtype object; only numeric arrays are stored.")
        header = {
            "format": FORMAT,
            "step": int(ckpt.step),
            "epoch": int(ckpt.epoch),
            "batch": int(ckpt.batch),
            "weight_names": list(ckpt.weights),
            "state_leaves": len(ckpt.state),
            "extra": ckpt.extra,
            "sha256": _digest(arrays),
        }
        arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
        os.makedirs(self.directory, exist_ok=True)
        path = self.path_for(ckpt.step)
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
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
        try:
            with open(path, "rb") as f:
                data = f.read()
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            header = json.loads(bytes(arrays.pop("header")).decode("utf-8"))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
        if header.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a tfnet checkpoint (format {header.get('format')!r}).")
        if _digest(arrays) != header.get("sha256"):
            raise CheckpointError(f"{path}: checksum mismatch; the file is corrupt.")
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
