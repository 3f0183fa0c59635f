"""What every task of the training barrier stage runs: one Horovod rank. Worker side.

A rank reads its partition into arrays, agrees with the other ranks on the number of steps per
epoch (through Spark's barrier ``allGather``, before Horovod starts), joins the Horovod ring over
Gloo through the driver's rendezvous server, and runs the same training loop as a local run. Rank 0
sends progress to the driver, writes checkpoints and TensorBoard events, and returns the final
weights, optimiser state and history.
"""

from __future__ import annotations

import io
import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfnet.errors import TFNetError


class StageRetryError(TFNetError, RuntimeError):
    """Spark resubmitted the barrier stage by itself; tfnet retries from the driver instead."""


@dataclass
class RankJob:
    """Everything a rank needs, built on the driver (picklable)."""

    net: Any  # tfnet.serialize.net_to_bytes(net): a path in ``exchange``, or a Spark broadcast
    hooks: bytes | None
    loss: Any
    method: Any
    metrics: list
    config: Any  # optim.loop.TrainConfig (batch_size is per rank)
    size: int
    kind: str  # "arrow", "records", "arrays" or "tf_data"
    reader: Callable | None = None  # arrow/records shard reader
    data: Any = None  # broadcast ArrayDataset for "arrays", a TFDataDataset for "tf_data"
    validation: Any = None  # broadcast ArrayDataset or None
    rendezvous: tuple[str, int] = ("127.0.0.1", 0)
    progress: tuple[str, int] | None = None
    timeout_s: float = 300.0
    startup_timeout_s: float = 600.0
    state: list | None = None  # optimiser state leaves to continue from
    start_step: int = 0
    steps_per_epoch: int | None = None
    attempt: int = 0
    extra_env: dict = field(default_factory=dict)
    exchange: str | None = None  # a folder shared by the driver and the ranks, or None


def agree_steps(rows: list[int], per_rank_batch: int) -> int:
    """Steps per epoch for every rank: ``ceil(max(rows) / per_rank_batch)``.

    Each rank takes that many full batches; a rank with fewer rows wraps around (a fresh shuffle of
    its rows), so every row is seen at least once per epoch and no rank waits in a collective that
    another rank never joins.

    >>> agree_steps([100, 37], 10)
    10
    """
    if not rows or min(rows) <= 0:
        empty = [r for r, n in enumerate(rows) if n <= 0]
        raise TFNetError(f"Ranks {empty} have no rows to train on (rows per rank: {rows}).")
    return max(1, math.ceil(max(rows) / per_rank_batch))


def _set_threads(cpus: int) -> None:
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(cpus)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, cpus)))
    except RuntimeError:
        pass  # a reused Python worker whose TensorFlow already runs keeps its pools


def _write_rank_info(model_dir: str | None, rank: int, attempt: int) -> None:
    if not model_dir:
        return
    from tfnet.graph_io import write_json_atomic

    info = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "attempt": attempt, "time": time.time()}
    write_json_atomic(os.path.join(model_dir, "ranks", f"rank-{rank}.json"), info)


def run_rank(job: RankJob, partition: Iterable) -> Iterator[bytes | str]:
    """The body of one barrier task. Yields one result on rank 0 (the payload, or its path in the
    exchange folder), nothing elsewhere."""
    from pyspark import BarrierTaskContext

    from optim.watchdog import Watchdog

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    _claim(job.rendezvous, rank)
    dog = Watchdog(job.startup_timeout_s, f"tfnet rank {rank}").start()
    collective = None
    try:
        _set_threads(max(1, int(ctx.cpus())))
        dog.kick("reading the partition")
        shard = _shard(job, partition, rank)
        dog.kick("agreeing on steps")
        steps = job.steps_per_epoch
        if job.kind == "tf_data":
            counts = _gather(job, rank, _tf_data_count(shard, rank, job.size))
            if steps is None:
                if min(counts) < 0:
                    raise TFNetError(
                        "The tf.data input of some rank has an unknown number of batches; pass "
                        "steps_per_epoch=N to optimize()."
                    )
                steps = max(counts)
        else:
            rows = len(shard.shard_indices(rank, job.size))
            steps = steps or agree_steps(_gather(job, rank, rows), job.config.batch_size)
        _write_rank_info(job.config.model_dir, rank, job.attempt)
        dog.kick("connecting the Horovod ranks")
        collective = _horovod(job, ctx, rank)
        dog.timeout_s = job.timeout_s
        dog.kick("building the model")
        net = _build_net(job)
        reporter = _reporter(job, rank)
        from optim.loop import train

        if job.state is not None:
            step_fn = net.train_step(job.loss, job.method, reducer=collective.reducer())
            import tensorflow as tf

            spec = step_fn.state_spec()
            step_fn.set_state(tf.nest.pack_sequence_as(
                spec, [tf.constant(a, dtype=s.dtype) for a, s in zip(job.state, tf.nest.flatten(spec))]))
        dog.kick("training")
        outcome = train(net, job.loss, job.method, job.metrics, shard, job.config, collective=collective,
                        reporter=reporter, validation_data=job.validation.value if job.validation else None,
                        steps_per_epoch=steps, continue_state=job.state is not None, start_step=job.start_step,
                        heartbeat=lambda: dog.kick("training"))
        if rank == 0:
            step_fn = net.train_step(job.loss, job.method, reducer=collective.reducer())
            payload = _payload(net, step_fn, outcome)
            if job.exchange:
                from tfnet.graph_io import write_bytes_atomic

                path = os.path.join(job.exchange, f"result-{job.attempt}.npz")
                write_bytes_atomic(path, payload)
                yield path
            else:
                yield payload
    finally:
        dog.kick("shutting down")
        if collective is not None:
            from optim.hvd_collective import shutdown_horovod

            shutdown_horovod()
        dog.stop()


def _claim(rendezvous: tuple[str, int], rank: int) -> None:
    """Registers this rank with the driver's rendezvous server, once per launch. A second claim
    means Spark resubmitted the stage by itself (its Horovod keys would be stale): fail fast and
    let the driver retry with a fresh rendezvous."""
    from optim import kv

    if kv.get(rendezvous, "tfnet_claims", f"rank{rank}") is not None:
        raise StageRetryError("Spark resubmitted the training stage by itself; tfnet retries it from the driver.")
    kv.put(rendezvous, "tfnet_claims", f"rank{rank}", b"1")


def _gather(job: RankJob, rank: int, value: int) -> list[int]:
    from optim import kv

    return [int(v) for v in kv.all_gather(job.rendezvous, "tfnet_counts", rank, job.size, str(int(value)),
                                          job.startup_timeout_s)]


def _shard(job: RankJob, partition: Iterable, rank: int):
    if job.kind in ("arrow", "records"):
        return job.reader(partition, rank)
    for _ in partition:  # the placeholder partition of parallelize(range(size)) carries nothing
        pass
    if job.kind == "arrays":
        return job.data.value
    return job.data


def _tf_data_count(data, rank: int, size: int) -> int:
    n = data.num_batches(0, rank=rank, size=size)
    return -1 if n is None else int(n)


def _horovod(job: RankJob, ctx, rank: int):
    from optim.hvd_collective import horovod_env, iface_for, init_horovod

    infos = ctx.getTaskInfos()
    host = infos[rank].address.split(":")[0] if infos else "127.0.0.1"
    env = horovod_env(rank, job.size, job.rendezvous[0], job.rendezvous[1], iface_for(host), int(job.timeout_s))
    env.update(job.extra_env)
    return init_horovod(env)


def _build_net(job: RankJob):
    from tfnet.serialize import net_from_bytes

    if isinstance(job.net, str):
        with open(job.net, "rb") as f:
            net = net_from_bytes(f.read())
    else:
        net = net_from_bytes(job.net.value)
    if job.hooks:
        import cloudpickle

        forward, gradient, update = cloudpickle.loads(job.hooks)
        for fn in forward:
            net.register_forward_hook(fn)
        for fn in gradient:
            net.register_gradient_hook(fn)
        for fn in update:
            net.register_update_hook(fn)
    return net


def _reporter(job: RankJob, rank: int):
    from optim.reporting import MultiReporter, Reporter, TensorBoardWriter

    if rank != 0:
        return Reporter()
    from optim.progress_channel import RemoteReporter

    parts = []
    if job.progress is not None:
        parts.append(RemoteReporter(*job.progress))
    if job.config.model_dir:
        parts.append(TensorBoardWriter(os.path.join(job.config.model_dir, "tensorboard")))
    return MultiReporter(parts)


def _payload(net, step_fn, outcome) -> bytes:
    import tensorflow as tf

    arrays = {f"w{i:05d}": v for i, v in enumerate(net.get_weights().values())}
    for i, leaf in enumerate(tf.nest.flatten(step_fn.get_state())):
        arrays[f"s{i:05d}"] = np.array(leaf, copy=True)
    meta = {"history": outcome.history, "step": outcome.step, "weights": net.weight_names,
            "state_leaves": len([k for k in arrays if k.startswith("s")])}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def read_payload(data: bytes) -> tuple[dict, list, dict]:
    """``(weights, state_leaves, meta)`` from rank 0's payload."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        meta = json.loads(bytes(npz["meta"]).decode())
        weights = {n: npz[f"w{i:05d}"] for i, n in enumerate(meta["weights"])}
        state = [npz[f"s{i:05d}"] for i in range(meta["state_leaves"])]
    return weights, state, meta
