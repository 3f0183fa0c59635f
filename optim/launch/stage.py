"""What one distributed ``optimize()`` prepares once and every attempt of its stage shares, in both
modes (a classic session, a Spark Connect client). Driver side.

:class:`Stage` holds the prepared stage; :func:`rank_job` makes the ranks' job for one attempt
(:class:`optim.protocol.RankJob`); :class:`Cleanup` takes away what a call made, on every way out.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import numpy as np

from optim.carriers import Carrier
from optim.config import TrainConfig
from optim.data.base import Staged
from optim.launch.preflight import check_model_dir, probe_workers
from optim.protocol import Channels, Limits, RankJob, TrainSpec
from optim.sync import LocalSGD
from optim.training import comm_threads
from optim.training.notice import NOTICE_EVERY_S
from tfnet import storage
from tfnet.lora import carried_weight_names
from tfnet.quiet import noisy
from tfnet.serialize import hooks_to_bytes

__all__ = ["Cleanup", "Stage", "check_workers", "per_rank_batch", "rank_job", "result_bytes", "worker_config",
           "worker_log_level"]

log = logging.getLogger("tfnet.spark.driver")


@dataclass
class Stage:
    """What every attempt of the stage shares: the ranks (``n``), the data staged for them (``staged``: what the
    stage runs over, and what each rank gets), the shipped net (its carrier) and hooks, and the ranks' config (per-rank
    batch). ``exchange``: the folder the net and rank 0's result go through (None: the job and its rows);
    ``host`` and ``bind_host``: the driver's address (classic); ``chunk``: the size of rank 0's result pieces."""

    n: int
    staged: Staged
    net: Carrier
    hooks: bytes | None
    config: TrainConfig
    exchange: str | None = None
    host: str = ""
    bind_host: str = ""
    chunk: int = 0


class Cleanup:
    """What a call made and must take away on every way out: broadcasts, exchange folders, the
    progress channel. Each step runs once, in reverse order; one that fails does not stop the rest."""

    def __init__(self):
        self._steps: list = []

    def add(self, fn, *args) -> None:
        self._steps.append((fn, args))

    def broadcast(self, bc):
        """Registers a Spark broadcast (destroyed on the executors, its file removed here); returns it."""
        if bc is not None and hasattr(bc, "destroy"):
            self.add(destroy_broadcast, bc)
        return bc

    def run(self) -> None:
        while self._steps:
            fn, args = self._steps.pop()
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - clean-up goes on; the run's own error wins
                log.warning("Clean-up step %s failed: %s", getattr(fn, "__name__", fn), exc)


def destroy_broadcast(bc) -> None:
    """Destroys a broadcast on the executors and removes its file from the driver's disk."""
    import os

    path = getattr(bc, "_path", None)
    bc.destroy()
    if path and os.path.exists(path):
        os.unlink(path)


def per_rank_batch(dataset, config: TrainConfig, n: int) -> int:
    """Each rank's batch: the global batch split evenly over ``n`` ranks (a tf.data input batches
    itself on each rank: :attr:`~optim.data.base.DataAdapter.splits_batch`)."""
    if not dataset.splits_batch:
        return config.batch_size
    if config.batch_size % n:
        raise ValueError(
            f"`batch_size` is the global batch and must split evenly over the {n} workers. "
            f"Received: batch_size={config.batch_size}"
        )
    return config.batch_size // n


def worker_config(config: TrainConfig, per_rank: int) -> TrainConfig:
    """The ranks' copy of ``config``: the batch is the per-rank one."""
    out = copy.copy(config)
    out.batch_size = per_rank
    return out


def check_workers(target, n: int, timeout_s: float, config: TrainConfig) -> None:
    """``model_dir`` writable here (a marker file, removed after) and the workers' Python, and the
    marker readable there (:func:`~optim.launch.preflight.probe_workers`); ``target`` is a
    SparkContext or a Spark Connect session."""
    marker = check_model_dir(config.model_dir, config.storage_options) if config.model_dir else None
    try:
        probe_workers(target, n, timeout_s, (marker, config.storage_options) if marker else None)
    finally:
        if marker:
            storage.remove(marker, config.storage_options)


def shipped_hooks(net) -> bytes | None:
    """The net's hooks for the ranks (:func:`tfnet.serialize.hooks_to_bytes`).

    Raises:
        TypeError: a hook cannot be pickled.
    """
    try:
        return hooks_to_bytes(net)
    except Exception as exc:  # noqa: BLE001 - cloudpickle's many errors for a closure it cannot ship
        raise TypeError(f"The net's hooks cannot be sent to the Spark workers: {exc}") from None


def worker_log_level(verbose: int) -> int:
    """The ranks' log level: their warnings at the default verbosity, everything at 2+."""
    return logging.DEBUG if verbose >= 2 else logging.WARNING


def horovod_log_level(verbose: int, console: bool) -> str | None:
    """Horovod's own log level on the ranks (``HOROVOD_LOG_LEVEL``, read by its C++ core at the first line it
    logs in a process), or None for Horovod's default (``warning``).

    Where the ranks write to the user's console (``console``: a local master), ``fatal`` unless ``verbose >= 2`` or
    ``TFNET_VERBOSE``: when one rank's process ends first (Ctrl-C kills the ranks one by one; a killed worker), the
    others' Horovod logs the lost Gloo connection ("Horovod background loop uncaught exception: ... Connection reset
    by peer") beside the error or ``KeyboardInterrupt`` tfnet raises for the same event. On a cluster the ranks'
    stderr is the executors' log, where that line helps, and Horovod keeps its default. A ``HOROVOD_LOG_LEVEL`` in
    the executors' environment always wins (:func:`optim.training.horovod.horovod_env`)."""
    if not console or verbose >= 2 or noisy():
        return None
    return "fatal"


def rank_job(spec: TrainSpec, stage: Stage, attempt: int, channels: Channels, *, timeout: float,
             startup_timeout: float, steps_per_epoch: int | None, verbose: int, gang: bool = False,
             console: bool = False, notice_every_s: float = NOTICE_EVERY_S) -> RankJob:
    """The ranks' job for one attempt of ``stage`` (:class:`optim.protocol.RankJob`): ``spec`` (the driver's) with
    the stage's shipped net and hooks and its ranks' config; ``channels``: how the ranks meet and report (the
    backend's, for this attempt); ``console``: the ranks write to the user's console (:func:`horovod_log_level`)."""
    limits = Limits(timeout_s=timeout, startup_timeout_s=startup_timeout, steps_per_epoch=steps_per_epoch,
                    log_level=worker_log_level(verbose), horovod_threads=comm_threads.mode_from_env(),
                    horovod_log_level=horovod_log_level(verbose, console),
                    chunk_bytes=stage.chunk or (1 << 30), notice_every_s=notice_every_s)
    return RankJob(train=spec.for_ranks(stage.net, stage.hooks, stage.config), data=stage.staged.rank_data,
                   channels=channels, limits=limits, size=stage.n, attempt=attempt, gang=gang)


def result_bytes(spec: TrainSpec, config: TrainConfig) -> int:
    """What rank 0's result holds for ``spec`` (the driver's: its net, optimiser state and server state; or
    anything that has those, as a TFOptimizer) under ``config``: every weight (a net with adapters: those and the
    trainable ones), the optimiser state (its slots are sized like the trainable weights; estimated from the
    method's own state), and local SGD's server state."""
    net = spec.net
    variables = net.weight_variables
    weights = sum(int(variables[n].shape.num_elements() or 0) * variables[n].dtype.size
                  for n in carried_weight_names(net))
    trainable = sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in net.trainable_variables)
    state = sum(int(np.asarray(a).nbytes) for a in spec.state) if spec.state is not None else 2 * trainable
    server = 0
    if isinstance(config.sync, LocalSGD):
        carried = spec.exchange_state
        server = sum(int(np.asarray(a).nbytes) for a in carried) if carried else 2 * trainable
    return weights + state + server  # 2 x trainable: Adam's two slots, the largest of tfnet's methods'


def carried_bytes(dataset, validation, state) -> int:
    """About what the job carries besides the net: numpy data, numpy validation data, the optimiser
    (and the server method's) state."""
    total = dataset.carried_bytes() + (validation.carried_bytes() if validation is not None else 0)
    return total + sum(int(np.asarray(a).nbytes) for a in (state or []))
