"""The training loop for one worker.

It runs the same on one process and on every rank of a Spark barrier stage: everything that
differs is behind the :class:`~optim.training.collective.Collective` (gradient averaging, metric sums,
broadcasts, agreeing on the step count) and the reporter (a progress bar locally, messages to the
driver when distributed). Rank 0 alone writes checkpoints and TensorBoard events.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from optim import losses as L
from optim import metrics as M
from optim.errors import CheckpointError, CheckpointWarning, LabelShapeError, NonFiniteLossError
from optim.sync import check_sync
from optim.training.checkpoint import RUN_ID, Checkpoint, CheckpointManager, load_resume, new_run_id, resolve_resume
from optim.training.collective import Collective, LocalCollective
from optim.training.datasets import TFDataset
from optim.training.exchange import make_exchange
from optim.training.liveness import Liveness
from optim.training.reporting import Reporter
from tfnet import storage

__all__ = ["TrainConfig", "TrainOutcome", "accumulate", "evaluate", "logs_from_states", "train", "NonFiniteLossError"]

log = logging.getLogger("tfnet.training")


class TrainOutcome(NamedTuple):
    """What ``train`` returns: the history, the global step and the optimiser state (its leaves,
    as numpy arrays) to continue from."""

    history: dict
    step: int
    state: list
    start_step: int = 0
    resumed_from: str | None = None
    exchange_state: tuple = ()  # the server method's state (local SGD), to continue from in the next call



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


def _checkpoint_dir(model_dir: str) -> str:
    return storage.join(model_dir, "checkpoints")


def _first(outputs):
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def _check_labels(loss: L.Loss, labels, net, batch: int, metrics: Sequence[M.Metric] = ()) -> None:
    """Checks the labels against the outputs before the first step: their number (one array per
    output of a multi-output net) and, where the loss knows them, their shapes; sample weights,
    one per example, need a loss and metrics that can weight examples."""
    if isinstance(labels, L.SampleWeighted):
        if len(np.reshape(labels.weights, [-1])) != batch:
            raise LabelShapeError(f"Sample weights need one weight per example: {batch} in this batch. Received: "
                                  f"{len(np.reshape(labels.weights, [-1]))} weights")
        for m in metrics:
            if getattr(m, "weighted", False) and not m.supports_weights:
                raise TypeError(f"The metric {m.name!r} cannot weight examples (a function of a whole batch); give an "
                                "optim.metrics.Metric, or train without sample weights.")
        if isinstance(loss, L.FunctionLoss):
            raise TypeError(f"The loss {loss.name!r} cannot weight examples (a function of a whole batch); give an "
                            "optim.losses.Loss (a name such as 'mse'), or train without sample weights.")
        labels = labels.labels
    outs = net.output_specs
    shapes = [(batch,) + tuple(o.shape.as_list()[1:]) if o.shape.rank is not None else None for o in outs]
    if isinstance(loss, L.MultiOutputLoss):
        got = [tuple(np.shape(t)) for t in labels] if isinstance(labels, (list, tuple)) else [tuple(np.shape(labels))]
        loss.check_shapes(got, shapes)
        return
    if len(outs) != 1:
        return
    if isinstance(labels, (list, tuple)):
        if len(labels) != 1:
            raise LabelShapeError(f"The net has one output {net.output_names}; received {len(labels)} label arrays.")
        labels = labels[0]
    if labels is None or shapes[0] is None:
        return
    loss.check_shapes(tuple(np.shape(labels)), shapes[0])


def _update_metrics(metrics: Sequence[M.Metric], labels, outputs) -> None:
    """Updates each metric with the first output and its labels (the metrics follow the first
    output); the weighted metrics (``weighted_metrics``, as Keras's) by the sample weights when the
    data has them, the others unweighted, as Keras does."""
    weights = None
    if isinstance(labels, L.SampleWeighted):
        labels, weights = labels.labels, np.asarray(labels.weights)
    if isinstance(outputs, (list, tuple)) and isinstance(labels, (list, tuple)):
        labels = labels[0]
    out = _first(outputs)
    for m in metrics:
        if weights is None or not getattr(m, "weighted", False):
            m.update(labels, out)
        else:
            m.update(labels, out, sample_weight=weights)


def _training(data: TFDataset) -> dict:
    """``training=True`` for datasets that augment their training batches (ArrayDataset)."""
    return {"training": True} if getattr(data, "augment", None) is not None else {}


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


def accumulate(net, loss: L.Loss, metrics: Sequence[M.Metric], data: TFDataset, batch_size: int, *, rank: int = 0,
               size: int = 1, liveness: Liveness | None = None) -> _Epoch:
    """The loss and metric accumulators over this shard of ``data`` (sums: mergeable across
    ranks or partitions)."""
    alive = liveness or Liveness()
    acc = _Epoch(metrics)
    for features, labels in data.batches(batch_size, shuffle=False, rank=rank, size=size):
        n = _batch_len(features)
        if n == 0:
            continue
        outputs = net.forward(features, as_tensors=True)
        labels_t = tf.nest.map_structure(tf.convert_to_tensor, labels)
        acc.loss.update_value(float(loss(labels_t, outputs)), n)
        _update_metrics(acc.metrics, labels, outputs)
        alive.kick("validation")
    return acc


def evaluate(net, loss: L.Loss, metrics: Sequence[M.Metric], data: TFDataset, batch_size: int,
             collective: Collective | None = None, prefix: str = "", liveness: Liveness | None = None) -> dict[str, float]:
    """Loss and metrics over ``data`` (this rank's shard, summed over ranks)."""
    collective = collective or LocalCollective()
    alive = liveness or Liveness()
    acc = accumulate(net, loss, metrics, data, batch_size, rank=collective.rank, size=collective.size, liveness=alive)
    with alive.phase("waiting for the other ranks' validation"):
        acc.reduce(collective)
    return acc.logs(prefix)


def logs_from_states(metrics: Sequence[M.Metric], states: Sequence[np.ndarray], prefix: str = "") -> dict[str, float]:
    """``evaluate``'s result from accumulator states summed elsewhere (over Spark partitions)."""
    acc = _Epoch(metrics_copy(metrics))
    acc.load(states)
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
    liveness: Liveness | None = None,
    initial_exchange_state: Sequence[np.ndarray] | None = None,
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
        liveness: Told of every step and validation batch, and of the long phases (the distributed
            watchdog). Default: none.
        initial_exchange_state: The server method's state (local SGD) that a previous call
            returned (``TrainOutcome.exchange_state``); used when it fits this call's server
            method. A checkpoint resumed from has its own. Default: fresh.

    Returns:
        The history (per-epoch lists), the global step and the final optimiser state.
    """
    config.check()
    alive = liveness or Liveness()
    with alive.phase("preparing the step and the start state"):
        run = _Run(net, L.get(loss), method, metrics, config, collective or LocalCollective(),
                   reporter or Reporter(), validation_data, lr_source if lr_source is not None else method, alive)
        start = run.start(initial_state, start_step, initial_exchange_state)
    steps = steps_per_epoch if steps_per_epoch is not None else run.batches_per_epoch(data)
    run.reporter.begin(config.epochs, steps, run.global_step, start.epoch)
    try:
        for epoch in range(start.epoch, config.epochs):
            if run.done():
                break
            skip = start.batch if epoch == start.epoch else 0
            run.epoch(data, epoch, skip, start.epoch_states if skip else None, steps, fixed_steps=steps_per_epoch)
            if run.done() and steps is not None and run.batch < steps:
                # max_steps stopped mid-epoch: the checkpoint says so, and a resume continues this epoch
                run.save_checkpoint(epoch, run.batch)
                run.end_epoch(epoch, checkpoint=False)
            else:
                run.end_epoch(epoch)
        run.settle()
    finally:
        run.exchange.close()
    run.reporter.end()
    return run.outcome()


class _Start(NamedTuple):
    """Where training starts: the global step, epoch and batch, and what a checkpoint carried."""

    step: int
    epoch: int = 0
    batch: int = 0
    history: dict | None = None
    epoch_states: list | None = None
    skipped: int = 0


@dataclass
class _Clock:
    """Timing of one epoch: its start, the last step's end, samples seen, and (rank 0, several
    ranks) the seconds spent in allreduce against the seconds spent in steps."""

    t0: float
    t_step: float
    seen: int = 0
    comm: float = 0.0
    busy: float = 0.0

    @classmethod
    def start(cls) -> _Clock:
        now = time.perf_counter()
        return cls(now, now)

    def tick(self) -> float:
        """The seconds since the previous step ended (or the epoch started)."""
        now = time.perf_counter()
        step_time, self.t_step = now - self.t_step, now
        return step_time


class _Run:
    """One call of :func:`train`: the compiled step, the counters, the epoch's accumulators, and
    the steps of a run (start, one epoch, the end of an epoch, the outcome)."""

    def __init__(self, net, loss: L.Loss, method, metrics: Sequence[M.Metric], config: TrainConfig,
                 collective: Collective, reporter: Reporter, validation_data: TFDataset | None, lr_source,
                 liveness: Liveness):
        self.net, self.loss, self.metrics, self.config = net, loss, metrics, config
        self.collective, self.reporter, self.validation_data = collective, reporter, validation_data
        self.lr_source, self.alive = lr_source, liveness
        self.chief = collective.is_chief
        self.exchange = make_exchange(config.sync, net, collective)
        self.step_fn = net.train_step(loss, method, reducer=self.exchange.reducer(), precision=config.precision)
        self.template = self.step_fn.state_spec()
        self.run_id = config.run_id or new_run_id()
        self.manager = (CheckpointManager(_checkpoint_dir(config.model_dir), config.keep_checkpoints, self.run_id,
                                          config.storage_options) if config.model_dir else None)
        self.start_step = self.batch = 0
        self.resumed_from: str | None = None
        self.compiled = False
        self.val_batch = config.validation_batch_size or config.batch_size
        self.history: dict[str, list] = {}
        self.global_step = self.skipped = 0
        self.acc = _Epoch(metrics)
        self.checked = False
        self.epoch_sent_from = self.epoch_steps = 0  # the exchange's byte count at the epoch's start; its steps

    # ---- set-up

    def _load_initial_state(self, initial_state: Sequence[np.ndarray] | None) -> None:
        """The step holds the optimiser state in variables and updates it in place; it starts from
        the caller's state (the optimiser owns it between calls) or fresh."""
        if initial_state is not None and _fits(initial_state, self.template):
            _load_state(self.step_fn, initial_state, self.template)
            return
        if initial_state is not None:
            log.warning("The optimiser state from the previous optimize() call does not fit this one (another "
                        "method or trainable set); starting with fresh state.")
        self.step_fn.set_state(self.step_fn.init_state())

    def _previous_server_state(self, leaves: Sequence[np.ndarray] | None) -> list:
        """The previous call's server-method state when it fits this call's (the same arrays'
        shapes and dtypes), else none: a fresh start, with a warning when there was one that does not
        fit (another server method, or a net whose trainable set changed)."""
        if not leaves:
            return []
        fresh = self.exchange.fresh_state()
        if fresh and len(fresh) == len(leaves) and all(
                np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype for a, b in zip(fresh, leaves)):
            return [np.asarray(a) for a in leaves]
        if fresh:
            log.warning("The server method's state from the previous optimize() call does not fit this one; "
                        "starting it fresh.")
        return []

    def start(self, initial_state: Sequence[np.ndarray] | None, start_step: int,
              initial_exchange_state: Sequence[np.ndarray] | None = None) -> _Start:
        """Fresh, or from the newest valid checkpoint; rank 0 is the source of weights and state
        (the server method's included: a checkpoint's, or else the previous call's when it fits)."""
        self._load_initial_state(initial_state)
        collective, net = self.collective, self.net
        ckpt = self._resume_checkpoint() if self.chief else None
        start = _Start(start_step)
        if ckpt is not None:
            start = _Start(ckpt.step, ckpt.epoch, ckpt.batch, ckpt.extra.get("history", {}),
                           ckpt.extra.get("epoch_states"), ckpt.extra.get("skipped", 0))
        start = _Start(**collective.broadcast_json(start._asdict()))
        server: list = []
        if ckpt is not None:
            weights = _match_weights(ckpt, net)
            ckpt, server = _split_exchange_state(ckpt)
            _check_checkpoint(ckpt, net, self.template)
            leaves = ckpt.state
        else:
            weights, leaves = list(net.get_weights().values()), _state_arrays(self.step_fn)
            if self.chief:
                server = self._previous_server_state(initial_exchange_state)
        if collective.size > 1 or ckpt is not None:
            # rank 0's server-method state too (the others hold arrays of its shapes to receive it)
            if collective.broadcast_json(bool(server)) and not self.chief:
                server = self.exchange.fresh_state()
            weights = collective.broadcast(weights)
            both = collective.broadcast(leaves + server)
            leaves, server = both[:len(leaves)], both[len(leaves):]
            net.set_weights(dict(zip(net.weight_names, weights)))
            _load_state(self.step_fn, leaves, self.template)
        if server:
            self.exchange.load_state(server)
        self.exchange.start(self.step_fn)
        self.history = {k: list(v) for k, v in (start.history or {}).items()}
        self.global_step, self.skipped = start.step, start.skipped
        self.start_step = start.step
        return start

    def _resume_checkpoint(self) -> Checkpoint | None:
        """The checkpoint to start from (rank 0): this run's own newest (a retried stage), else
        what ``resume`` names (:func:`~optim.training.checkpoint.resolve_resume`)."""
        if self.manager is None:
            if self.config.resume not in (False, None) and not isinstance(self.config.resume, bool):
                ckpt = load_resume("", self.config.resume, storage_options=self.config.storage_options)
                self.resumed_from = ckpt.path if ckpt else None
                return ckpt
            return None
        options = self.config.storage_options
        source, why = resolve_resume(self.manager.root, self.config.resume, self.run_id, options)
        ckpt = load_resume(self.manager.root, source, self.config.keep_checkpoints, options)
        if ckpt is not None:
            self.resumed_from = ckpt.path
            log.info("Run %s resumes from %s: %s (step %d).", self.run_id, why, ckpt.path, ckpt.step)
        elif source is not None:
            log.warning("Run %s found no valid checkpoint in %s; it starts afresh.", self.run_id, why)
        return ckpt

    def batches_per_epoch(self, data: TFDataset) -> int | None:
        """This rank's batches per epoch, when the data knows it."""
        if not hasattr(data, "num_batches"):
            return None
        return data.num_batches(self.config.batch_size, rank=self.collective.rank, size=self.collective.size,
                                drop_remainder=self.config.drop_remainder)

    # ---- one epoch

    def epoch(self, data: TFDataset, epoch: int, skip: int, epoch_states: list | None, steps: int | None,
              fixed_steps: int | None) -> None:
        """Runs the steps of ``epoch`` from batch ``skip`` (a resumed epoch restores its accumulators)."""
        config, collective = self.config, self.collective
        self.acc = _Epoch(self.metrics)
        if epoch_states:
            self.acc.load(epoch_states)
        clock = _Clock.start()
        batches = data.batches(config.batch_size, epoch=epoch, seed=config.seed, shuffle=config.shuffle,
                               skip=skip, rank=collective.rank, size=collective.size,
                               drop_remainder=config.drop_remainder, steps=fixed_steps, **_training(data))
        b = skip
        for features, labels in batches:
            if (steps is not None and b >= steps) or self.done():
                break
            n = _batch_len(features)
            if not self.checked:
                _check_labels(self.loss, labels, self.net, n, self.metrics)
                self.checked = True
            if self.compiled:
                result = self.exchange.step(self.step_fn, features, labels)
            else:  # the first step compiles: a phase of its own, with the long bound
                with self.alive.phase("compiling the first step"):
                    result = self.exchange.step(self.step_fn, features, labels)
                self.compiled = True
            self.epoch_steps += 1
            b += 1
            self.global_step += 1
            step_time = clock.tick()
            self.alive.kick("training")
            if not bool(result.finite):
                self._nonfinite(result, epoch, b)
                continue
            self._record(result, labels, n, epoch, step_time, clock)
            self._every_n_steps(epoch, b)
        self.batch = b

    def done(self) -> bool:
        """True once the global step has reached ``max_steps`` (every rank agrees: equal steps)."""
        return self.config.max_steps is not None and self.global_step >= self.config.max_steps

    def _nonfinite(self, result, epoch: int, batch: int) -> None:
        """A step whose loss or gradients are not finite: raise, or count it as skipped."""
        value = float(result.loss)
        what = f"the loss is {value}" if not math.isfinite(value) else \
            f"a gradient is NaN or infinite (loss={value:.6g})"
        if self.config.on_nonfinite == "raise":
            raise NonFiniteLossError(
                f"Step {self.global_step} (epoch {epoch + 1}, batch {batch}): {what}. The weights are left as "
                f"they were after step {self.global_step - 1}. Pass on_nonfinite='skip' to skip such steps "
                "instead."
            )
        self.skipped += 1
        # stacklevel 4: the warning points at train()'s caller (through epoch() and train()).
        warnings.warn(f"Skipped step {self.global_step}: {what}.", RuntimeWarning, stacklevel=4)

    def _record(self, result, labels, n: int, epoch: int, step_time: float, clock: _Clock) -> None:
        """Adds a good step to the epoch's loss and metrics; rank 0 reports it."""
        clock.seen += n
        self.acc.loss.update_value(float(result.loss), n)
        _update_metrics(self.acc.metrics, labels, result.outputs)
        if not self.chief:
            return
        size = self.collective.size
        logs = self.acc.logs()
        logs["learning_rate"] = _learning_rate(self.lr_source, self.global_step - 1)
        logs["samples_per_sec"] = clock.seen * size / max(time.perf_counter() - clock.t0, 1e-9)
        logs["step_time"] = step_time
        if size > 1:
            seconds = float(result.reduce_seconds)
            clock.comm, clock.busy = clock.comm + seconds, clock.busy + step_time
            logs["allreduce_seconds"] = seconds
            logs["allreduce_share"] = clock.comm / max(clock.busy, 1e-9)
            logs["bytes_per_step"] = self._bytes_per_step()
        self.reporter.step(self.global_step, epoch, logs)

    def _every_n_steps(self, epoch: int, batch: int) -> None:
        """Validation every ``validate_every`` steps, a checkpoint every ``checkpoint_every``."""
        config, step = self.config, self.global_step
        if config.validate_every and self.validation_data is not None and step % config.validate_every == 0:
            self.reporter.validation(step, self._validate())
        if config.checkpoint_every and step % config.checkpoint_every == 0:
            self.save_checkpoint(epoch, batch)

    # ---- the end of an epoch, and of the run

    def settle(self) -> None:
        """Every rank holds the same weights from here (the exchange sends what is pending)."""
        with self.alive.phase("exchanging before a checkpoint, a validation or the end"):
            self.exchange.settle(self.step_fn)

    def _bytes_per_step(self) -> float:
        """The bytes this rank has sent in this epoch (exchanges at settling included), per step."""
        return (self.exchange.bytes_sent - self.epoch_sent_from) / max(self.epoch_steps, 1)

    def _validate(self) -> dict[str, float]:
        self.settle()
        return evaluate(self.net, self.loss, metrics_copy(self.metrics), self.validation_data, self.val_batch,
                        self.collective, prefix="val_", liveness=self.alive)

    def end_epoch(self, epoch: int, checkpoint: bool = True) -> None:
        """Sums the epoch's loss and metrics over the ranks, validates, extends the history, writes
        the epoch-boundary checkpoint and reports the epoch."""
        self.settle()
        self.acc.reduce(self.collective)
        logs = self.acc.logs()
        if self.collective.size > 1:
            logs["bytes_per_step"] = self._bytes_per_step()
        self.epoch_sent_from, self.epoch_steps = self.exchange.bytes_sent, 0
        if self.validation_data is not None:
            val_logs = self._validate()
            self.reporter.validation(self.global_step, val_logs)
            logs.update(val_logs)
        for k, v in logs.items():
            self.history.setdefault(k, []).append(v)
        self.acc = _Epoch(self.metrics)  # a checkpoint at an epoch boundary holds fresh accumulators
        if checkpoint:
            self.save_checkpoint(epoch + 1, 0)
        self.reporter.epoch_end(epoch, self.global_step, logs)

    def save_checkpoint(self, epoch: int, batch: int) -> None:
        """Rank 0 writes a checkpoint (with ``model_dir``): weights, optimiser state, counters, history.
        Every rank waits for the write in a phase of the long bound (a slow write is not a dead rank)."""
        if self.manager is None:
            return
        self.settle()
        with self.alive.phase("writing a checkpoint"):
            if self.chief:
                self._write_checkpoint(epoch, batch)
            if self.collective.size > 1:
                self.collective.allreduce_sum(np.zeros(1))  # the others wait here, not in the next step

    def _write_checkpoint(self, epoch: int, batch: int) -> None:
        seed = self.config.seed
        extra = {
            "history": self.history,
            "epoch_states": [s.tolist() for s in self.acc.states()],
            "skipped": self.skipped,
            "seed": seed,
            "rng": {"shuffle": "numpy PCG64 seeded with [seed, epoch, rank]", "seed": seed, "epoch": epoch},
        }
        server = self.exchange.state()
        if server:  # the server method's state (local SGD) follows the worker method's
            extra["exchange_state"] = len(server)
        self.manager.save(Checkpoint(self.global_step, epoch, batch, self.net.get_weights(),
                                     _state_arrays(self.step_fn) + server, extra))

    def outcome(self) -> TrainOutcome:
        if self.skipped:
            self.history["skipped_steps"] = [self.skipped]
        return TrainOutcome(self.history, self.global_step, _state_arrays(self.step_fn), self.start_step,
                            self.resumed_from, tuple(self.exchange.state()))


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


def _match_weights(ckpt: Checkpoint, net) -> list[np.ndarray]:
    """The checkpoint's weights in the net's order: by name, or, when the names differ (a Keras
    model rebuilt in the same process is named ``sequential_5/...`` instead of ``sequential_4/...``),
    by order and shape, as Keras's ``load_weights`` matches, with a warning that says so.

    Raises:
        CheckpointError: neither the names nor the structure (count, order and shapes) match.
    """
    names = net.weight_names
    if all(n in ckpt.weights for n in names):
        return [ckpt.weights[n] for n in names]
    theirs = list(ckpt.weights)
    shapes = [tuple(v.shape) for v in net.weight_variables.values()]
    if len(theirs) == len(names) and all(tuple(np.shape(ckpt.weights[t])) == s for t, s in zip(theirs, shapes)):
        renamed = [(t, n) for t, n in zip(theirs, names) if t != n]
        warnings.warn(
            f"Checkpoint {ckpt.path} names {len(renamed)} of its {len(names)} weights differently from this net "
            f"(e.g. {renamed[0][0]!r} for {renamed[0][1]!r}); they were matched by order and shape, as Keras's "
            "load_weights does.", CheckpointWarning, stacklevel=4)
        return [ckpt.weights[t] for t in theirs]
    missing = [n for n in names if n not in ckpt.weights]
    raise CheckpointError(
        f"Checkpoint {ckpt.path} does not hold weights {missing[:5]} of this net, and its structure differs too "
        f"({len(theirs)} weights, this net has {len(names)}; or their shapes differ); it was written for another "
        "model. Use another model_dir or resume=False."
    )


def _split_exchange_state(ckpt: Checkpoint) -> tuple[Checkpoint, list]:
    """The checkpoint with the worker method's state only, and the server method's state that
    follows it (local SGD; ``extra["exchange_state"]`` arrays)."""
    n = int(ckpt.extra.get("exchange_state", 0))
    if not n:
        return ckpt, []
    import dataclasses

    return dataclasses.replace(ckpt, state=ckpt.state[:-n]), list(ckpt.state[-n:])


def _check_checkpoint(ckpt: Checkpoint, net, template) -> None:
    leaves = tf.nest.flatten(template)
    if len(leaves) != len(ckpt.state) or any(
        tuple(np.shape(a)) != tuple(t.shape) for a, t in zip(ckpt.state, leaves)
    ):
        raise CheckpointError(
            f"Checkpoint {ckpt.path} holds optimiser state of another shape ({len(ckpt.state)} arrays, this "
            f"optimiser has {len(leaves)}); it was written with another optimiser or trainable set."
        )
