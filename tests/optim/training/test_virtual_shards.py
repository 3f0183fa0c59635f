"""An epoch resumed on fewer ranks than began it takes each row once (optim.data.virtual_shards), in one process: the
rows that two ranks trained before a checkpoint at batch b, and the rows one rank takes from there, are the epoch's
rows, each once; for numpy arrays every rank holds whole, for a DataFrame partition staged with each row's shard, and
through train() from a checkpoint that says two ranks began its epoch. Where the data cannot give another rank's shard,
the epoch is cut afresh and the log says so."""

import logging

import numpy as np
import pyarrow as pa
import pytest

import optim
from optim.config import TrainConfig
from optim.data.arrays import ArrayDataset
from optim.data.decode import TensorColumns
from optim.data.partition import ArrowShard
from optim.data.shards import SHARD_COLUMN, held_shards, partition_keys, spark_hash_int
from optim.data.virtual_shards import ShardedArrowShard, resumed_batches
from optim.rank.tally import EpochTally, fingerprint
from optim.training.checkpoint import CheckpointManager
from optim.training.loop import train
from optim.training.reporting import Reporter
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)
_MOD = 1 << 64


def _rows(batches) -> tuple[int, int]:
    rows = fp = 0
    for features, labels in batches:
        n, f = fingerprint(features, labels)
        rows, fp = rows + n, (fp + f) % _MOD
    return rows, fp


def _data(n=120):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n, dtype=np.int64) % 7
    return x, y


def test_the_shards_divide_over_the_ranks_in_order():
    assert [held_shards(4, k, 2) for k in range(2)] == [[0, 1], [2, 3]]
    assert [held_shards(4, k, 1) for k in range(1)] == [[0, 1, 2, 3]]
    assert [held_shards(2, k, 2) for k in range(2)] == [[0], [1]]


@pytest.mark.parametrize("began, goes_on", [(2, 1), (4, 2), (4, 1)])
def test_arrays_every_rank_holds_take_each_row_of_the_resumed_epoch_once(began, goes_on):
    x, y = _data()
    data = ArrayDataset.from_tensors((x, y))
    global_batch, skip, epoch, seed = 12, 3, 2, 5
    steps = data.num_batches(global_batch // began, rank=0, size=began)
    kw = dict(epoch=epoch, seed=seed, shuffle=True, steps=steps, training=True)
    before = [_rows(data.batches(global_batch // began, rank=v, size=began, **{**kw, "steps": skip}))
              for v in range(began)]
    after = [list(resumed_batches(data, global_batch // goes_on, shards=began, rank=k, size=goes_on, skip=skip, **kw))
             for k in range(goes_on)]
    assert all(len(a) == steps - skip for a in after)
    assert all(len(f[0]) == global_batch // goes_on for a in after for f, _ in a)  # the global batch stays whole
    rows = sum(r for r, _ in before) + sum(_rows(a)[0] for a in after)
    fp = (sum(f for _, f in before) + sum(_rows(a)[1] for a in after)) % _MOD
    assert (rows, fp) == fingerprint(x, y)  # every row once
    # cut afresh (the rule before virtual shards) the same epoch takes other rows: the check above can fail
    fresh = [_rows(data.batches(global_batch // goes_on, rank=k, size=goes_on, skip=skip, **kw)) for k in range(goes_on)]
    assert (sum(f for _, f in before) + sum(f for _, f in fresh)) % _MOD != fingerprint(x, y)[1]


def test_a_partition_staged_with_its_shards_gives_the_batches_each_shard_had():
    """Two partitions read by two ranks, then both in one partition, each row marked with its first partition (the
    driver's staging: DataFrameDataset.stage_resumed): from batch 3 on, the one rank's batches are the two ranks',
    put together."""
    x, y = _data(64)
    reader = ArrowShard((TensorColumns(("x",), (3,)),), (TensorColumns(("y",)),), True)

    def table(rows):
        return pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x[rows].ravel()), 3), "y": pa.array(y[rows])})

    halves = [np.arange(0, 32), np.arange(32, 64)]
    kw = dict(epoch=1, seed=9, shuffle=True, steps=4, training=True)
    alone = [reader(table(h).to_batches(), v).batches(8, rank=v, size=2, skip=3, **kw) for v, h in enumerate(halves)]
    staged = pa.concat_tables([table(h).append_column(SHARD_COLUMN, pa.array([v] * len(h), pa.int32()))
                               for v, h in reversed(list(enumerate(halves)))])  # the shuffle's blocks in any order
    both = ShardedArrowShard(reader, 2)(staged.to_batches(max_chunksize=10), 0)
    assert sorted(both.parts) == [0, 1] and len(both) == 64
    together = list(resumed_batches(both, 16, shards=2, rank=0, size=1, skip=3, **kw))
    want = [(np.concatenate([a[0][0], b[0][0]]), np.concatenate([a[1], b[1]])) for a, b in zip(*alone)]
    assert len(together) == len(want) == 1
    for (f, labels), (wf, wl) in zip(together, want):
        np.testing.assert_array_equal(f[0], wf)
        np.testing.assert_array_equal(labels, wl)
    # the epochs after: the shards' rows as one partition, in shard order
    np.testing.assert_array_equal(both.whole.features[0], x)


def test_data_that_cannot_give_another_ranks_shard_is_cut_afresh_and_says_so(caplog):
    x, y = _data(32)
    one_partition = ArrayDataset([x], [y], True, presharded=True)
    with caplog.at_level(logging.WARNING, logger="tfnet.spark.worker"):
        got = list(resumed_batches(one_partition, 8, shards=2, rank=0, size=1, skip=1, epoch=0, seed=0, steps=4))
    assert len(got) == 3
    assert "began on 2 rank(s) and goes on on 1" in caplog.text and "cannot give another rank's shard" in caplog.text


def test_partition_keys_land_in_their_partitions():
    # Spark's hash() of these ints (pyspark.sql.functions.hash over spark.range(...).cast("int")); the Spark test
    # tests/optim/spark/test_virtual_shards_stage.py checks the staging itself
    assert [spark_hash_int(v) for v in (0, 1, 2, 42, -1)] == [933211791, -559580957, 1765031574, 29417773, -1604776387]
    for n in (1, 2, 3, 4, 8):
        keys = partition_keys(n)
        assert [spark_hash_int(k) % n for k in keys] == list(range(n))


def test_train_resumes_an_epoch_two_ranks_began_with_their_shards(tmp_path, monkeypatch):
    """A checkpoint at batch 3 of epoch 0 that says two ranks began the epoch (16 rows a step each): one rank resumes
    it with their shards, 32 rows a step, and its tally of the epoch from batch 3 is the two shards' rows from there."""
    import optim.training.notice as N

    monkeypatch.setattr(N, "NOTICE_EVERY_S", 0.0)  # ask at every step, so that the notice's step is known here
    x, y = digits.load()
    x, y = x[:256], y[:256]
    first = TrainConfig(epochs=1, batch_size=32, model_dir=str(tmp_path / "a"), run_id="20261201-000000-000000-aaaa",
                        seed=3, shuffle=True)
    at = [0]

    class Steps(Reporter):
        def step(self, step, epoch, logs):
            at[0] = step

    stopped = train(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.Adam(0.01), [],
                    ArrayDataset.from_tensors((x, y)), first, reporter=Steps(), notice_check=lambda: at[0] >= 3)
    assert stopped.stopped and stopped.step == 3
    manager = CheckpointManager(str(tmp_path / "a" / "checkpoints"), run_id=first.run_id)
    ckpt = CheckpointManager.load(manager.path_for(3))
    assert (ckpt.epoch, ckpt.batch, ckpt.extra["epoch_shards"]) == (0, 3, 1)
    ckpt.extra.update(epoch_shards=2, epoch_steps=8)  # as two ranks of 16 rows a step would have written it
    ckpt.extra.pop("run_id")
    resume_from = str(tmp_path / "two-ranks.npz")
    CheckpointManager(str(tmp_path / "b"), run_id=None).save(ckpt)
    import shutil

    shutil.copy(CheckpointManager(str(tmp_path / "b")).path_for(3), resume_from)
    data = ArrayDataset.from_tensors((x, y))
    tally = EpochTally(data, str(tmp_path / "epochs.json"))
    again = TrainConfig(epochs=1, batch_size=32, model_dir=str(tmp_path / "c"), run_id="20261201-000000-000000-cccc",
                        seed=3, shuffle=True, resume=resume_from)
    done = train(TFNet.from_keras(digits.cnn(classes=10, seed=0)), SCE, optim.Adam(0.01), [], tally, again)
    assert done.start_step == 3 and done.step == 8
    record = tally.epochs[0]
    want = [_rows(data.batches(16, rank=v, size=2, epoch=0, seed=3, shuffle=True, skip=3, steps=8)) for v in (0, 1)]
    assert (record["from_batch"], record["batches"], record["shards"]) == (3, 5, 2)
    assert (record["rows"], record["fingerprint"]) == (sum(r for r, _ in want), sum(f for _, f in want) % _MOD)


def test_a_streamed_partition_staged_with_its_shards_stores_each_as_its_rank_did(tmp_path):
    """Each shard of a streamed partition goes to a local copy of its own, numbered, checked and cut into blocks as its
    own rank stored it: from batch 2 on the resumed epoch's batches are the two ranks', put together; the epochs after
    take each row once, 16 rows of each shard a step."""
    from optim.data.partition import StreamShard
    from optim.data.virtual_shards import ShardedStreamShard

    x, y = _data(200)
    reader = StreamShard((TensorColumns(("x",), (3,)),), (TensorColumns(("y",)),), True, None, 48, 1, 20)

    def table(rows):
        return pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x[rows].ravel()), 3), "y": pa.array(y[rows])})

    halves = [np.arange(0, 100), np.arange(100, 200)]
    kw = dict(epoch=3, seed=4, shuffle=True, steps=7, training=True)
    alone = [reader.spool(table(h).to_batches(max_chunksize=33), v, str(tmp_path), f"r{v}") for v, h in
             enumerate(halves)]
    staged = pa.concat_tables([table(h).append_column(SHARD_COLUMN, pa.array([v] * len(h), pa.int32()))
                               for v, h in enumerate(halves)])
    both = ShardedStreamShard(reader, 2, 1).spool(staged.to_batches(max_chunksize=17), 0, str(tmp_path), "both")
    try:
        assert both.rows_on(0, 1) == 200 and both.num_batches(32) == 7
        want = [(np.concatenate([a[0][0], b[0][0]]), np.concatenate([a[1], b[1]]))
                for a, b in zip(*(d.batches(16, rank=v, size=2, skip=2, **kw) for v, d in enumerate(alone)))]
        got = list(resumed_batches(both, 32, shards=2, rank=0, size=1, skip=2, **kw))
        assert len(got) == len(want) == 5
        for (f, labels), (wf, wl) in zip(got, want):
            np.testing.assert_array_equal(f[0], wf)
            np.testing.assert_array_equal(labels, wl)
        later = list(both.batches(32, rank=0, size=1, epoch=4, seed=4, shuffle=True, steps=7, training=True))
        rows = np.concatenate([f[0] for f, _ in later])
        assert len(rows) == 224 and {tuple(r) for r in rows} == {tuple(r) for r in x}  # 7 steps: 12 rows wrap
    finally:
        both.release()
        for d in alone:
            d.release()
