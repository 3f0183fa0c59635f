"""What every task of the training barrier stage runs: one Horovod rank. Worker side.

A rank reads its partition (into a local copy it streams from, or into arrays), agrees with the other ranks on the number of steps per
epoch (through the driver's rendezvous store, before Horovod starts), joins the Horovod ring over
Gloo through that store, and runs the same training loop as a local run, from the optimiser state
the driver sent. Rank 0 sends progress to the driver, writes checkpoints and TensorBoard events,
and returns the final weights, optimiser state and history. A rank that fails posts its error as
data (:mod:`optim.transport.failures`) before its task fails. Every call to the driver is signed with
the job's rendezvous key; the progress channel has a key of its own (:mod:`optim.transport.auth`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from optim.errors import StageRetryError
from tfnet.errors import TFNetError

RESULT_FORMAT = "tfnet-rank-result-1"
log = logging.getLogger("tfnet.spark.worker")


@dataclass
class RankJob:
    """Everything a rank needs, built on the driver (picklable)."""

    net: Any  # tfnet.serialize.net_to_bytes(net): a path in ``exchange``, a Spark broadcast, or the bytes (Connect)
    hooks: bytes | None  # tfnet.serialize.hooks_to_bytes(net)
    loss: Any
    method: Any
    metrics: list
    config: Any  # optim.training.config.TrainConfig (batch_size is per rank)
    size: int
    kind: str  # "arrow", "records", "arrays", "tf_data" or "files" (Parquet read by the ranks)
    reader: Callable | None = None  # arrow/records shard reader
    data: Any = None  # broadcast ArrayDataset for "arrays", a TFDataDataset for "tf_data", a ParquetDataset for "files"
    validation: Any = None  # a broadcast ArrayDataset, a TFDataDataset, or None (or read with the data)
    rendezvous: tuple[str, int] | None = ("127.0.0.1", 0)  # None: rank 0 hosts it (Spark Connect)
    progress: tuple[str, int] | None = None
    timeout_s: float = 300.0
    startup_timeout_s: float = 600.0
    state: list | None = None  # optimiser state leaves to continue from (the optimiser's)
    start_step: int = 0
    steps_per_epoch: int | None = None
    attempt: int = 0
    exchange: str | None = None  # a folder shared by the driver and the ranks, or None
    rendezvous_key: bytes = b""  # signs every request to the driver's rendezvous store
    progress_key: bytes = b""  # authenticates rank 0 on the progress channel
    lr_source: Any = None  # what gives the logged learning rate (``learning_rate_at``)
    log_level: int = logging.WARNING  # tfnet's and TensorFlow's log level in the ranks
    outputs: tuple = ((), ())  # the net's output names and TensorSpecs (for the label checks)
    progress_path: str | None = None  # under Spark Connect: where rank 0 publishes its progress (model_dir)
    horovod_threads: str = "idle"  # optim.training.comm_threads: Horovod's threads at idle priority or not
    exchange_state: list | None = None  # the server method's state from the previous call (local SGD)
    control: str | None = None  # elastic training: a file whose presence asks the ranks to stop at an epoch boundary


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


def _write_rank_info(config, rank: int, attempt: int, **extra) -> None:
    """``model_dir/ranks/<run id>/rank-<N>.json``: where this rank runs (for operators and tests),
    with ``extra`` (written again once Horovod runs: its network, :func:`_network`, how many of its
    threads run at idle priority, and TensorFlow's ``[intra_op, inter_op]`` threads, 0 for its default)."""
    if not config.model_dir:
        return
    import json

    from tfnet import storage

    info = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "attempt": attempt, "time": time.time(),
            "run_id": config.run_id, **extra}
    storage.write_bytes_atomic(storage.join(config.model_dir, "ranks", config.run_id or "", f"rank-{rank}.json"),
                               json.dumps(info).encode(), config.storage_options)


def run_rank(job: RankJob, partition: Iterable) -> Iterator[bytes | str]:
    """The body of one barrier task. Yields one result on rank 0 (the payload, or its path in the
    exchange folder), nothing elsewhere. A failure is posted to the driver as data, then raised."""
    from pyspark import BarrierTaskContext

    from optim.logs import quiet_worker

    quiet_worker(job.log_level)
    rank = BarrierTaskContext.get().partitionId()
    try:
        yield from _run_rank(job, partition, rank)
    except BaseException as exc:
        from optim.transport import client
        from optim.transport.failures import from_exception

        client.report_failure(job.rendezvous, rank, from_exception(exc, rank).to_json(), job.rendezvous_key)
        raise


def _run_rank(job: RankJob, partition: Iterable, rank: int) -> Iterator[bytes | str]:
    from pyspark import BarrierTaskContext

    from optim.spark.worker.watchdog import Watchdog
    from tfnet.config import get_num_threads, set_num_threads

    ctx = BarrierTaskContext.get()
    _claim(job, rank)
    _reset_peak_rss()
    local: list = []  # streamed data whose local copies go on every way out
    dog = Watchdog(job.startup_timeout_s, f"tfnet rank {rank}", long_timeout_s=_long_bound(job),
                   beat=_heartbeat_sender(job, rank)).start()
    hvd = None
    try:
        cpus = max(1, int(ctx.cpus()))
        if not set_num_threads(cpus, max(1, min(2, cpus)), strict=False):
            log.info("Rank %d: TensorFlow already runs in this reused Python worker; its thread pools stay.", rank)
        dog.kick("reading the partition")
        shard = _shard(job, partition, rank, local)
        validation = _validation(job)
        if isinstance(shard, tuple):  # the stage carries the validation rows too: this rank's own
            shard, validation = shard
        if job.kind == "files":  # Parquet read by the rank: checked batch by batch as it is read
            shard = shard.checked(_partition_checks(job, rank, f"rank {rank}'s rows"))
        elif job.kind in ("arrow", "records") and not local:
            # the driver checked numpy data; a partition is checked here (a streamed one as it was stored)
            shard = _checked(job, shard, rank)
        dog.kick("agreeing on steps")
        steps = job.steps_per_epoch
        rows = None
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
            rows = _gather(job, rank, _rows(shard, rank, job.size))
            steps = steps or agree_steps(rows, job.config.batch_size)
        _write_rank_info(job.config, rank, job.attempt, size=job.size, **_memory(local))
        dog.kick("connecting the Horovod ranks")
        network = _network(job, ctx, rank)
        hvd = _horovod(job, rank, network)
        threads = list(get_num_threads())  # a reused worker's TensorFlow keeps the pools it started with
        _write_rank_info(job.config, rank, job.attempt, size=job.size, horovod_idle_threads=len(hvd.idle.demoted),
                         tf_threads=threads, **network)
        collective = hvd.collective
        dog.timeout_s = job.timeout_s
        with dog.phase("building the model"):
            net = _build_net(job)
            reporter = _reporter(job, rank)
        from optim.training.loop import train

        dog.kick("training")
        outcome = train(net, job.loss, job.method, job.metrics, shard, job.config, collective=collective,
                        reporter=reporter, validation_data=validation,
                        steps_per_epoch=steps, initial_state=job.state, start_step=job.start_step,
                        lr_source=job.lr_source, liveness=dog, initial_exchange_state=job.exchange_state,
                        stop_check=_stop_check(job))
        _write_rank_info(job.config, rank, job.attempt, size=job.size, horovod_idle_threads=len(hvd.idle.demoted),
                         tf_threads=threads, **network, **_memory(local))
        if rank == 0:
            dog.kick("sending the result")
            payload = _payload(net, outcome, {"rows": rows,
                                              "steps_per_epoch": steps, "attempt": job.attempt})
            if job.exchange:
                from tfnet import storage

                path = storage.join(job.exchange, f"result-{job.attempt}.npz")
                storage.write_bytes_atomic(path, payload, job.config.storage_options)
                yield path
            else:
                yield payload
    finally:
        dog.kick("shutting down")
        for data in local:
            data.release()
        if hvd is not None:
            hvd.close()
        dog.stop()


def _stop_check(job: RankJob):
    """Rank 0's question at an epoch boundary (elastic training): has the driver asked the ranks to stop?"""
    if not job.control:
        return None
    from tfnet import storage

    def asked() -> bool:
        try:
            return storage.exists(job.control, job.config.storage_options)
        except Exception as exc:  # noqa: BLE001 - an unreadable store: go on as asked before
            log.warning("Cannot read the control file %s (%s); training goes on.", job.control, exc)
            return False

    return asked


def _claim(job: RankJob, rank: int) -> None:
    """Registers this rank with the driver's rendezvous store, once per launch. A second claim
    means Spark resubmitted the stage by itself (its Horovod keys would be stale): fail fast and
    let the driver retry with a fresh rendezvous."""
    from optim.transport import client as kv

    if kv.get(job.rendezvous, "tfnet_claims", f"rank{rank}", token=job.rendezvous_key) is not None:
        raise StageRetryError("Spark resubmitted the training stage by itself; tfnet retries it from the driver.")
    kv.put(job.rendezvous, "tfnet_claims", f"rank{rank}", b"1", token=job.rendezvous_key)


def _long_bound(job: RankJob) -> float:
    """The bound of the long phases (compiles, checkpoint writes, waiting for the others'
    validation) and of Gloo's own waits: the start-up bound, or ``timeout`` when that is longer."""
    return max(float(job.startup_timeout_s), float(job.timeout_s))


def _heartbeat_sender(job: RankJob, rank: int):
    from optim.transport import client as kv
    from optim.transport.store import HEARTBEAT_SCOPE

    def send(beat: bytes) -> None:
        kv.put(job.rendezvous, HEARTBEAT_SCOPE, f"rank{rank}", beat, timeout_s=5.0, token=job.rendezvous_key)

    return send


def _gather(job: RankJob, rank: int, value: int) -> list[int]:
    from optim.transport import client as kv

    return [int(v) for v in kv.all_gather(job.rendezvous, "tfnet_counts", rank, job.size, str(int(value)),
                                          job.startup_timeout_s, token=job.rendezvous_key)]


def _shard(job: RankJob, partition: Iterable, rank: int, local: list):
    """This rank's data. A streamed partition is read into a local copy (registered in ``local``, which the
    caller removes on every way out), checked as it is stored."""
    if job.kind == "arrow" and hasattr(job.reader, "spool"):
        from optim.spark.worker.spool import spool_folder

        name = f"{job.config.run_id or 'run'}-r{rank}-a{job.attempt}"
        folder = spool_folder(getattr(job.reader, "local_dir", None))
        made = job.reader.spool(partition, rank, folder, name, _partition_checks(job, rank, f"partition {rank}"))
        local.extend(made if isinstance(made, tuple) else [made])
        return made
    if job.kind in ("arrow", "records"):
        return job.reader(partition, rank)
    for _ in partition:  # the placeholder partition of parallelize(range(size)) carries nothing
        pass
    return _value(job.data)


def _rows(shard, rank: int, size: int) -> int:
    """The rows this rank trains on (its partition, or its share of numpy data or of Parquet files)."""
    if hasattr(shard, "rows_on"):
        return int(shard.rows_on(rank, size))
    return len(shard.shard_indices(rank, size))


def _partition_checks(job: RankJob, rank: int, where: str):
    from types import SimpleNamespace

    from optim.training.checks import PartitionChecks

    outputs = SimpleNamespace(output_names=job.outputs[0], output_specs=job.outputs[1])
    return PartitionChecks(job.loss, outputs, job.config.on_nonfinite, where)


def _reset_peak_rss() -> None:
    """Starts this process's peak resident memory (``VmHWM``) afresh, so that a reused Python worker reports
    this task's peak (Linux: ``5`` into ``/proc/self/clear_refs``; elsewhere nothing)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory since its start or :func:`_reset_peak_rss` (``VmHWM``), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _memory(local: list) -> dict:
    """What the rank info records of memory: the peak RSS, and the local copies' sizes and folder."""
    out = {"peak_rss_bytes": peak_rss_bytes()}
    sources = [getattr(d, "source", None) for d in local]
    paths = [s.path for s in sources if getattr(s, "path", None)]
    if paths:
        out["local_copy_bytes"] = int(sum(s.nbytes for s in sources))
        out["local_copies"] = paths
    return out


def _value(shipped):
    """What a broadcast holds, or the object itself when it came in the plan (Spark Connect)."""
    from pyspark import Broadcast

    return shipped.value if isinstance(shipped, Broadcast) else shipped


def _checked(job: RankJob, shard, rank: int):
    """Class-id labels against the loss, and NaN or Inf features, in this rank's partition."""
    from types import SimpleNamespace

    from optim.training.checks import check_labels, finite_rows_only

    where = f"partition {rank}"
    if shard.labels is not None:
        outputs = SimpleNamespace(output_names=job.outputs[0], output_specs=job.outputs[1])
        check_labels(shard.labels[0] if shard.single_label else shard.labels, job.loss, outputs, f"the labels of {where}")
    return finite_rows_only(shard, job.config.on_nonfinite, f"the features of {where}")


def _validation(job: RankJob):
    return None if job.validation is None else _value(job.validation)


def _tf_data_count(data, rank: int, size: int) -> int:
    n = data.num_batches(0, rank=rank, size=size)
    return -1 if n is None else int(n)


def _network(job: RankJob, ctx, rank: int) -> dict:
    """Where this rank meets the others: ``address`` (its executor's, as Spark's task infos give it),
    ``gloo_iface`` and ``gloo_address`` (the interface Gloo listens on and every peer connects to:
    :func:`optim.spark.worker.network.gloo_iface`), ``rendezvous`` (the store's ``host:port``, the
    driver's or rank 0's) and ``hosts`` (every rank's executor address)."""
    from optim.spark.worker.network import gloo_iface, iface_address

    infos = ctx.getTaskInfos()
    address = infos[rank].address.rsplit(":", 1)[0] if infos else "127.0.0.1"
    iface = gloo_iface(address, job.rendezvous[0])
    return {"address": address, "gloo_iface": iface, "gloo_address": iface_address(iface),
            "rendezvous": f"{job.rendezvous[0]}:{job.rendezvous[1]}",
            "hosts": sorted({i.address.rsplit(":", 1)[0] for i in infos})}


def _horovod(job: RankJob, rank: int, network: dict):
    """Joins the Horovod ring over ``network`` (:func:`_network`); Gloo's rendezvous goes through a
    local proxy that adds the secret."""
    from optim.spark.worker.network import check_process_sets
    from optim.training.horovod import HorovodSession, horovod_env
    from optim.transport.client import GlooProxy

    check_process_sets(network["gloo_address"], network["hosts"])
    proxy = GlooProxy(job.rendezvous, job.rendezvous_key, timeout_s=job.timeout_s)
    env = horovod_env(rank, job.size, proxy.address[0], proxy.address[1], network["gloo_iface"],
                      int(_long_bound(job)))
    try:
        return HorovodSession(env, on_close=proxy.stop, threads=job.horovod_threads)
    except BaseException:
        proxy.stop()
        raise


def _build_net(job: RankJob):
    from tfnet.serialize import net_from_bytes, register_hooks

    if isinstance(job.net, str):
        from tfnet import storage

        net = net_from_bytes(storage.read_bytes(job.net, job.config.storage_options))
    else:
        net = net_from_bytes(_value(job.net))
    return register_hooks(net, job.hooks)


def _reporter(job: RankJob, rank: int):
    from optim.training.reporting import MultiReporter, Reporter, TensorBoardWriter, tensorboard_dir

    if rank != 0:
        return Reporter()
    from optim.transport.progress import RemoteReporter

    parts = []
    if job.progress is not None:
        parts.append(RemoteReporter(*job.progress, authkey=job.progress_key))
    elif job.progress_path:
        from optim.transport.progress_store import StoredReporter

        parts.append(StoredReporter(job.progress_path, job.config.storage_options))
    if job.config.model_dir:
        parts.append(TensorBoardWriter(tensorboard_dir(job.config.model_dir, job.config.run_id),
                                       job.config.storage_options))
    return MultiReporter(parts)


def _payload(net, outcome, plan: dict) -> bytes:
    """Rank 0's result: the weights and optimiser state as arrays, and what the run did (the step
    it started from and the checkpoint that was, the rows per rank and steps per epoch). A net with
    low-rank adapters returns those and its trainable weights only: its frozen base cannot change."""
    from tfnet.container import pack
    from tfnet.lora import carried_weight_names

    weights = net.get_weights(carried_weight_names(net))
    arrays = {f"w{i:05d}": v for i, v in enumerate(weights.values())}
    arrays.update({f"s{i:05d}": np.asarray(leaf) for i, leaf in enumerate(outcome.state)})
    arrays.update({f"x{i:05d}": np.asarray(leaf) for i, leaf in enumerate(outcome.exchange_state)})
    header = {"history": outcome.history, "step": outcome.step, "weights": list(weights),
              "state_leaves": len(outcome.state), "exchange_leaves": len(outcome.exchange_state),
              "start_step": outcome.start_step, "stopped": outcome.stopped,
              "resumed_from": outcome.resumed_from, **plan}
    return pack(RESULT_FORMAT, header, arrays)


def read_payload(data: bytes) -> tuple[dict, list, dict]:
    """``(weights, state_leaves, header)`` from rank 0's payload; ``header["exchange_state"]`` is
    the server method's state (local SGD's leaves, or empty)."""
    from tfnet.container import unpack

    header, arrays = unpack(data, RESULT_FORMAT, what="rank 0's result")
    weights = {n: arrays[f"w{i:05d}"] for i, n in enumerate(header["weights"])}
    state = [arrays[f"s{i:05d}"] for i in range(header["state_leaves"])]
    header["exchange_state"] = [arrays[f"x{i:05d}"] for i in range(header.get("exchange_leaves", 0))]
    return weights, state, header
