"""The training loop for one worker.

It runs the same on one process and on every rank of a Spark barrier stage: everything that differs is behind the
:class:`~optim.training.collective.Collective` (gradient averaging, metric sums, broadcasts, agreeing on the step
count) and the reporter (a progress bar locally, messages to the driver when distributed). Rank 0 alone writes
checkpoints and TensorBoard events.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from optim import losses as L
from optim import metrics as M
from optim.config import TrainConfig
from optim.data.base import DataAdapter as TFDataset
from optim.data.virtual_shards import epoch_batches
from optim.errors import CheckpointWarning, NonFiniteLossError
from optim.protocol import RunResult
from optim.training.callbacks import CallbackRun
from optim.training.checkpoint import Checkpoint, CheckpointManager, new_run_id
from optim.training.checks import check_batch_labels
from optim.training.collective import Collective, LocalCollective
from optim.training.evaluation import Accumulators, batch_len, evaluate, metrics_copy, update_metrics
from optim.training.exchange import make_exchange
from optim.training.liveness import Liveness
from optim.training.notice import StepNotice
from optim.training.reporting import EpochClock, Reporter
from optim.training.restore import (
    PEERS_KEY,
    check_state,
    final_weights,
    load_state,
    match_weights,
    moving_average_in,
    resumed_noise,
    saved_weights,
    split_exchange_state,
    state_arrays,
    state_digest,
)
from optim.training.start import Start, load_initial_state, previous_server_state, resume_checkpoint
from optim.training.weights import ClassWeights
from tfnet import kernels, storage
from tfnet.lora import carried_weight_names

__all__ = ["train"]

log = logging.getLogger("tfnet.training")


def _checkpoint_dir(model_dir: str) -> str:
    return storage.join(model_dir, "checkpoints")


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
    stop_check: Callable[[], bool] | None = None,
    callbacks: Sequence | None = None,
    notice_check: Callable[[], bool] | None = None,
    notice_every_s: float | None = None,
) -> RunResult:
    """Trains ``net`` in place.

    Args:
        steps_per_epoch: Steps every rank takes each epoch. Default: as many batches as this rank's
            data holds (the distributed launcher passes the count the ranks agreed on).
        initial_state: The optimiser state's leaves to start from (what a previous call
            returned), as a Keras optimiser keeps its state across ``fit`` calls. Default: fresh
            state from the method's ``init``.
        start_step: The global step count to continue from. Default: 0.
        lr_source: What has ``learning_rate_at(step)`` for the logged learning rate. Default: ``method``.
        liveness: Told of every step and validation batch, and of the long phases (the distributed
            watchdog). Default: none.
        initial_exchange_state: The server method's state (local SGD) that a previous call
            returned (``RunResult.exchange_state``); used when it fits this call's server
            method. A checkpoint resumed from has its own. Default: fresh.
        stop_check: Asked by rank 0 at every epoch boundary but the last, after that epoch's
            checkpoint; when it says True, every rank stops there (``RunResult.stopped``; the
            launcher then goes on with another number of ranks). Default: never.
        notice_check: Asked by rank 0 about once a second at step boundaries (:mod:`optim.training.notice`);
            when it says True (an executor holding a rank is being decommissioned), every rank checkpoints at
            that step and stops (``RunResult.stopped``). Default: never.
        notice_every_s: About how often ``notice_check`` is asked (seconds of training; 0: after every step).
            Default: :data:`~optim.training.notice.NOTICE_EVERY_S`.
        callbacks: Keras callbacks, called as ``model.fit`` calls them, on rank 0 (:mod:`optim.training.callbacks`);
            their decisions reach every rank. Default: ``config.callbacks``.

    Returns:
        The history (per-epoch lists), the global step and the final optimiser state.
    """
    config.check()
    kernels.self_check()  # once per process: a CPU whose convolution gradients are wrong stops here, typed
    alive = liveness or Liveness()
    collective = collective or LocalCollective()
    hooks, given = None, method  # the method as given (callbacks wrap it), for the weights training ends with
    callbacks = config.callbacks if callbacks is None else callbacks
    if callbacks:
        hooks = CallbackRun(list(callbacks), net, method, collective, config.epochs,
                            lr_source if lr_source is not None else method)
        method, lr_source = hooks.rate, hooks.rate
    with alive.phase("preparing the step and the start state"):
        run = _Run(net, L.get(loss), method, metrics, config, collective,
                   reporter or Reporter(), validation_data, lr_source if lr_source is not None else method, alive)
        run.callbacks, run.given = hooks, given
        start = run.start(initial_state, start_step, initial_exchange_state)
        run.notice = StepNotice(notice_check, run.collective, run.global_step, every_s=notice_every_s)
    steps = steps_per_epoch if steps_per_epoch is not None else run.batches_per_epoch(data)
    run.reporter.begin(config.epochs, steps, run.global_step, start.epoch)
    if hooks is not None:
        hooks.train_begin()
    try:
        for epoch in range(start.epoch, config.epochs):
            if run.done():
                break
            if hooks is not None:
                hooks.epoch_begin(epoch)
            skip, epoch_steps, fixed, shards = start.plan(epoch, run.collective.size, steps, steps_per_epoch)
            run.epoch(data, epoch, skip, start.epoch_states if skip else None, epoch_steps, fixed_steps=fixed,
                      shards=shards)
            if run.noticed:  # a decommission notice: a checkpoint at this step, and the launcher goes on without it
                run.save_checkpoint(epoch, run.batch)
                run.stopped = True
                break
            if (run.done() or run.callback_stop) and epoch_steps is not None and run.batch < epoch_steps:
                # max_steps (or a callback) stopped mid-epoch: the checkpoint says so, and a resume continues it
                run.save_checkpoint(epoch, run.batch)
                run.end_epoch(epoch, checkpoint=False)
                if run.callback_stop:
                    break
            else:
                run.end_epoch(epoch)
                if hooks is not None:
                    stop = hooks.epoch_end(epoch, run.global_step, run.last_logs())
                    for key, value in hooks.added.items():  # learning_rate from ReduceLROnPlateau, as in fit
                        run.history.setdefault(key, []).append(value)
                    if stop:
                        break
                if epoch + 1 < config.epochs and not run.done() and (run.stop_requested(stop_check) or
                                                                      run.notice_at_boundary()):
                    break
        run.settle()
        final_weights(run.net, given, run.step_fn.get_state)  # use_ema's average, as fit's end; before on_train_end
        if hooks is not None:
            hooks.train_end(run.last_logs())
    finally:
        run.exchange.close()
    run.reporter.end()
    return run.outcome()


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
        self.acc = Accumulators(metrics)
        self.checked = False
        self.epoch_sent_from = self.epoch_steps = 0  # the exchange's byte count at the epoch's start; its steps
        self.stopped = self.callback_stop = False  # a stop; one a callback asked for in the middle of an epoch
        self.callbacks: CallbackRun | None = None  # Keras callbacks, when given (train sets them)
        self.given = method  # the method as given, before callbacks wrap it (train sets it)
        self.notice = StepNotice(None, collective, 0)  # train() sets the run's own
        self.noticed = False  # the ranks stop at this step (a decommission notice): train() checkpoints here
        self.epoch_shards, self.epoch_steps_fixed = collective.size, None  # the open epoch's (checkpoints keep them)
        self.start_sha256: str | None = None  # a resumed run's start state (rank 0): state_digest
        self.skipped_checkpoints: list[str] = []  # why rank 0 passed over newer checkpoints (corrupt, truncated)
        self.saved: dict = {}  # what saved_weights keeps for the run (the base weights' fingerprint)

    # ---- set-up

    def start(self, initial_state: Sequence[np.ndarray] | None, start_step: int,
              initial_exchange_state: Sequence[np.ndarray] | None = None) -> Start:
        """Fresh, or from the newest valid checkpoint; rank 0 is the source of weights and state
        (the server method's included: a checkpoint's, or else the previous call's when it fits)."""
        load_initial_state(self.step_fn, self.template, initial_state)
        collective, net = self.collective, self.net
        ckpt = self._resume_checkpoint() if self.chief else None
        self.resumed_from = ckpt.path if ckpt is not None else None
        start = Start.of(ckpt) if ckpt is not None else Start(start_step)
        start = Start(**collective.broadcast_json(start._asdict()))
        server: list = []
        peers: list[list] = []
        if ckpt is not None:
            weights = match_weights(ckpt, net)
            ckpt, server, peers = split_exchange_state(ckpt)
            check_state(ckpt, net, self.template)
            leaves = ckpt.state
        else:
            weights, leaves = list(net.get_weights().values()), state_arrays(self.step_fn)
            if self.chief:
                server = previous_server_state(self.exchange, initial_exchange_state)
        if collective.size > 1 or ckpt is not None:
            # rank 0's server-method state too (the others hold arrays of its shapes to receive it)
            if collective.broadcast_json(bool(server)) and not self.chief:
                server = self.exchange.fresh_state()
            weights = collective.broadcast(weights)
            both = collective.broadcast(leaves + server)
            leaves, server = both[:len(leaves)], both[len(leaves):]
            net.set_weights(dict(zip(net.weight_names, weights)))
            load_state(self.step_fn, leaves, self.template)
            self._own_state(peers, leaves)
        if server:
            self.exchange.load_state(server)
        if ckpt is not None:  # what the run holds now, for a check against the checkpoint (rank 0's record)
            held = list(net.get_weights(carried_weight_names(net)).values())
            peer_leaves = [a for p in peers for a in p]  # the other ranks' own states, as loaded (local SGD)
            self.start_sha256 = state_digest(held + state_arrays(self.step_fn) + list(self.exchange.state()) + peer_leaves)
        self.exchange.start(self.step_fn)
        self.history = {k: list(v) for k, v in (start.history or {}).items()}
        self.global_step, self.start_step, self.skipped = start.step, start.step, start.skipped
        resumed_noise(net, start.step - start_step)  # the dropout noise of the steps the checkpoint took
        return start

    def _resume_checkpoint(self):
        """Rank 0's checkpoint to start from (:func:`~optim.training.start.resume_checkpoint`); the warnings for the
        newer ones it passed over (corrupt, truncated) are kept for the result (the driver repeats them) and given on."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ckpt = resume_checkpoint(self.manager, self.config, self.run_id)
        for w in caught:
            if issubclass(w.category, CheckpointWarning):
                self.skipped_checkpoints.append(str(w.message))
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return ckpt

    def _own_state(self, peers: list[list], leaves: list) -> None:
        """Local SGD, each rank with a worker-method state of its own: rank r takes back the one the checkpoint holds
        for rank r (rank 0's when it holds none: a checkpoint of fewer ranks)."""
        collective = self.collective
        if not (self.exchange.per_rank_state and collective.size > 1):
            return
        stored = int(collective.broadcast_json(len(peers)))
        for r in range(1, min(stored + 1, collective.size)):
            got = collective.broadcast(peers[r - 1] if self.chief else leaves, root=0)
            if collective.rank == r:
                load_state(self.step_fn, got, self.template)

    def _peer_states(self) -> list[list[np.ndarray]]:
        """Local SGD on several ranks: every other rank's worker-method state (rank 0 gets them, for its checkpoint;
        every rank takes part)."""
        collective = self.collective
        if not (self.exchange.per_rank_state and collective.size > 1):
            return []
        mine = state_arrays(self.step_fn)
        return [collective.broadcast(mine, root=r) for r in range(1, collective.size)]

    def batches_per_epoch(self, data: TFDataset) -> int | None:
        """This rank's batches per epoch, when the data knows it."""
        return data.num_batches(self.config.batch_size, rank=self.collective.rank, size=self.collective.size,
                                drop_remainder=self.config.drop_remainder)

    # ---- one epoch

    def epoch(self, data: TFDataset, epoch: int, skip: int, epoch_states: list | None, steps: int | None,
              fixed_steps: int | None, shards: int = 0) -> None:
        """Runs the steps of ``epoch`` from batch ``skip`` (a resumed epoch restores its accumulators); ``shards``:
        the ranks that began a resumed epoch, where they were more (:mod:`optim.data.virtual_shards`)."""
        config, collective = self.config, self.collective
        self.acc = Accumulators(self.metrics)
        if epoch_states:
            self.acc.load(epoch_states)
        self.epoch_shards, self.epoch_steps_fixed = shards or collective.size, fixed_steps
        clock = EpochClock.start()
        batches = epoch_batches(data, config.batch_size, epoch=epoch, seed=config.seed, shuffle=config.shuffle,
                                skip=skip, rank=collective.rank, size=collective.size, shards=shards,
                                drop_remainder=config.drop_remainder, steps=fixed_steps, training=True)
        b = skip
        weigh = ClassWeights(config.class_weight) if config.class_weight else None
        for features, labels in batches:
            if (steps is not None and b >= steps) or self.done():
                break
            if weigh is not None:
                labels = weigh(labels)
            n = batch_len(features)
            if not self.checked:
                check_batch_labels(self.loss, labels, self.net, n, self.metrics)
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
            else:
                self._record(result, labels, n, epoch, step_time, clock)
                self._every_n_steps(epoch, b)
            if self.callbacks is not None and self.callbacks.batch_hooks and self._batch_end(result, b):
                self.callback_stop = True
                break
            if (steps is None or b < steps) and self.notice.due(self.global_step):
                self.noticed = True
                break
        self.batch = b

    def _batch_end(self, result, batch: int) -> bool:
        """The callbacks' batch hooks after a step (a skipped one with its NaN loss); True to stop now."""
        loss = float(result.loss) if not bool(result.finite) else self.acc.logs().get("loss", float("nan"))
        return self.callbacks.batch_end(batch - 1, self.global_step, {"loss": loss})

    def last_logs(self) -> dict:
        """The newest entry of each history list: the logs of the epoch just ended."""
        return {k: v[-1] for k, v in self.history.items() if v}

    def stop_requested(self, stop_check: Callable[[], bool] | None) -> bool:
        """Rank 0 asks ``stop_check``; every rank gets its answer (all stop at the same boundary)."""
        if stop_check is None:
            return False
        self.stopped = bool(self.collective.broadcast_json(bool(stop_check()) if self.chief else False))
        return self.stopped

    def notice_at_boundary(self) -> bool:
        """The notice's question at an epoch boundary (every rank asks it at the same step)."""
        return self.stop_requested(self.notice.check)

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

    def _record(self, result, labels, n: int, epoch: int, step_time: float, clock: EpochClock) -> None:
        """Adds a good step to the epoch's loss and metrics; rank 0 reports it."""
        clock.seen += n
        self.acc.loss.update_value(float(result.loss), n)
        update_metrics(self.acc.metrics, labels, result.outputs)
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
        with moving_average_in(self.net, self.given if self.config.swap_ema else None, self.step_fn.get_state):
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
        self.acc = Accumulators(self.metrics)  # a checkpoint at an epoch boundary holds fresh accumulators
        if checkpoint:
            self.save_checkpoint(epoch + 1, 0)
        self.reporter.epoch_end(epoch, self.global_step, logs)

    def save_checkpoint(self, epoch: int, batch: int) -> None:
        """Rank 0 writes a checkpoint (with ``model_dir``): weights, optimiser state, counters, history. Every rank
        reports it first (what its steps trained: :mod:`optim.rank.tally`), then the ranks meet, so a checkpoint that
        exists was reported by every rank, whichever dies after; every rank waits for the write in a phase of the
        long bound (a slow write is not a dead rank)."""
        if self.manager is None:
            return
        self.settle()
        self.reporter.checkpoint(self.global_step, epoch, batch)
        with self.alive.phase("writing a checkpoint"):
            peers = self._peer_states()
            if self.collective.size > 1:
                self.collective.allreduce_sum(np.zeros(1))  # every rank has reported it
            if self.chief:
                self._write_checkpoint(epoch, batch, peers)
            if self.collective.size > 1:
                self.collective.allreduce_sum(np.zeros(1))  # the others wait here, not in the next step

    def _write_checkpoint(self, epoch: int, batch: int, peers: list[list[np.ndarray]]) -> None:
        seed = self.config.seed
        extra = {
            "history": self.history,
            "epoch_states": [s.tolist() for s in self.acc.states()],
            "skipped": self.skipped,
            "seed": seed,
            "rng": {"shuffle": "numpy PCG64 seeded with [seed, epoch, rank]", "seed": seed, "epoch": epoch},
            # the epoch's shards (the ranks that began it) and steps: a resume on fewer ranks takes the same rows
            "epoch_shards": self.epoch_shards, "epoch_steps": self.epoch_steps_fixed,
        }
        server = self.exchange.state()
        if server:  # the server method's state (local SGD) follows the worker method's
            extra["exchange_state"] = len(server)
        if peers:  # each rank's own worker-method state (local SGD) follows the server method's
            extra[PEERS_KEY] = len(peers)
        weights, base = saved_weights(self.net, self.saved)  # a net with adapters: those and the base's fingerprint
        extra.update(base)
        state = state_arrays(self.step_fn) + server + [a for p in peers for a in p]
        self.manager.save(Checkpoint(self.global_step, epoch, batch, weights, state, extra))

    def outcome(self) -> RunResult:
        if self.skipped:
            self.history["skipped_steps"] = [self.skipped]
        return RunResult(self.history, self.global_step, state_arrays(self.step_fn), self.start_step,
                         self.resumed_from, tuple(self.exchange.state()), self.stopped, start_sha256=self.start_sha256,
                         skipped_checkpoints=list(self.skipped_checkpoints))


def _learning_rate(method, step: int) -> float:
    fn = getattr(method, "learning_rate_at", None)
    try:
        return float(fn(step)) if fn else float("nan")
    except (TypeError, ValueError):
        return float("nan")


