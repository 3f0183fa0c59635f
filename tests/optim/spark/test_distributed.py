"""Distributed fine-tuning on a real local[2] Spark with two Horovod ranks over Gloo."""

import glob
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from optim.launch.launcher import DistributedTrainingError, scale_learning_rate
from optim.shares import agree_steps
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tests.elastic_checks import data_fingerprint, stitched_epochs
from tests.spark_utils import BIT_FOR_BIT, kill_rank_after_checkpoints, own_python_workers
from tfnet import TFNet, TFNetError

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def cnn_net(seed=0):
    return TFNet.from_keras(digits.cnn(classes=10, seed=seed))


def rel(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)


def test_two_ranks_equal_one_rank(spark):
    """Global batch 32: two ranks of 16 and one rank of 32 see the same rows at every step
    (numpy data is sharded row by row), so the weights agree up to float32 reduction order."""
    x, y = digits.load()
    x, y = x[:256], y[:256]
    nets = {}
    for workers in (1, 2):
        net = cnn_net()
        opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), metrics=["accuracy"])
        history = opt.optimize((x, y), epochs=2, batch_size=32, shuffle=False, num_workers=workers, verbose=0)
        assert opt.global_step == 16
        assert len(history["loss"]) == 2
        nets[workers] = net.get_weights()
    local = cnn_net()
    TFOptimizer(local, SCE, optim.SGD(0.05, momentum=0.9)).optimize((x, y), epochs=2, batch_size=32,
                                                                    shuffle=False, verbose=0)
    for name, w in nets[1].items():
        assert rel(nets[2][name], w) < 1e-4, name
        assert rel(local.get_weights()[name], w) < 1e-4, name
        assert not np.array_equal(w, cnn_net().get_weights()[name]), "the weights moved"


def _digits_df(spark, x, y, partitions):
    """A DataFrame of digits with the given row count in each partition (0 = empty)."""
    from pyspark.sql import Row

    rows = [Row(pixels=x[i].ravel().tolist(), label=int(y[i])) for i in range(sum(partitions))]
    chunks, start = [], 0
    for n in partitions:
        chunks.append(rows[start:start + n])
        start += n
    rdd = spark.sparkContext.parallelize(range(len(partitions)), len(partitions)).flatMap(lambda i, c=chunks: c[i])
    df = spark.createDataFrame(rdd, "pixels array<float>, label long")
    assert df.rdd.glom().map(len).collect() == list(partitions)
    return df


@pytest.mark.parametrize("partitions", [[0, 60, 37], [90, 5], [9, 10]], ids=["empty", "uneven", "smaller-than-batch"])
def test_uneven_and_empty_partitions(spark, partitions):
    x, y = digits.load()
    df = _digits_df(spark, x, y, partitions)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    opt = TFOptimizer(cnn_net(), SCE, optim.Adam(0.01))
    history = opt.optimize(data, epochs=2, batch_size=32, num_workers=2, verbose=0, timeout=120)
    assert len(history["loss"]) == 2 and np.isfinite(history["loss"]).all()
    rows = opt.last_run["rows"]
    total = sum(partitions)
    # the plan: the rows rebalanced over the 2 ranks (round robin: sizes differ by at most one),
    # and every rank takes ceil(largest shard / 16) steps per epoch
    assert sum(rows) == total and len(rows) == 2 and max(rows) - min(rows) <= 1
    expected = {97: 4, 95: 3, 19: 1}[total]  # ceil(ceil(total / 2) / 16)
    assert opt.last_run["steps_per_epoch"] == expected
    assert opt.global_step == 2 * expected


def test_agree_steps_rule():
    assert agree_steps([100, 37], 10) == 10
    assert agree_steps([3, 5], 16) == 1
    with pytest.raises(TFNetError, match=r"Ranks \[1\] have no rows"):
        agree_steps([4, 0], 2)


def test_kill_one_rank_retries_and_finishes(spark, tmp_path):
    """Rank 1 killed mid-run, and the newest checkpoint then truncated (a torn write): the retry takes the newest
    checkpoint that loads, says once which one it passed over, and finishes equal to an unbroken run."""
    with own_python_workers(spark, BIT_FOR_BIT):
        x, y = digits.load()
        x, y = x[:512], y[:512]
        model_dir = tmp_path / "run"
        net = cnn_net()
        opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(model_dir))
        killed = kill_rank_after_checkpoints(str(model_dir), checkpoints=3, truncate_newest=True)  # after step 12 of 64
        with pytest.warns(RuntimeWarning, match="Training stage attempt 1 failed.*retrying from this run's newest checkpoint") \
                as warned:
            history = opt.optimize((x, y), epochs=4, batch_size=32, num_workers=2, checkpoint_every=4,
                                   keep_checkpoints=100, verbose=0, timeout=60, max_retries=2)
        assert [w.filename for w in warned if "retrying" in str(w.message)] == [__file__], "it points at the caller"
        killed["thread"].join(5)
        assert "pid" in killed and "truncated" in killed, "rank 1 was killed, and the newest checkpoint truncated"
        passed_over = [w for w in warned if issubclass(w.category, optim.CheckpointWarning)]
        assert len(passed_over) == 1 and passed_over[0].filename == __file__, [str(w.message) for w in warned]
        assert f"passing over a newer checkpoint: Skipping checkpoint {killed['truncated']}: unreadable" in \
            str(passed_over[0].message), str(passed_over[0].message)
        run = opt.last_run
        assert run["attempts"] == 2
        assert opt.global_step == 4 * 16, "the run finishes with the planned number of steps"
        assert len(history["loss"]) == 4
        # the retry resumed from this run's own checkpoint, not from step 0: it ran fewer steps than the
        # 64 a restart would, and started exactly where that checkpoint stood
        resumed = run["resumed_from"]
        assert resumed and os.path.dirname(resumed) == str(model_dir / "checkpoints" / run["run_id"])
        assert resumed < killed["truncated"], "the retry took the checkpoint before the truncated one"
        start = CheckpointManager.load(resumed).step
        # killed with 3 checkpoints there (steps 4, 8, 12), the newest (12, or 16 if rank 0 wrote one more before
        # the truncation) cut: the one before it is 8 or later
        assert run["attempt_log"][-1]["start_step"] == start >= 8
        assert start == int(os.path.basename(killed["truncated"])[len("ckpt-"):-len(".npz")]) - 4, killed
        assert run["attempt_log"][-1]["end_step"] - start < 64
        # every row of every epoch trained exactly once, the epoch the kill interrupted included: attempt 1's rows up
        # to the checkpoint resumed from (each rank's record at that checkpoint) and attempt 2's rows after it
        infos = [json.load(open(p)) for p in glob.glob(str(model_dir / "ranks" / "*" / "epochs-a*-r*.json"))]
        whole = stitched_epochs(infos, 16)
        # attempts count from 0. Attempt 0 may have finished epoch 0 too: rank 1 killed only after the step-16
        # checkpoint (then truncated), the retry from step 12 trained steps 13-16 again; that epoch took every row once
        # as well, and the retry's own epoch 0 is stitched to attempt 0's first 12 steps
        assert sorted(set(whole) - {(0, 0)}) == [(1, 0), (1, 1), (1, 2), (1, 3)], sorted(whole)
        assert (0, 0) not in whole or killed["truncated"].endswith("ckpt-000000016.npz"), (sorted(whole), killed)
        assert set(whole.values()) == {data_fingerprint(x, y)}, whole
        # and it ends where an uninterrupted run of the same seed, data and ranks ends, bit for bit: the
        # weights and the momentum (a resume that lost the momentum, or restarted the epoch's order, differs)
        whole = cnn_net()
        unbroken = TFOptimizer(whole, SCE, optim.SGD(0.05, momentum=0.9), model_dir=str(tmp_path / "other"))
        unbroken.optimize((x, y), epochs=4, batch_size=32, num_workers=2, checkpoint_every=4, verbose=0)
        assert unbroken.last_run["attempts"] == 1 and unbroken.global_step == 64
        for (name, w), theirs in zip(net.get_weights().items(), whole.get_weights().values(), strict=True):
            assert np.array_equal(w, theirs), name
        assert len(opt.state) == len(unbroken.state) > 0
        for ours, theirs in zip(opt.state, unbroken.state):
            np.testing.assert_array_equal(ours, theirs)


def test_distributed_transfer_learning_on_digits(spark, tmp_path, monkeypatch):
    """Also tracked in MLflow (a local store): each epoch's metrics as rank 0 sent them, the ranks and the mode."""
    import re

    import keras
    import mlflow

    from optim.callbacks import MLflowLogger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracking = "file:" + str(tmp_path / "mlruns")

    x, y = digits.load(range(5))
    base = digits.cnn(classes=5)
    base.compile(optimizer=keras.optimizers.Adam(0.01),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pre = TFOptimizer.from_keras(base)
    pre.optimize((x, y), epochs=8, batch_size=32, verbose=0)
    body = TFNet.from_frozen_graph(pre.net.frozen_graph_def(), "image", "logits").cut("features")
    keras.utils.set_random_seed(1)
    net = body.add_head(keras.layers.Dense(10, name="digit"))
    (xtr, ytr), (xte, yte) = digits.split(*digits.load(range(5, 10)))
    df = spark.createDataFrame(
        [(xtr[i].ravel().tolist(), int(ytr[i])) for i in range(len(xtr))], "pixels array<float>, label long"
    ).repartition(2)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    opt = TFOptimizer(net, SCE, {"head/": optim.Adam(0.01), re.compile("^digits/"): optim.Adam(0.002)},
                      metrics=["accuracy"], model_dir=str(tmp_path))
    history = opt.optimize(data, epochs=8, batch_size=32, validation_data=(xte, yte), num_workers=2, verbose=0,
                           callbacks=[MLflowLogger(tracking_uri=tracking, log_model=False)])
    assert opt.evaluate((xte, yte))["accuracy"] >= 0.95, history
    client = mlflow.tracking.MlflowClient(tracking_uri=tracking)
    logged = client.get_run(opt.last_run["mlflow_run_id"])
    assert logged.data.params["num_workers"] == "2" and logged.data.tags["tfnet.mode"] == "classic"
    series = client.get_metric_history(opt.last_run["mlflow_run_id"], "val_accuracy")
    assert [m.step for m in series] == list(range(8)) and [m.value for m in series] == pytest.approx(
        history["val_accuracy"])
    assert history["val_accuracy"][-1] >= 0.95
    assert os.listdir(tmp_path / "tensorboard" / opt.last_run["run_id"] / "train"), "rank 0 writes TensorBoard events"
    assert opt.last_run["startup_s"] > 0


def test_a_tf_data_dataset_object_validates_on_the_ranks(spark, monkeypatch):
    """A ``tf.data.Dataset`` object given as validation data is collected to the driver as arrays
    (within a bound) and each rank validates its share, as Analytics Zoo users passed validation files.
    The epoch's ``val_`` figures equal an evaluation of the same rows with the same weights."""
    import tensorflow as tf

    from optim.launch.backends import classic

    x, y = digits.load()
    val = tf.data.Dataset.from_tensor_slices((x[300:400], y[300:400])).batch(16)
    opt = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05), metrics=["accuracy"])
    history = opt.optimize((x[:256], y[:256]), epochs=1, batch_size=32, validation_data=val, num_workers=2,
                           verbose=0)
    local = opt.evaluate((x[300:400], y[300:400]))
    np.testing.assert_allclose(history["val_loss"][-1], local["loss"], rtol=1e-5)
    assert history["val_accuracy"][-1] == local["accuracy"]
    monkeypatch.setattr(classic, "VALIDATION_ARRAYS_LIMIT", 16 << 10)  # the 100 rows hold 26 KB
    with pytest.raises(TypeError, match=r"more than 0 MiB.*Give TFDataset.from_tf_data\(fn\) instead"):
        opt.optimize((x[:256], y[:256]), epochs=1, batch_size=32, validation_data=val, num_workers=2, verbose=0)


def test_rdd_and_tf_data_inputs(spark):
    import tensorflow as tf

    x, y = digits.load()
    x, y = x[:200], y[:200]
    rdd = spark.sparkContext.parallelize([(x[i], int(y[i])) for i in range(len(x))], 2)
    opt = TFOptimizer(cnn_net(), SCE, optim.Adam(0.01), metrics=["accuracy"])
    history = opt.optimize(TFDataset.from_rdd(rdd), epochs=1, batch_size=20, num_workers=2, verbose=0)
    assert opt.global_step == 10 and len(history["accuracy"]) == 1  # 100 rows per rank, 10 per step

    def per_rank(rank, size, x=x, y=y):
        return tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).batch(10)

    opt2 = TFOptimizer(cnn_net(), SCE, optim.Adam(0.01))
    opt2.optimize(TFDataset.from_tf_data(per_rank), epochs=2, num_workers=2, verbose=0)
    assert opt2.global_step == 20


def test_a_tf_data_dataset_object_trains_over_the_ranks_as_a_function_building_its_shards_does(spark):
    """A ``tf.data.Dataset`` object goes to the ranks as its serialized graph and each rank takes its shard: the same
    weights, bit for bit, as ``from_tf_data(fn)`` with ``fn`` building the same shards there. A pipeline whose state
    cannot leave this process (a Python generator) is refused before any stage, with the fix."""
    import warnings

    import tensorflow as tf

    x, y = digits.load()
    x, y = x[:200], y[:200]

    def per_rank(rank, size, x=x, y=y):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(10).shard(size, rank)

    with own_python_workers(spark, BIT_FOR_BIT):
        given = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05, momentum=0.9))
        given.optimize(TFDataset.from_tf_data(tf.data.Dataset.from_tensor_slices((x, y)).batch(10)), epochs=2,
                       num_workers=2, verbose=0)
        built = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05, momentum=0.9))
        built.optimize(TFDataset.from_tf_data(per_rank), epochs=2, num_workers=2, verbose=0)
    assert given.global_step == built.global_step == 20  # 20 batches of 10, half on each rank, 2 epochs
    for (name, ours), theirs in zip(given.net.get_weights().items(), built.net.get_weights().values(), strict=True):
        np.testing.assert_array_equal(ours, theirs, err_msg=name)

    def rows():
        yield x[:10], y[:10]

    generated = tf.data.Dataset.from_generator(rows, output_signature=(
        tf.TensorSpec((None, 8, 8, 1), tf.float32), tf.TensorSpec((None,), tf.int64)))
    with warnings.catch_warnings(record=True) as seen, pytest.raises(TypeError) as refused:
        warnings.simplefilter("always")
        given.optimize(TFDataset.from_tf_data(generated), epochs=1, num_workers=2, verbose=0)
    assert str(refused.value) == (
        "This tf.data.Dataset cannot go to the Spark ranks: its pipeline holds state that stays in this process "
        "(PyFunc is stateful.; a Python generator or a tf.py_function). Pass TFDataset.from_tf_data(fn) with "
        "fn(rank, size) building each rank's dataset there, or numpy arrays."), str(refused.value)
    assert not [w for w in seen if "attempt" in str(w.message)], "refused before any stage, not retried"


def test_clear_errors(spark, monkeypatch):
    from optim.launch.backends import classic

    x, y = digits.load()
    opt = TFOptimizer(cnn_net(), SCE, optim.SGD(0.1))
    asked = []
    wait_for_slots = classic.wait_for_slots
    monkeypatch.setattr(classic, "wait_for_slots",
                        lambda sc, needed, wait_s: asked.append((needed, wait_s)) or wait_for_slots(sc, needed, wait_s))
    with pytest.raises(DistributedTrainingError, match=r"num_workers=3, but the cluster has 2 task slot\(s\)"):
        opt.optimize((x[:64], y[:64]), batch_size=30, num_workers=3, verbose=0)  # slot_wait: its default, 30 s
    assert asked == [(3, 0.0)], "a local master cannot grow: no wait for slots"
    with pytest.raises(ValueError, match=r"must split evenly over the 2 workers. Received: batch_size=31"):
        opt.optimize((x[:64], y[:64]), batch_size=31, num_workers=2, verbose=0)
    df = spark.createDataFrame([([0.0] * 64, 1)], "pixels array<float>, label long")
    with pytest.raises(optim.ColumnError, match=r"Column 'pixel' is not among the data's columns \['pixels', 'label'\]"):
        TFDataset.from_dataframe(df, "pixel", "label")
    bad = spark.createDataFrame([([0.0] * 64, 1), ([0.0] * 63, 2)] * 4, "pixels array<float>, label long")
    data = TFDataset.from_dataframe(bad.repartition(2), "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    with pytest.raises(ValueError, match=r"Column 'pixels' row \d+ of partition \d has 63 values; expected 64"):
        opt.optimize(data, batch_size=2, num_workers=2, verbose=0)


def test_nan_loss_is_not_retried(spark):
    import tensorflow as tf

    x, y = digits.load()
    nan_loss = lambda t, o: SCE(t, o) * tf.constant(float("nan"))  # noqa: E731
    opt = TFOptimizer(cnn_net(), nan_loss, optim.SGD(0.1))
    with pytest.raises(optim.NonFiniteLossError, match=r"Step 1 \(epoch 1, batch 1\)"):
        opt.optimize((x[:64], y[:64]), batch_size=32, num_workers=2, verbose=0)


def test_learning_rate_scaling_helper():
    assert scale_learning_rate(0.1, 4) == pytest.approx(0.4)
    assert scale_learning_rate(0.1, 4, "sqrt") == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"`rule` must be 'linear' or 'sqrt'"):
        scale_learning_rate(0.1, 2, "cubic")


def test_workers_without_tfnet_get_a_clear_error(tmp_path):
    """A Spark whose worker Python lacks tfnet (a fresh, empty virtual environment of this Python):
    a clear error, under pyspark's worker daemon and under tfnet's (optim.spark.worker_daemon, which that Python
    cannot even start), in a fresh process because a process holds one SparkContext."""
    import venv

    bare = tmp_path / "bare-venv"
    venv.EnvBuilder(with_pip=False).create(bare)
    python = str(bare / "bin" / "python")
    assert subprocess.run([python, "-c", "import numpy"], capture_output=True).returncode != 0, "an empty environment"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.getcwd()!r})
        import optim, numpy as np
        from optim.spark.session import SparkSetupError
        from tfnet import TFNet, TFNetError
        from tests import digits
        from pyspark.sql import SparkSession
        for daemon in ("pyspark.daemon", "optim.spark.worker_daemon"):
            spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                     .config("spark.driver.host", "127.0.0.1").config("spark.python.daemon.module", daemon).getOrCreate())
            opt = optim.TFOptimizer(TFNet.from_keras(digits.cnn(10)), "mse", optim.SGD(0.1))
            try:
                opt.optimize((np.zeros((8, 8, 8, 1)), np.zeros((8, 10))), batch_size=4, num_workers=2, verbose=0)
            except SparkSetupError as e:
                print("SETUP-ERROR", daemon, e)
            spark.stop()
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the workers must not find tfnet's source
    env["PYSPARK_PYTHON"] = python
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(tmp_path))
    errors = [line for line in proc.stdout.splitlines() if line.startswith("SETUP-ERROR ")]
    assert [line.split()[1] for line in errors] == ["pyspark.daemon", "optim.spark.worker_daemon"], \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    # pyspark's daemon: tfnet's probe task reports the failed import; tfnet's: the daemon itself cannot start
    assert all(f"The Spark workers' Python ({python}) cannot import tfnet" in line for line in errors), errors
    assert "No module named 'optim'" in errors[1] and "spark.python.daemon.module" in errors[1], errors[1]


def test_missing_java_and_horovod_give_clear_errors(monkeypatch):
    from optim.launch import preflight
    from optim.spark import session as spark_env

    monkeypatch.setenv("JAVA_HOME", "/nonexistent/jdk")
    with pytest.raises(spark_env.SparkSetupError, match=r"Spark needs Java 17 or newer, and no `java` was found"):
        spark_env.require_java()
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
    with pytest.raises(spark_env.SparkSetupError, match=r"Horovod is not installed in this Python.*build_horovod.sh"):
        preflight.check_driver_horovod()
