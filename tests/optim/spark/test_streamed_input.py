"""Streamed training data over a real local[2] Spark with two Horovod ranks: a rank's memory does not grow
with its rows, the streamed path equals the in-memory one, a killed rank resumes mid-epoch bit for bit
from a fresh read of Spark, Parquet read by the ranks equals the same rows from a DataFrame (a local
folder and S3 on a moto server), and a full local disk is a typed error that leaves nothing."""

import glob
import json
import os
import warnings

import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.optim.spark.test_object_store import s3  # noqa: F401 (the moto S3 server fixture)
from tests.spark_utils import BIT_FOR_BIT, kill_rank_after_checkpoints, own_python_workers, png_frame
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def cnn_net(seed=0):
    return TFNet.from_keras(digits.cnn(classes=10, seed=seed))


def digits_df(spark, x, y, partitions=2):
    """The digits as a DataFrame, rows in order, ``partitions`` contiguous parts."""
    import pyarrow as pa

    n = len(x)
    flat = x.reshape(n, -1).astype(np.float32)
    pixels = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * flat.shape[1]), pa.array(flat.ravel()))
    table = pa.table({"i": pa.array(np.arange(n)), "pixels": pixels, "label": pa.array(y.astype(np.int64))})
    df = spark.createDataFrame(table)
    return df.repartitionByRange(partitions, "i").sortWithinPartitions("i").drop("i")


def rank_infos(model_dir):
    out = {}
    for path in glob.glob(os.path.join(str(model_dir), "ranks", "*", "rank-*.json")):
        with open(path) as f:
            info = json.load(f)
        out[(info["run_id"], info["rank"])] = info
    return out


def same_weights(a, b):
    wa, wb = a.get_weights(), b.get_weights()
    assert wa.keys() == wb.keys()
    for name, w in wa.items():
        np.testing.assert_array_equal(wb[name], w, err_msg=name)


def test_streamed_equals_in_memory_and_leaves_no_local_copy(spark, tmp_path):
    """Unshuffled, the two paths feed the same batches (a short rank wraps around in both), so the weights
    are equal bit for bit; the local copies were on disk while the ranks trained and are gone after."""
    x, y = digits.load()
    df = digits_df(spark, x[:203], y[:203])
    nets = {}
    with own_python_workers(spark, BIT_FOR_BIT):  # compared bit for bit: workers with one pool size
        for streaming in (True, False):
            data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)},
                                            streaming=streaming)
            nets[streaming] = cnn_net()
            opt = TFOptimizer(nets[streaming], SCE, optim.SGD(0.05, momentum=0.9),
                              model_dir=str(tmp_path / str(streaming)))
            opt.optimize(data, epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
            assert opt.last_run["rows"] == [102, 101] and opt.last_run["steps_per_epoch"] == 7
    same_weights(nets[True], nets[False])
    infos = rank_infos(tmp_path / "True")
    copies = [p for info in infos.values() for p in info["local_copies"]]
    assert len(copies) == 2 and all(info["local_copy_bytes"] > 0 for info in infos.values())
    assert not [p for p in copies if os.path.exists(p)], "every local copy is removed"
    assert all("local_copies" not in info for info in rank_infos(tmp_path / "False").values())


def small_cnn():
    import keras

    keras.utils.set_random_seed(0)
    return TFNet.from_keras(keras.Sequential([
        keras.Input((64, 64, 3), name="image"), keras.layers.Rescaling(1 / 255.0),
        keras.layers.Conv2D(8, 3, strides=2, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, name="logits")]))


def peak_rss(spark, tmp_path, rows, streaming):
    model_dir = tmp_path / f"{rows}-{streaming}"
    data = TFDataset.from_dataframe(png_frame(spark, rows), "image", "label", feature_shapes={"image": (64, 64, 3)},
                                    streaming=streaming)
    opt = TFOptimizer(small_cnn(), SCE, optim.SGD(0.01), model_dir=str(model_dir))
    opt.optimize(data, epochs=1, batch_size=64, num_workers=2, verbose=0)
    assert sum(opt.last_run["rows"]) == rows
    infos = rank_infos(model_dir)
    assert len(infos) == 2
    return max(info["peak_rss_bytes"] for info in infos.values())


def test_a_ranks_memory_does_not_grow_with_its_rows(spark, tmp_path):
    """4,000 and 16,000 PNG rows over 2 ranks, one epoch: the larger adds to a rank's peak RSS (VmHWM of its Python
    worker, in its rank info) at most 60% of what the rank's 6,000 more rows take decoded (float32, 281 MiB). Held in
    memory they added 1,020 MiB here; streamed, 105-116 MiB (most of it the pages of the local copy its reads map).
    The bound is on the growth, not a ratio of the peaks: workers forked from tfnet's daemon start about 250 MiB
    smaller (optim.spark.worker_daemon), and the same growth over that smaller peak read as +17% (ci25)."""
    small = peak_rss(spark, tmp_path, 4000, True)
    large = peak_rss(spark, tmp_path, 16000, True)
    decoded = (16000 - 4000) // 2 * 64 * 64 * 3 * 4
    assert large - small <= 0.6 * decoded, f"peak RSS per rank: {small / 2**20:.0f} MiB at 4,000 rows, " \
        f"{large / 2**20:.0f} MiB at 16,000 (the extra rows decoded: {decoded / 2**20:.0f} MiB)"


def test_a_killed_rank_resumes_mid_epoch_bit_for_bit_from_a_fresh_read(spark, tmp_path):
    """Rank 1's Python process is killed mid-epoch (after step 8 of 32, with shuffling): the retry's new
    process has no local copy, reads its partition from Spark again, resumes at the checkpoint's batch in the
    same order, and the run ends with the weights of a run that was never interrupted, bit for bit. The
    killed process's local copy is swept by the retry; none is left at the end."""
    x, y = digits.load()
    df = digits_df(spark, x[:512], y[:512])

    def data():
        return TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)}, shuffle_buffer=64)

    # fresh Python workers: each rank's TensorFlow starts with the rank's own thread pools (1, 1), as the
    # retry's new process does; a worker reused from an earlier test's predictor kept TensorFlow's default
    # pools, and its conv sums differed from the new process's in the last bit (as CI once saw)
    with own_python_workers(spark, BIT_FOR_BIT):
        straight = cnn_net()
        TFOptimizer(straight, SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(tmp_path / "straight")).optimize(
            data(), epochs=2, batch_size=32, num_workers=2, checkpoint_every=4, verbose=0)
        model_dir = tmp_path / "killed"
        net = cnn_net()
        opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(model_dir))
        # after the second checkpoint (step 8): eight steps before the epoch's end, so that the newest
        # checkpoint is still mid-epoch when the process dies on a loaded machine (after the third, it was not)
        killed = kill_rank_after_checkpoints(str(model_dir), checkpoints=2)
        with pytest.warns(RuntimeWarning,
                          match="Training stage attempt 1 failed.*retrying from this run's newest checkpoint"):
            opt.optimize(data(), epochs=2, batch_size=32, num_workers=2, checkpoint_every=4, keep_checkpoints=100,
                         verbose=0, timeout=60, max_retries=2)
    pools = {tuple(info["tf_threads"]) for d in (tmp_path / "straight", model_dir)
             for info in rank_infos(d).values()}
    assert pools == {(1, 1)}, f"every rank of both runs ran TensorFlow on its own pools of 1 thread: {pools}"
    killed["thread"].join(5)
    assert "pid" in killed and opt.last_run["attempts"] == 2
    resumed = CheckpointManager.load(opt.last_run["resumed_from"])
    assert resumed.step >= 8 and resumed.batch % 16 != 0, f"the retry resumed mid-epoch, not at {resumed.step}"
    assert opt.global_step == 32
    same_weights(straight, net)
    copies = {p for info in rank_infos(model_dir).values() for p in info.get("local_copies", [])}
    folder = os.path.dirname(next(iter(copies)))
    assert not [n for n in os.listdir(folder) if opt.last_run["run_id"] in n], "no local copy is left"


def exact_df(spark, x, y, sizes):
    """A DataFrame of the digits whose partitions hold exactly ``sizes`` rows, in order."""
    from pyspark.sql import Row

    rows = [Row(pixels=x[i].ravel().tolist(), label=int(y[i])) for i in range(sum(sizes))]
    chunks = np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1])
    parts = [[rows[i] for i in c] for c in chunks]
    rdd = spark.sparkContext.parallelize(range(len(sizes)), len(sizes)).flatMap(lambda i, p=parts: p[i])
    df = spark.createDataFrame(rdd, "pixels array<float>, label long")
    assert df.rdd.glom().map(len).collect() == list(sizes)
    return df


def write_parquet(x, y, write, row_group=40):
    """The digits as two Parquet files (rows 0-119 and the rest) of ``row_group``-row groups, through
    ``write(name, table, row_group)``; a Spark-style ``_SUCCESS`` file beside them."""
    import pyarrow as pa

    flat = x.reshape(len(x), -1).astype(np.float32)
    for name, rows in (("part-0.parquet", slice(0, 120)), ("part-1.parquet", slice(120, len(x)))):
        pixels = pa.array(list(flat[rows]), pa.list_(pa.float32()))
        write(name, pa.table({"pixels": pixels, "label": pa.array(y[rows].astype(np.int64))}), row_group)


def test_parquet_read_by_the_ranks_equals_the_same_rows_from_a_dataframe(spark, tmp_path, s3):  # noqa: F811
    """Rank r reads rows [r * N / 2, (r + 1) * N / 2) of the files (row groups straddle the ranks), with no
    Spark job for the data; unshuffled, that is the DataFrame with those rows in its two partitions: the
    same weights bit for bit from a local folder, and the same evaluation from S3 (moto)."""
    import pyarrow.parquet as pq
    import s3fs

    x, y = digits.load()
    x, y = x[:200], y[:200]
    folder = tmp_path / "digits"
    folder.mkdir()
    write_parquet(x, y, lambda name, table, rg: pq.write_table(table, str(folder / name), row_group_size=rg))
    (folder / "_SUCCESS").write_bytes(b"")
    endpoint, options = s3
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="testing", secret="testing",
                           skip_instance_cache=True)
    write_parquet(x, y, lambda name, table, rg: pq.write_table(table, f"tfnet/digits/{name}", row_group_size=rg,
                                                                 filesystem=fs))
    sources = {
        "dataframe": TFDataset.from_dataframe(exact_df(spark, x, y, [100, 100]), "pixels", "label",
                                              feature_shapes={"pixels": (8, 8, 1)}),
        "local": TFDataset.from_parquet(str(folder), "pixels", "label", feature_shapes={"pixels": (8, 8, 1)}),
        "s3": TFDataset.from_parquet("s3://tfnet/digits", "pixels", "label", feature_shapes={"pixels": (8, 8, 1)},
                                     storage_options=options),
    }
    assert sources["local"].pieces(1, 2) == [(0, 2, 20, 40), (1, 0, 0, 40), (1, 1, 0, 40)]
    opts = {}
    with own_python_workers(spark, BIT_FOR_BIT):  # compared bit for bit: workers with one pool size
        for name in ("dataframe", "local"):
            opts[name] = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05, momentum=0.9), metrics=["accuracy"])
            opts[name].optimize(sources[name], epochs=1, batch_size=32, shuffle=False, num_workers=2, verbose=0)
            assert opts[name].last_run["rows"] == [100, 100] and opts[name].last_run["steps_per_epoch"] == 7
    same_weights(opts["dataframe"].net, opts["local"].net)
    # S3 through the ranks' reads of a distributed evaluation (after the trainings: a Python worker that
    # evaluated first may run a later rank with other thread pools)
    evals = {name: opts["dataframe"].evaluate(sources[name], num_workers=2) for name in ("dataframe", "s3")}
    assert evals["s3"]["accuracy"] == evals["dataframe"]["accuracy"]
    assert evals["s3"]["loss"] == pytest.approx(evals["dataframe"]["loss"], rel=1e-6)
    assert sources["s3"].pieces(0, 2) == sources["local"].pieces(0, 2)
    with pytest.raises(optim.DataError, match=r"No Parquet files at '.*nowhere': it does not exist"):
        TFDataset.from_parquet(str(tmp_path / "nowhere"), "pixels", "label")
    with pytest.raises(optim.ColumnError, match=r"Column 'pixel' is not among the data's columns \[.*\]; closest: \['pixels'\]"):
        TFDataset.from_parquet(str(folder), "pixel", "label")


def test_a_full_local_disk_is_a_typed_error_that_is_not_retried_and_leaves_nothing(spark, tiny_tmpfs):
    """The ranks' local copies go to a 64 KiB tmpfs, too small for 512 rows of digits: optimize() raises the
    ranks' StorageError (a rerun would fail the same way: one attempt), and the folder is left empty."""
    from optim.errors import StorageError

    x, y = digits.load()
    data = TFDataset.from_dataframe(digits_df(spark, x[:512], y[:512]), "pixels", "label",
                                    feature_shapes={"pixels": (8, 8, 1)}, local_dir=str(tiny_tmpfs))
    opt = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(StorageError, match=r"The local copy of this rank's partition cannot be kept: "
                                               rf"{tiny_tmpfs}/tfnet-spool is full \(No space left on device\); it "
                                               r"needed at least \d+ bytes"):
            opt.optimize(data, epochs=1, batch_size=32, num_workers=2, verbose=0, max_retries=2)
    assert not [w for w in seen if "retrying" in str(w.message)], "not retried"
    assert os.listdir(tiny_tmpfs / "tfnet-spool") == []
