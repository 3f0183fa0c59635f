"""Checks that a wrong elastic implementation fails (issue 42), read from what a run leaves in ``model_dir``:

* :func:`checkpoint_digest`: the SHA-256 of a checkpoint's weights and state, computed here from the file alone, for
  ``attempt_log[i]["start_sha256"]`` (what the attempt held when it started): equal exactly when the attempt started
  from that checkpoint bit for bit, weights and optimiser state (not from fresh weights, nor without its moments);
* :func:`full_epochs`: from the ranks' ``epochs-a<attempt>-r<rank>.json`` (:mod:`optim.rank.tally`), the rows
  and the fingerprint of every epoch an attempt's ranks trained whole; :func:`data_fingerprint` is the data's own;
  equal exactly when the epoch took every row once (a shrink that dropped the lost rank's rows takes the survivor's
  rows twice: the same count, another fingerprint);
* :func:`same_checkpoints`: two runs' checkpoints of the same steps, equal bit for bit (step for step).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os

import numpy as np

from optim.rank.tally import fingerprint
from optim.training.checkpoint import CheckpointManager

_MOD = 1 << 64


def checkpoint_digest(path: str, storage_options=None) -> str:
    """SHA-256 over the checkpoint's weights in order, then its state (the worker method's, then the server
    method's): each array's dtype, shape and bytes."""
    ckpt = CheckpointManager.load(path, storage_options)
    h = hashlib.sha256()
    for a in [*ckpt.weights.values(), *ckpt.state]:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def epoch_infos(model_dir: str) -> list[dict]:
    """Every rank's tally file (``ranks/<run id>/epochs-a<attempt>-r<rank>.json``) under ``model_dir`` that reads."""
    out = []
    for path in glob.glob(os.path.join(model_dir, "ranks", "*", "epochs-a*-r*.json")):
        try:
            out.append(json.load(open(path)))
        except (OSError, ValueError):
            pass
    return out


def data_fingerprint(features, labels) -> tuple[int, int]:
    """``(rows, fingerprint)`` of the whole data, as the ranks read it."""
    return fingerprint(features, labels)


def full_epochs(infos: list[dict], steps_per_epoch: int) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(attempt, epoch): (rows, fingerprint)}`` summed over the attempt's ranks, for every epoch that each of the
    attempt's ``size`` ranks trained from its first batch to its last."""
    by_attempt: dict[int, list[dict]] = {}
    for info in infos:
        by_attempt.setdefault(int(info["attempt"]), []).append(info)
    out = {}
    for attempt, ranks in by_attempt.items():
        if len(ranks) != ranks[0]["size"]:
            continue  # a rank that never wrote (killed in its first epoch): no epoch of this attempt is whole
        epochs = set.intersection(*(set(r["epochs"]) for r in ranks))
        for e in sorted(epochs, key=int):
            parts = [r["epochs"][e] for r in ranks]
            if all(p["from_batch"] == 0 and p["batches"] == steps_per_epoch for p in parts):
                out[(attempt, int(e))] = (sum(p["rows"] for p in parts),
                                          sum(int(p["fingerprint"]) for p in parts) % _MOD)
    return out


def epoch_done(info: dict, epoch: int, steps_per_epoch: int) -> bool:
    """Whether a rank's tally (``info``) holds ``epoch`` trained to its last batch: the rank is past that epoch's
    boundary (a tally written at a checkpoint inside the epoch holds it only in part)."""
    record = info["epochs"].get(str(epoch))
    return record is not None and int(record["from_batch"]) + int(record["batches"]) >= steps_per_epoch


def same_checkpoints(ours: dict[int, str], theirs: dict[int, str], from_step: int, storage_options=None) -> list[int]:
    """The steps after ``from_step`` both runs checkpointed (``{step: path}`` each), having checked that each pair
    holds the same weights and state bit for bit; AssertionError naming the first step that differs."""
    steps = sorted(s for s in set(ours) & set(theirs) if s > from_step)
    for step in steps:
        a, b = (CheckpointManager.load(p, storage_options) for p in (ours[step], theirs[step]))
        assert list(a.weights) == list(b.weights), step
        for name in a.weights:
            assert np.array_equal(a.weights[name], b.weights[name]), (step, name)
        assert len(a.state) == len(b.state), step
        for i, (x, y) in enumerate(zip(a.state, b.state)):
            assert np.array_equal(x, y), (step, f"state leaf {i}")
    return steps


def _sum(parts) -> tuple[int, int]:
    return sum(int(p["rows"]) for p in parts), sum(int(p["fingerprint"]) for p in parts) % _MOD


def _before(by_attempt: dict[int, list[dict]], attempt: int, epoch: int, batch: int) -> tuple[int, int]:
    """``(rows, fingerprint)`` of the first ``batch`` batches of ``epoch`` as the run kept them: from the newest attempt
    before ``attempt`` whose every rank recorded a checkpoint at that epoch and batch (the one a resume took), and
    from the attempts that one resumed from in turn."""
    for a in sorted((a for a in by_attempt if a < attempt), reverse=True):
        marks = [[c for c in r.get("checkpoints", {}).values() if (c["epoch"], c["batch"]) == (epoch, batch)]
                 for r in by_attempt[a]]
        if all(marks):
            parts = [m[0] for m in marks]
            rows, fp = _sum(parts)
            start = {int(p["from_batch"]) for p in parts}
            assert len(start) == 1, (a, epoch, start)
            if start.pop() > 0:
                more = _before(by_attempt, a, epoch, int(parts[0]["from_batch"]))
                rows, fp = rows + more[0], (fp + more[1]) % _MOD
            return rows, fp
    raise AssertionError(f"no attempt before {attempt} recorded epoch {epoch}'s first {batch} batches at a checkpoint")


def stitched_epochs(infos: list[dict], steps_per_epoch: int) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(attempt, epoch): (rows, fingerprint)}`` for every epoch an attempt's ranks trained to its last batch, the
    epoch a resume interrupted included: an epoch the attempt resumed at batch ``b`` adds the rows the attempt it
    resumed from trained before its checkpoint at ``b`` (each rank's ``checkpoints`` record, written as the checkpoint
    was), and so on back. Equal to :func:`data_fingerprint` exactly when every row was trained once in the epoch, the
    rows after the checkpoint that a failed attempt trained and lost not counted."""
    by_attempt: dict[int, list[dict]] = {}
    for info in infos:
        by_attempt.setdefault(int(info["attempt"]), []).append(info)
    by_attempt = {a: ranks for a, ranks in by_attempt.items() if len(ranks) == ranks[0]["size"]}
    out = {}
    for attempt, ranks in by_attempt.items():
        for e in sorted(set.intersection(*(set(r["epochs"]) for r in ranks)), key=int):
            parts = [r["epochs"][e] for r in ranks]
            start = {int(p["from_batch"]) for p in parts}
            if start == {steps_per_epoch}:
                continue  # resumed from a checkpoint after the epoch's last batch: this attempt trained none of it
            if len(start) != 1 or any(int(p["from_batch"]) + p["batches"] != steps_per_epoch for p in parts):
                continue  # not trained to its end in this attempt
            rows, fp = _sum(parts)
            if start.pop() > 0:
                more = _before(by_attempt, attempt, int(e), int(parts[0]["from_batch"]))
                rows, fp = rows + more[0], (fp + more[1]) % _MOD
            out[(attempt, int(e))] = (rows, fp)
    return out
