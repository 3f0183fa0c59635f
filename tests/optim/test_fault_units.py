"""The records the fault tests read (issue 42), without Spark: a resumed run's start digest against its checkpoint,
a rank's per-epoch tally of the rows it trained on, and the launcher's check that a running stage still has its
task slots."""

import json
import os
from types import SimpleNamespace

import numpy as np

import optim
from optim.config import TrainConfig
from optim.data.arrays import ArrayDataset
from optim.launch.elastic import ElasticPolicy
from optim.launch.launcher import _DistributedRun
from optim.launch.retry import RetryPolicy
from optim.protocol import RunResult, pack_result, unpack_result
from optim.rank.tally import EpochTally, fingerprint
from optim.training.loop import train
from optim.training.reporting import Reporter
from optim.transport.progress import EventSink
from tests import digits
from tests.elastic_checks import checkpoint_digest
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_a_resumed_run_records_the_digest_of_the_checkpoint_it_started_from(tmp_path):
    x, y = digits.load()
    x, y = x[:96], y[:96]
    config = TrainConfig(epochs=1, batch_size=32, checkpoint_every=2, keep_checkpoints=10, model_dir=str(tmp_path),
                         run_id="20261201-000000-000000-aaaa")
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    first = train(net, SCE, optim.SGD(0.05, momentum=0.9), [], ArrayDataset.from_tensors((x, y)), config)
    assert first.start_sha256 is None  # a fresh start records none
    ckpt = sorted((tmp_path / "checkpoints" / config.run_id).glob("ckpt-*.npz"))[0]  # step 2, mid-epoch
    again = TrainConfig(**{**config.__dict__, "epochs": 2, "run_id": "20261201-000001-000000-bbbb",
                           "resume": str(ckpt)})
    other = TFNet.from_keras(digits.cnn(classes=10, seed=7))  # other weights: only a real restore matches
    second = train(other, SCE, optim.SGD(0.05, momentum=0.9), [], ArrayDataset.from_tensors((x, y)), again)
    assert second.resumed_from == str(ckpt) and second.start_step == 2
    assert second.start_sha256 == checkpoint_digest(ckpt)
    newest = sorted((tmp_path / "checkpoints" / config.run_id).glob("ckpt-*.npz"))[-1]
    assert second.start_sha256 != checkpoint_digest(newest)
    back = unpack_result(pack_result({}, RunResult({}, 3, [], start_sha256=second.start_sha256), {}))
    assert back.start_sha256 == second.start_sha256


def test_a_fingerprint_is_the_rows_whatever_their_order_and_batches():
    x = np.arange(40, dtype=np.float32).reshape(10, 2, 2)
    y = np.arange(10) % 3
    n, whole = fingerprint(x, y)
    parts = [fingerprint(x[i], y[i]) for i in (slice(0, 3), slice(3, 10))]
    perm = np.random.default_rng(0).permutation(10)
    assert n == 10 and sum(p[0] for p in parts) == 10
    assert (sum(p[1] for p in parts) % (1 << 64)) == whole == fingerprint(x[perm], y[perm])[1]
    repeated = np.concatenate([np.arange(9), [0]])  # a row twice, another missing: the same count, another sum
    assert fingerprint(x[repeated], y[repeated])[1] != whole
    assert fingerprint({"b": y, "a": x})[1] == fingerprint([x, y])[1]  # a dict's arrays in key order
    assert fingerprint(np.array(["a", "b"], dtype=object))[1] != fingerprint(np.array(["b", "b"], dtype=object))[1]


class Batches:
    """Stands in for a rank's data: ``steps`` batches of ``per`` rows of ``x`` per epoch, from ``skip`` on."""

    def __init__(self, x, per):
        self.x, self.per = x, per

    def batches(self, batch_size, *, epoch=0, skip=0, steps=None, **kw):
        for b in range(skip, steps):
            rows = self.x[b * self.per:(b + 1) * self.per]
            yield rows, np.zeros(len(rows))

    def num_batches(self, *args, **kwargs):
        return len(self.x) // self.per


def test_the_tally_counts_the_batches_the_loop_trained_on_and_writes_each_epoch(tmp_path):
    x = np.arange(32, dtype=np.float32).reshape(16, 2)
    path = str(tmp_path / "epochs-a0-r0.json")
    tally = EpochTally(Batches(x, 4), path, None, {"rank": 0, "attempt": 0, "size": 1, "count": 16})
    assert tally.num_batches() == 4  # everything else is the data's
    for _ in tally.batches(4, epoch=0, steps=4):
        pass
    assert not os.path.exists(path)  # an epoch is written when the next starts, or at close()
    for b, _ in enumerate(tally.batches(4, epoch=1, skip=1, steps=4)):
        if b == 1:
            break  # the loop took the second batch of the epoch and stopped (max_steps): it did not train on it
    tally.close()
    info = json.load(open(path))
    assert (info["rank"], info["count"]) == (0, 16)
    e0, e1 = info["epochs"]["0"], info["epochs"]["1"]
    assert (e0["from_batch"], e0["batches"], e0["rows"]) == (0, 4, 16)
    assert int(e0["fingerprint"]) == fingerprint(x, np.zeros(16))[1]
    assert (e1["from_batch"], e1["batches"], e1["rows"]) == (1, 1, 4)
    assert int(e1["fingerprint"]) == fingerprint(x[4:8], np.zeros(4))[1]


def test_the_tally_records_each_checkpoint_of_an_open_epoch_at_once(tmp_path):
    """A rank killed after a checkpoint leaves what its open epoch had trained on at that checkpoint's batch: written as
    the checkpoint is (the loop's ``checkpoint`` event), counted from the batch its attempt started the epoch at."""
    x = np.arange(32, dtype=np.float32).reshape(16, 2)
    path = str(tmp_path / "epochs-a1-r0.json")
    tally = EpochTally(Batches(x, 4), path, None, {"rank": 0, "attempt": 1, "size": 1, "count": 16})
    events = tally.reporter()
    for b, _ in enumerate(tally.batches(4, epoch=2, skip=1, steps=4), start=1 + 1):
        if b == 3:  # the loop trained batches 1 and 2 of the epoch; a checkpoint at step 11 holds 3 batches of it
            events.checkpoint(11, 2, 3)
            break  # killed: nothing after the checkpoint is written
    events.checkpoint(12, 3, 0)  # an epoch boundary's checkpoint records nothing
    info = json.load(open(path))
    assert list(info["checkpoints"]) == ["11"]
    mark = info["checkpoints"]["11"]
    assert (mark["epoch"], mark["batch"], mark["from_batch"], mark["rows"]) == (2, 3, 1, 8)
    assert int(mark["fingerprint"]) == fingerprint(x[4:12], np.zeros(8))[1]


def test_a_stage_whose_slots_are_lost_is_ended_by_the_watch():
    """Spark declared an executor lost: the cluster has fewer slots than the stage has ranks, so the stage cannot
    finish (Spark resubmits a barrier stage and waits for slots that are gone). The watch says so at its next check;
    a session that cannot count its slots while a stage runs (Spark Connect) has no such check."""
    slots = [2]
    backend = SimpleNamespace(counts_slots=True, slots_now=lambda: slots[0])
    run = _DistributedRun(None, backend, RetryPolicy(2), verbose=0, timeout=60, startup_timeout=600, slot_wait=0,
                          steps_per_epoch=None)
    run.intervals.slot_s = 0.0
    check = run.lost_slots(SimpleNamespace(n=2))
    assert check() is None
    slots[0] = 1
    assert check() == "the cluster has 1 task slot(s) now, fewer than the stage's 2 ranks (an executor was lost)"
    assert run.lost_slots(SimpleNamespace(n=1))() is None
    assert _DistributedRun(None, SimpleNamespace(counts_slots=False), RetryPolicy(2), verbose=0, timeout=60,
                           startup_timeout=600, slot_wait=0, steps_per_epoch=None).lost_slots(SimpleNamespace(n=2)) is None


def test_a_connect_client_probes_for_returned_slots_only_once_its_ranks_hold_theirs(tmp_path):
    """A Connect client counts free slots with a probe job. Before the stage's ranks start (between its shuffle and
    its tasks, say) the slot they are about to take is free, and a probe then would grow a run whose lost worker
    never came back (seen in CI on a Zen 3: states ..., "running", "growing", "running"). The watch probes only
    after the attempt's first step, when every rank has passed an allreduce and holds its slot."""
    probes = []
    backend = SimpleNamespace(counts_slots=False, free_slots=lambda wanted, running: probes.append(wanted) or 1)
    run = _DistributedRun(None, backend, RetryPolicy(2), verbose=0, timeout=60, startup_timeout=600, slot_wait=0,
                          steps_per_epoch=None)
    run.intervals.grow_s = 0.0
    run.elastic = ElasticPolicy(2, 1)
    run.sink = EventSink(Reporter())
    run.sink.dispatch({"event": "step", "step": 40, "epoch": 1, "logs": {}})  # the attempt before this one
    run.control = str(tmp_path / "grow")
    check = run.watch(SimpleNamespace(n=1, config=TrainConfig()), stuck=None)
    run.sink.dispatch({"event": "begin", "epochs": 12, "steps_per_epoch": 32, "initial_step": 32, "initial_epoch": 1})
    assert check() is None and check() is None
    assert probes == [] and not os.path.exists(run.control), "a probe before the ranks hold their slots"
    run.sink.dispatch({"event": "step", "step": 33, "epoch": 1, "logs": {}})
    assert check() is None
    assert probes == [1] and open(run.control, "rb").read() == b"grow"


def test_every_rank_reports_a_checkpoint_before_it_is_written(tmp_path):
    """The loop's ``checkpoint`` event (the tally's mark) comes before rank 0 writes the file, and the ranks meet in
    between (optim.training.loop.save_checkpoint): so a checkpoint that a resume can take was marked by every rank,
    the one killed just after it included. Checked here on one rank: at each event, no file of that step yet."""
    from optim.training.reporting import Reporter

    x, y = digits.load()
    config = TrainConfig(epochs=1, batch_size=32, checkpoint_every=2, keep_checkpoints=10, model_dir=str(tmp_path),
                         run_id="20261201-000000-000000-cccc")
    folder = tmp_path / "checkpoints" / config.run_id
    seen = []

    class Marks(Reporter):
        def checkpoint(self, step, epoch, batch):
            seen.append((step, epoch, batch, os.path.exists(folder / f"ckpt-{step:09d}.npz")))

    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    train(net, SCE, optim.SGD(0.05), [], ArrayDataset.from_tensors((x[:96], y[:96])), config, reporter=Marks())
    assert seen == [(2, 0, 2, False), (3, 1, 0, False)], seen
    assert sorted(p.name for p in folder.glob("ckpt-*.npz")) == ["ckpt-000000002.npz", "ckpt-000000003.npz"]
