"""The training loop for one worker.

It runs the same on one process and on every rank of a Spark barrier stage: everything that
differs is behind the :class:`~optim.training.collective.Collective` (gradient averaging, metric sums,
broadcasts, agreeing on the step count) and the reporter (a progress bar locally, messages to the
driver when distributed). Rank 0 alone writes checkpoints and TensorBoard events.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from optim import losses as L
from optim import metrics as M
from optim.errors import CheckpointError, NonFiniteLossError
from optim.training.checkpoint import Checkpoint, CheckpointManager
from optim.training.collective import Collective, LocalCollective
from optim.training.datasets import TFDataset
from optim.training.reporting import Reporter

__all__ = ["TrainConfig", "TrainOutcome", "train", "evaluate", "NonFiniteLossError"]

log = logging.getLogger("tfnet.training")


class TrainOutcome(NamedTuple):
    """What ``train`` returns: the history, the global step and the optimiser state (its leaves,
    as numpy arrays) to continue from."""

    history: dict
    step: int
    state: list



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
    resume: bool = False
    on_nonfinite: str = "raise"
    drop_remainder: bool = False
    validation_batch_size: int | None = None

    def check(self) -> None:
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={v!r}")
        for name in ("validate_every", "checkpoint_every", "validation_batch_size"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"`{name}` must be a positive integer or None. Received: {name}={v!r}")
        if self.on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"`on_nonfinite` must be 'raise' or 'skip'. Received: {self.on_nonfinite!r}")
        if self.resume and not self.model_dir:
            raise ValueError("`resume=True` needs a `model_dir` to find checkpoints in.")


def _checkpoint_dir(model_dir: str) -> str:
    return os.path.join(model_dir, "checkpoints")


def _first(outputs):
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def _check_labels(loss: L.Loss, labels, net, batch: int) -> None:
    if labels is None or isinstance(labels, (list, tuple)) or len(net.output_specs) != 1:
        return
    out = net.output_specs[0].shape
    if out.rank is None:
        return
    loss.check_shapes(tuple(np.shape(labels)), (batch,) + tuple(out.as_list()[1:]))


def _batch_len(features) -> int:
    return int(np.shape(features[0])[0]) if features else 0


class _Epoch:
    """Loss and metric accumulators for one epoch (mergeable across ranks)."""

    def __init__(self, metrics: Sequence[M.Metric]):
        self.loss = M.Mean()
        self.metrics = list(metrics)
        for m in self.metrics:
            m.reset()

    def states(self) -> list[np.ndarray]:
        return [self.loss.state] + [m.state for m in self.metrics]

    def load(self, states: Sequence) -> None:
        self.loss.state = np.asarray(states[0], np.float64)
        for m, s in zip(self.metrics, states[1:]):
            m.state = np.asarray(s, np.float64)

    def logs(self, prefix: str = "") -> dict[str, float]:
        out = {prefix + "loss": self.loss.result()}
        out.update({prefix + m.name: m.result() for m in self.metrics})
        return out

    def reduce(self, collective: Collective) -> None:
        flat = np.concatenate([s.ravel() for s in self.states()])
        total = collective.allreduce_sum(flat)
        out, i = [], 0
        for s in self.states():
            out.append(total[i:i + s.size].reshape(s.shape))
            i += s.size
        self.load(out)


def evaluate(net, loss: L.Loss, metrics: Sequence[M.Metric], data: TFDataset, batch_size: int,
             collective: Collective | None = None, prefix: str = "") -> dict[str, float]:
    """Loss and metrics over ``data`` (this rank's shard, summed over ranks)."""
    collective = collective or LocalCollective()
    acc = _Epoch(metrics)
    for features, labels in data.batches(batch_size, shuffle=False, rank=collective.rank, size=collective.size):
        n = _batch_len(features)
        if n == 0:
            continue
        outputs = net.forward(features, as_tensors=True)
        labels_t = tf.nest.map_structure(tf.convert_to_tensor, labels)
        acc.loss.update_value(float(loss(labels_t, outputs)), n)
        for m in acc.metrics:
            m.update(labels, _first(outputs))
    acc.reduce(collective)
    return acc.logs(prefix)


def train(
    net,
    loss,
    method,
    metrics: Sequence[M.Metric],
    data: TFDataset,
    config: TrainConfig,
    *,
    collective: Collective | None = None,
    reporter: Reporter | None = None,
    validation_data: TFDataset | None = None,
    steps_per_epoch: int | None = None,
    initial_state: Sequence[np.ndarray] | None = None,
    start_step: int = 0,
    lr_source=None,
    heartbeat: Callable[[], None] | None = None,
) -> TrainOutcome:
    """Trains ``net`` in place.

    Args:
        steps_per_epoch: Steps every rank takes each epoch. Default: as many batches as this rank's
            data holds (the distributed launcher passes the count the ranks agreed on).
        initial_state: The optimiser state's leaves to start from (what a previous call
            returned), as a Keras optimiser keeps its state across ``fit`` calls. Default: fresh
            state from the method's ``init``.
        start_step: The global step count to continue from. Default: 0.
        lr_source: What has ``learning_rate_at(step)`` for the logged learning rate. Default:
            ``method``.
        heartbeat: Called after every step on every rank (the distributed watchdog). Default: none.

    Returns:
        The history (per-epoch lists), the global step and the final optimiser state.
    """
    config.check()
    collective = collective or LocalCollective()
    reporter = reporter or Reporter()
    loss = L.get(loss)
    chief = collective.is_chief
    step_fn = net.train_step(loss, method, reducer=collective.reducer())
    # The step holds the optimiser state in variables and updates it in place; it starts from the
    # caller's state (the optimiser owns it between calls) or fresh.
    template = step_fn.state_spec()
    if initial_state is not None and _fits(initial_state, template):
        _load_state(step_fn, initial_state, template)
    else:
        if initial_state is not None:
            log.warning("The optimiser state from the previous optimize() call does not fit this one (another "
                        "method or trainable set); starting with fresh state.")
        step_fn.set_state(step_fn.init_state())
    manager = CheckpointManager(_checkpoint_dir(config.model_dir), config.keep_checkpoints) if config.model_dir else None

    # ---- start: fresh, or from the newest valid checkpoint; rank 0 is the source of state.
    start = {"step": start_step, "epoch": 0, "batch": 0, "history": {}, "epoch_states": None, "skipped": 0}
    ckpt = manager.latest_valid() if (config.resume and chief and manager) else None
    if ckpt is not None:
        start.update(step=ckpt.step, epoch=ckpt.epoch, batch=ckpt.batch,
                     history=ckpt.extra.get("history", {}), epoch_states=ckpt.extra.get("epoch_states"),
                     skipped=ckpt.extra.get("skipped", 0))
    start = collective.broadcast_object(start)
    if ckpt is not None:
        _check_checkpoint(ckpt, net, template)
        weights = [ckpt.weights[n] for n in net.weight_names]
        leaves = ckpt.state
    else:
        weights = list(net.get_weights().values())
        leaves = _state_arrays(step_fn)
    if collective.size > 1 or ckpt is not None:
        weights = collective.broadcast(weights)
        leaves = collective.broadcast(leaves)
        net.set_weights(dict(zip(net.weight_names, weights)))
        _load_state(step_fn, leaves, template)

    history: dict[str, list] = {k: list(v) for k, v in start["history"].items()}
    global_step, skipped = start["step"], start["skipped"]
    acc = _Epoch(metrics)
    fixed_steps = steps_per_epoch
    if steps_per_epoch is None:
        steps_per_epoch = data.num_batches(config.batch_size, rank=collective.rank, size=collective.size,
                                           drop_remainder=config.drop_remainder) if hasattr(data, "num_batches") else None
    reporter.begin(config.epochs, steps_per_epoch, global_step, start["epoch"])
    val_batch = config.validation_batch_size or config.batch_size
    checked = False

    def save_checkpoint(epoch: int, batch: int) -> None:
        if not (chief and manager):
            return
        extra = {
            "history": history,
            "epoch_states": [s.tolist() for s in acc.states()],
            "skipped": skipped,
            "seed": config.seed,
            "rng": {"shuffle": "numpy PCG64 seeded with [seed, epoch, rank]", "seed": config.seed, "epoch": epoch},
        }
        manager.save(Checkpoint(global_step, epoch, batch, net.get_weights(), _state_arrays(step_fn), extra))

    for epoch in range(start["epoch"], config.epochs):
        skip = start["batch"] if epoch == start["epoch"] else 0
        acc = _Epoch(metrics)
        if skip and start["epoch_states"]:
            acc.load(start["epoch_states"])
        t0, seen = time.perf_counter(), 0
        t_step, comm, busy = t0, 0.0, 0.0
        batches = data.batches(config.batch_size, epoch=epoch, seed=config.seed, shuffle=config.shuffle,
                               skip=skip, rank=collective.rank, size=collective.size,
                               drop_remainder=config.drop_remainder, steps=fixed_steps)
        b = skip
        for features, labels in batches:
            if steps_per_epoch is not None and b >= steps_per_epoch:
                break
            n = _batch_len(features)
            if not checked:
                _check_labels(loss, labels, net, n)
                checked = True
            result = step_fn.run(features, labels)
            b += 1
            global_step += 1
            now = time.perf_counter()
            step_time, t_step = now - t_step, now
            if heartbeat is not None:
                heartbeat()
            if not bool(result.finite):
                value = float(result.loss)
                what = f"the loss is {value}" if not math.isfinite(value) else \
                    f"a gradient is NaN or infinite (loss={value:.6g})"
                if config.on_nonfinite == "raise":
                    raise NonFiniteLossError(
                        f"Step {global_step} (epoch {epoch + 1}, batch {b}): {what}. The weights are left as "
                        f"they were after step {global_step - 1}. Pass on_nonfinite='skip' to skip such steps "
                        "instead."
                    )
                skipped += 1
                warnings.warn(f"Skipped step {global_step}: {what}.", RuntimeWarning, stacklevel=2)
                continue
            seen += n
            acc.loss.update_value(float(result.loss), n)
            for m in acc.metrics:
                m.update(labels, _first(result.outputs))
            if chief:
                logs = acc.logs()
                logs["learning_rate"] = _learning_rate(lr_source if lr_source is not None else method, global_step - 1)
                logs["samples_per_sec"] = seen * collective.size / max(time.perf_counter() - t0, 1e-9)
                logs["step_time"] = step_time
                if collective.size > 1:
                    seconds = float(result.reduce_seconds)
                    comm, busy = comm + seconds, busy + step_time
                    logs["allreduce_seconds"] = seconds
                    logs["allreduce_share"] = comm / max(busy, 1e-9)
                reporter.step(global_step, epoch, logs)
            if config.validate_every and validation_data is not None and global_step % config.validate_every == 0:
                reporter.validation(global_step, evaluate(net, loss, metrics_copy(metrics), validation_data,
                                                          val_batch, collective, prefix="val_"))
            if config.checkpoint_every and global_step % config.checkpoint_every == 0:
                save_checkpoint(epoch, b)

        acc.reduce(collective)
        logs = acc.logs()
        if validation_data is not None:
            val_logs = evaluate(net, loss, metrics_copy(metrics), validation_data, val_batch, collective, prefix="val_")
            reporter.validation(global_step, val_logs)
            logs.update(val_logs)
        for k, v in logs.items():
            history.setdefault(k, []).append(v)
        acc = _Epoch(metrics)  # a checkpoint at an epoch boundary holds fresh accumulators
        save_checkpoint(epoch + 1, 0)
        reporter.epoch_end(epoch, global_step, logs)
    reporter.end()
    if skipped:
        history["skipped_steps"] = [skipped]
    return TrainOutcome(history, global_step, _state_arrays(step_fn))


def metrics_copy(metrics: Sequence[M.Metric]) -> list[M.Metric]:
    """Fresh metrics of the same kinds (validation must not disturb the training accumulators)."""
    import copy

    out = []
    for m in metrics:
        c = copy.copy(m)
        c.reset()
        out.append(c)
    return out


def _state_arrays(step_fn) -> list[np.ndarray]:
    """Copies of the optimiser state's leaves (the variables keep changing in place)."""
    return [np.array(t, copy=True) for t in tf.nest.flatten(step_fn.get_state())]


def _fits(leaves: Sequence[np.ndarray], template) -> bool:
    flat = tf.nest.flatten(template)
    return len(leaves) == len(flat) and all(tuple(np.shape(a)) == tuple(t.shape) for a, t in zip(leaves, flat))


def _load_state(step_fn, leaves: Sequence[np.ndarray], template) -> None:
    step_fn.set_state(tf.nest.pack_sequence_as(
        template, [tf.constant(a, dtype=t.dtype) for a, t in zip(leaves, tf.nest.flatten(template))]
    ))


def _learning_rate(method, step: int) -> float:
    fn = getattr(method, "learning_rate_at", None)
    try:
        return float(fn(step)) if fn else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _check_checkpoint(ckpt: Checkpoint, net, template) -> None:
    missing = [n for n in net.weight_names if n not in ckpt.weights]
    if missing:
        raise CheckpointError(
            f"Checkpoint {ckpt.path} does not hold weights {missing[:5]} of this net; it was written for "
            "another model. Use another model_dir or resume=False."
        )
    leaves = tf.nest.flatten(template)
    if len(leaves) != len(ckpt.state) or any(
        tuple(np.shape(a)) != tuple(t.shape) for a, t in zip(ckpt.state, leaves)
    ):
        raise CheckpointError(
            f"Checkpoint {ckpt.path} holds optimiser state of another shape ({len(ckpt.state)} arrays, this "
            f"optimiser has {len(leaves)}); it was written with another optimiser or trainable set."
        )
