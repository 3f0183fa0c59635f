"""What every task of the training barrier stage runs: one Horovod rank. Worker side.

A rank opens its share of the data (:meth:`~optim.data.base.RankData.open`: into a local copy it streams
from, or into arrays), agrees with the other ranks on the number of steps per epoch (through the
rendezvous store, before Horovod starts), joins the Horovod ring over Gloo through that store, and runs
the same training loop as a local run, from the state the driver sent. Rank 0 sends progress, writes
checkpoints and TensorBoard events, and returns the final weights, optimiser state and history
(:func:`optim.protocol.pack_result`). Every call to the store is signed with the job's rendezvous key;
the progress channel has a key of its own (:mod:`optim.transport.auth`). The job is an
:class:`optim.protocol.RankJob`; a failure travels back as data in the task's error
(:mod:`optim.rank.task`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator

from optim.carriers import Carrier, InFile
from optim.data.values import PartitionChecks, check_labels, finite_rows_only
from optim.errors import StageRetryError
from optim.protocol import RankJob, RunResult, pack_result
from optim.rank.network import check_process_sets, gloo_iface, iface_address
from optim.rank.tally import EpochTally
from optim.rank.watchdog import Watchdog
from optim.shares import RankEnv
from optim.training.horovod import HorovodSession, horovod_env
from optim.training.reporting import MultiReporter, Reporter, TensorBoardWriter
from optim.training.spec import train
from optim.transport import client as kv
from optim.transport.chunks import InPieces
from optim.transport.client import GlooProxy
from optim.transport.progress import RemoteReporter
from optim.transport.progress_store import StoredReporter
from optim.transport.store import HEARTBEAT_SCOPE
from tfnet import storage
from tfnet.config import get_num_threads, set_num_threads
from tfnet.lora import carried_weight_names
from tfnet.serialize import net_from_bytes, register_hooks

__all__ = ["peak_rss_bytes", "run_rank"]

log = logging.getLogger("tfnet.spark.worker")


def _write_rank_info(job: RankJob, rank: int, **extra) -> None:
    """``model_dir/ranks/<run id>/rank-<N>.json``: where this rank runs (for operators and tests),
    with ``extra`` (written again once Horovod runs: its network, :func:`_network`, how many of its
    threads run at idle priority, and TensorFlow's ``[intra_op, inter_op]`` threads, 0 for its default)."""
    config = job.train.config
    if not config.model_dir:
        return
    info = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "attempt": job.attempt, "time": time.time(),
            "run_id": config.run_id, "size": job.size, **extra}
    storage.write_bytes_atomic(storage.join(config.model_dir, "ranks", config.run_id or "", f"rank-{rank}.json"),
                               json.dumps(info).encode(), config.storage_options)


def _tally(job: RankJob, rank: int, data, count: int) -> EpochTally:
    """The rank's training data, counting what each epoch trains on (:mod:`optim.rank.tally`), written to
    ``model_dir/ranks/<run id>/epochs-a<attempt>-r<rank>.json`` with ``count`` (what the rank's data reported to
    agree on the steps: its rows; batches for ``tf.data`` input)."""
    config = job.train.config
    path = storage.join(config.model_dir, "ranks", config.run_id or "", f"epochs-a{job.attempt}-r{rank}.json") \
        if config.model_dir else None
    return EpochTally(data, path, config.storage_options,
                      {"rank": rank, "attempt": job.attempt, "size": job.size, "count": int(count)})


def run_rank(job: RankJob, partition: Iterable, ctx) -> Iterator[Carrier]:
    """The body of one barrier task (``ctx``: its ``BarrierTaskContext``). Yields one result on rank 0 (its carrier:
    the payload in pieces, or its file in the exchange folder), nothing elsewhere."""
    rank = ctx.partitionId()
    _claim(job, rank)
    _reset_peak_rss()
    limits, config = job.limits, job.train.config
    opened = None
    dog = Watchdog(limits.startup_timeout_s, f"tfnet rank {rank}", long_timeout_s=limits.long_s,
                   beat=_heartbeat_sender(job, rank)).start()
    hvd = tally = None
    try:
        cpus = max(1, int(ctx.cpus()))
        if not set_num_threads(cpus, max(1, min(2, cpus)), strict=False):
            log.info("Rank %d: TensorFlow already runs in this reused Python worker; its thread pools stay.", rank)
        dog.kick("reading the partition")
        opened = job.data.open(partition, rank, job.size, _env(job, rank))
        dog.kick("agreeing on steps")
        counts = _gather(job, rank, job.data.count(opened, rank, job.size))
        steps = limits.steps_per_epoch or job.data.steps(counts, config.batch_size)
        _write_rank_info(job, rank, **_memory(opened.local))
        dog.kick("connecting the Horovod ranks")
        network = _network(job, ctx, rank)
        hvd = _horovod(job, rank, network)
        threads = list(get_num_threads())  # a reused worker's TensorFlow keeps the pools it started with
        _write_rank_info(job, rank, horovod_idle_threads=len(hvd.idle.demoted), tf_threads=threads, **network)
        dog.timeout_s = limits.timeout_s
        with dog.phase("building the model"):
            net = _build_net(job)
            net.state.seed_stream = rank  # each rank its own dropout noise (tfnet.keras_training); rank 0 draws fit's
            reporter = _reporter(job, rank)
        dog.kick("training")
        tally = _tally(job, rank, opened.train, counts[rank])
        result = train(net, job.train, tally, collective=hvd.collective,
                                 reporter=MultiReporter([reporter, tally.reporter()]),
                                 validation_data=opened.validation, steps_per_epoch=steps, liveness=dog,
                                 stop_check=_stop_check(job), notice_check=_notice_check(job),
                                 notice_every_s=limits.notice_every_s)
        tally.close()
        _write_rank_info(job, rank, horovod_idle_threads=len(hvd.idle.demoted), tf_threads=threads, **network,
                         **_memory(opened.local))
        if rank == 0:
            dog.kick("sending the result")
            yield _result(job, net, result, counts, steps)
    finally:
        dog.kick("shutting down")
        if tally is not None:
            tally.close()  # what the epochs before a failure trained on, too
        if opened is not None:
            opened.release()
        if hvd is not None:
            hvd.close()
        dog.stop()


def _result(job: RankJob, net, result: RunResult, counts: list[int], steps: int) -> Carrier:
    """Rank 0's payload (a net with low-rank adapters returns those and its trainable weights only: its frozen
    base cannot change) in its carrier: a file in the exchange folder when there is one, else pieces in the rows."""
    payload = pack_result(net.get_weights(carried_weight_names(net)), result,
                          {"rows": counts, "steps_per_epoch": steps, "attempt": job.attempt})
    exchange = job.channels.exchange
    if not exchange:
        return InPieces(payload)
    return InFile.written(storage.join(exchange, f"result-{job.attempt}.npz"), payload,
                          job.train.config.storage_options)


def _env(job: RankJob, rank: int) -> RankEnv:
    """What this rank offers its data: names for local copies, and the checks of the run's loss and outputs."""
    outputs = job.train.outputs  # what the label checks read of the net
    policy = job.train.config.on_nonfinite

    def checks(where: str) -> PartitionChecks:
        return PartitionChecks(job.train.loss, outputs, policy, where)

    def check_values(shard, where: str):
        """Class-id labels against the loss, and NaN or Inf features, in a partition read whole."""
        if shard.labels is not None:
            check_labels(shard.labels[0] if shard.single_label else shard.labels, job.train.loss, outputs,
                         f"the labels of {where}")
        return finite_rows_only(shard, policy, f"the features of {where}")

    return RankEnv(f"{job.train.config.run_id or 'run'}-r{rank}-a{job.attempt}", checks, check_values)


def _stop_check(job: RankJob):
    """Rank 0's question at an epoch boundary (elastic training): has the driver asked the ranks to stop?"""
    return _control_check(job.channels.control, job.train.config.storage_options)


def _notice_check(job: RankJob):
    """Rank 0's question at step boundaries: has the driver seen a decommission notice for an executor that holds
    a rank (the ranks then checkpoint and stop at once)?"""
    return _control_check(job.channels.notice, job.train.config.storage_options)


def _control_check(control: str | None, options):
    """Whether the driver has written ``control``; None when the attempt has no such file."""
    if not control:
        return None

    def asked() -> bool:
        try:
            return storage.exists(control, options)
        except Exception as exc:  # noqa: BLE001 - an unreadable store: go on as asked before
            log.warning("Cannot read the control file %s (%s); training goes on.", control, exc)
            return False

    return asked


def _claim(job: RankJob, rank: int) -> None:
    """Registers this rank with the rendezvous store, once per launch. A second claim means Spark
    resubmitted the stage by itself (its Horovod keys would be stale): fail fast and let the driver
    retry with a fresh rendezvous."""
    ch = job.channels
    if kv.get(ch.rendezvous, "tfnet_claims", f"rank{rank}", token=ch.rendezvous_key) is not None:
        raise StageRetryError("Spark resubmitted the training stage by itself; tfnet retries it from the driver.")
    kv.put(ch.rendezvous, "tfnet_claims", f"rank{rank}", b"1", token=ch.rendezvous_key)


def _heartbeat_sender(job: RankJob, rank: int):
    ch = job.channels

    def send(beat: bytes) -> None:
        kv.put(ch.rendezvous, HEARTBEAT_SCOPE, f"rank{rank}", beat, timeout_s=5.0, token=ch.rendezvous_key)

    return send


def _gather(job: RankJob, rank: int, value: int) -> list[int]:
    ch = job.channels
    return [int(v) for v in kv.all_gather(ch.rendezvous, "tfnet_counts", rank, job.size, str(int(value)),
                                          job.limits.startup_timeout_s, token=ch.rendezvous_key)]


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


def _network(job: RankJob, ctx, rank: int) -> dict:
    """Where this rank meets the others: ``address`` (its executor's, as Spark's task infos give it),
    ``gloo_iface`` and ``gloo_address`` (the interface Gloo listens on and every peer connects to:
    :func:`optim.rank.network.gloo_iface`), ``rendezvous`` (the store's ``host:port``, the
    driver's or rank 0's) and ``hosts`` (every rank's executor address)."""
    rendezvous = job.channels.rendezvous
    infos = ctx.getTaskInfos()
    address = infos[rank].address.rsplit(":", 1)[0] if infos else "127.0.0.1"
    iface = gloo_iface(address, rendezvous[0])
    return {"address": address, "gloo_iface": iface, "gloo_address": iface_address(iface),
            "rendezvous": f"{rendezvous[0]}:{rendezvous[1]}",
            "hosts": sorted({i.address.rsplit(":", 1)[0] for i in infos})}


def _horovod(job: RankJob, rank: int, network: dict) -> HorovodSession:
    """Joins the Horovod ring over ``network`` (:func:`_network`); Gloo's rendezvous goes through a
    local proxy that adds the secret."""
    check_process_sets(network["gloo_address"], network["hosts"])
    proxy = GlooProxy(job.channels.rendezvous, job.channels.rendezvous_key, timeout_s=job.limits.timeout_s)
    env = horovod_env(rank, job.size, proxy.address[0], proxy.address[1], network["gloo_iface"],
                      int(job.limits.long_s), log_level=job.limits.horovod_log_level)
    try:
        return HorovodSession(env, on_close=proxy.stop, threads=job.limits.horovod_threads)
    except BaseException:
        proxy.stop()
        raise


def _build_net(job: RankJob):
    data = job.train.net.read(job.train.config.storage_options)  # its carrier: the backend chose the road
    return register_hooks(net_from_bytes(data), job.train.hooks)


def _reporter(job: RankJob, rank: int) -> Reporter:
    if rank != 0:
        return Reporter()
    ch, config = job.channels, job.train.config
    parts = []
    if ch.progress is not None:
        parts.append(RemoteReporter(*ch.progress, authkey=ch.progress_key))
    elif ch.progress_path:
        parts.append(StoredReporter(ch.progress_path, config.storage_options))
    events = config.events_dir()
    if events:
        parts.append(TensorBoardWriter(events, config.storage_options))
    return MultiReporter(parts)
