"""What one distributed ``optimize()`` prepares once and every attempt of its stage shares, in both
modes (a classic session, a Spark Connect client). Driver side.

:class:`Stage` holds the prepared stage; :func:`rank_job` makes the ranks' job for one attempt;
:class:`Cleanup` takes away what a call made, on every way out; :class:`DistributedResult` is what the
call hands back to the optimiser.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

import numpy as np

from optim.spark.driver.preflight import check_model_dir, probe_workers
from optim.spark.worker.rank import RankJob, read_payload
from optim.sync import LocalSGD
from optim.training import comm_threads
from optim.training.config import TrainConfig
from optim.training.datasets import ArrayDataset, TFDataDataset, TFDataset
from tfnet import storage
from tfnet.lora import carried_weight_names
from tfnet.serialize import hooks_to_bytes

__all__ = ["Cleanup", "DistributedResult", "Stage", "check_workers", "per_rank_batch", "rank_job", "result_bytes",
           "result_from_payload", "shippable_validation", "validation_for_ranks", "worker_config", "worker_log_level"]

log = logging.getLogger("tfnet.spark.driver")


@dataclass
class DistributedResult:
    """What a distributed run hands back to the optimiser: rank 0's final weights, optimiser
    state and step, the history, and what the run measured."""

    weights: dict[str, np.ndarray]
    state: list[np.ndarray]
    step: int
    history: dict[str, list]
    run: dict = field(default_factory=dict)
    exchange_state: list = field(default_factory=list)  # the server method's state (local SGD)


@dataclass
class Stage:
    """What every attempt of the stage shares: the ranks (``n``), the data (one partition per rank,
    ``source``), how a rank reads it (``kind``, ``reader``, shipped ``data``), the validation data, the
    shipped net and hooks, and the ranks' config (per-rank batch). ``host`` and ``bind_host``: the
    driver's address (classic); ``chunk``: the size of rank 0's result pieces (Connect)."""

    n: int
    kind: str
    reader: object
    data: object
    source: object
    validation: object
    net: object
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


def per_rank_batch(dataset: TFDataset, config: TrainConfig, n: int) -> int:
    """Each rank's batch: the global batch split evenly over ``n`` ranks (a tf.data input batches
    itself on each rank)."""
    if isinstance(dataset, TFDataDataset):
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
    marker readable there (:func:`~optim.spark.driver.preflight.probe_workers`); ``target`` is a
    SparkContext or a Spark Connect session."""
    marker = check_model_dir(config.model_dir, config.storage_options) if config.model_dir else None
    try:
        probe_workers(target, n, timeout_s, (marker, config.storage_options) if marker else None)
    finally:
        if marker:
            storage.remove(marker, config.storage_options)


def validation_for_ranks(val: TFDataset | None):
    """Validation data the ranks read themselves: arrays, a tf.data input (each rank builds its
    shard), Parquet files (each rank reads its share), or an RDD's records (collected to the driver first). A DataFrame goes into the stage
    itself (:func:`optim.spark.datasets.with_validation`) instead."""
    from optim.spark.parquet import ParquetDataset

    if val is None or isinstance(val, (ArrayDataset, TFDataDataset, ParquetDataset)):
        return val
    to_local = getattr(val, "to_local", None)
    if to_local is not None:
        return to_local()
    raise TypeError(
        "Distributed validation data must be numpy arrays, a TFDataset (from_ndarrays, from_tf_data, from_dataframe, "
        f"from_rdd). Received: {type(val).__name__}"
    )


#: The most a ``tf.data.Dataset`` object given as distributed validation data may hold once collected to the
#: driver as arrays (a classic session; under Spark Connect the plan's limit): the arrays go to every rank.
VALIDATION_ARRAYS_LIMIT = 512 << 20


def shippable_validation(val, limit: int):
    """Validation data the ranks can get: a ``from_tf_data(fn)`` input goes with the job as it is; a
    ``tf.data.Dataset`` object (which cannot be pickled) is collected here to numpy arrays, when they
    hold at most ``limit`` bytes.

    Raises:
        TypeError: the collected arrays would exceed ``limit``; the message says how to use
            ``TFDataset.from_tf_data(fn)`` instead.
    """
    if not isinstance(val, TFDataDataset):
        return val
    import cloudpickle

    try:
        cloudpickle.dumps(val)
        return val
    except Exception:  # noqa: BLE001 - a tf.data.Dataset object cannot be pickled: collect it instead
        pass
    return _collected(val, limit)


def _collected(val: TFDataDataset, limit: int) -> ArrayDataset:
    import tensorflow as tf

    from optim.training.datasets import as_dataset

    parts, total = [], 0
    for element in val.dataset(0, 1).as_numpy_iterator():
        total += sum(int(np.asarray(a).nbytes) for a in tf.nest.flatten(element))
        if total > limit:
            raise TypeError(
                f"The tf.data.Dataset given as distributed validation_data holds more than {limit / 2**20:.0f} MiB, "
                "too much to collect to the driver and send to every rank. Give TFDataset.from_tf_data(fn) instead, "
                "with fn(rank, size) building each rank's shard of it (for example from files every host reads), or "
                "a DataFrame.")
        parts.append(element)
    if not parts:
        raise TypeError("The tf.data.Dataset given as distributed validation_data is empty.")
    joined = tf.nest.map_structure(lambda *xs: np.concatenate(xs, axis=0), *parts)
    return as_dataset(tuple(joined) if isinstance(joined, (tuple, list)) else joined)


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


def rank_job(opt, stage: Stage, attempt: int, *, timeout: float, startup_timeout: float,
             steps_per_epoch: int | None, verbose: int, **channels) -> RankJob:
    """The ranks' job for one attempt of ``stage``; ``channels`` say how the ranks meet and report
    (``rendezvous``, ``progress`` or ``progress_path``, and their keys)."""
    return RankJob(
        exchange=stage.exchange, net=stage.net, hooks=stage.hooks, loss=opt.loss, method=opt.method,
        metrics=opt.metrics, config=stage.config, size=stage.n, kind=stage.kind, reader=stage.reader,
        data=stage.data, validation=stage.validation, timeout_s=timeout, startup_timeout_s=startup_timeout,
        state=opt.state, start_step=opt.global_step, steps_per_epoch=steps_per_epoch, attempt=attempt,
        lr_source=getattr(opt, "_lr_source", None),
        log_level=worker_log_level(verbose), outputs=(opt.net.output_names, opt.net.output_specs),
        horovod_threads=comm_threads.mode_from_env(), exchange_state=opt.exchange_state or None,
        **channels,
    )


def result_from_payload(data: bytes) -> DistributedResult:
    """Rank 0's payload (:func:`optim.spark.worker.rank.read_payload`) as the optimiser takes it."""
    weights, state, meta = read_payload(data)
    run = {k: meta.get(k) for k in ("start_step", "resumed_from", "rows", "steps_per_epoch")}
    run["stopped"] = bool(meta.get("stopped", False))
    run["end_step"] = meta["step"]
    return DistributedResult(weights, state, meta["step"], meta["history"], run, meta["exchange_state"])


def result_bytes(opt, config: TrainConfig) -> int:
    """What rank 0's result holds: every weight (a net with adapters: those and the trainable ones), the
    optimiser state (its slots are sized like the trainable weights; estimated from the method's own
    state), and local SGD's server state."""
    variables = opt.net.weight_variables
    weights = sum(int(variables[n].shape.num_elements() or 0) * variables[n].dtype.size
                  for n in carried_weight_names(opt.net))
    trainable = sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in opt.net.trainable_variables)
    state = sum(int(np.asarray(a).nbytes) for a in opt.state) if opt.state is not None else 2 * trainable
    server = 0
    if isinstance(config.sync, LocalSGD):
        carried = opt.exchange_state
        server = sum(int(np.asarray(a).nbytes) for a in carried) if carried else 2 * trainable
    return weights + state + server  # 2 x trainable: Adam's two slots, the largest of tfnet's methods'


def carried_bytes(data, val, state) -> int:
    """About what the job carries besides the net: numpy data, numpy validation data, the optimiser
    (and the server method's) state."""
    total = 0
    for part in (data, val):
        if isinstance(part, ArrayDataset):
            total += sum(int(np.asarray(a).nbytes) for a in list(part.features) + list(part.labels or []))
    return total + sum(int(np.asarray(a).nbytes) for a in (state or []))
