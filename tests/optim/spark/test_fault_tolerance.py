"""Fault tolerance over a real local[2] Spark with two Horovod ranks: run identity (a retry never
takes another run's checkpoint), liveness that measures liveness (a slow validation is not a dead
rank), exact distributed metrics, typed errors across Spark, and no leaks across calls."""

import glob
import json
import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests import digits
from tests.spark_utils import BIT_FOR_BIT, own_python_workers
from tfnet import TFNet, TFNetError

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def cnn_net(seed=0):
    return TFNet.from_keras(digits.cnn(classes=10, seed=seed))


def _kill_rank_of_new_run(model_dir, old_runs: set, rank: int = 1, deadline_s: float = 240):
    """Kills ``rank``'s Python process as soon as a run not in ``old_runs`` has written its rank
    file (before its first step, so before any checkpoint of its own). Returns a dict that gets
    ``pid`` and ``run``."""
    killed: dict = {}

    def killer():
        deadline = time.time() + deadline_s
        while time.time() < deadline and "pid" not in killed:
            for path in glob.glob(os.path.join(model_dir, "ranks", "*", f"rank-{rank}.json")):
                run = os.path.basename(os.path.dirname(path))
                if run not in old_runs:
                    killed["ckpts_then"] = glob.glob(os.path.join(model_dir, "checkpoints", run, "*.npz"))
                    killed["pid"] = json.loads(open(path).read())["pid"]
                    killed["run"] = run
                    os.kill(killed["pid"], signal.SIGKILL)
                    break
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    killed["thread"] = thread
    return killed


def test_a_retry_never_resumes_another_runs_checkpoint(spark, tmp_path):
    """Two runs in one model_dir (a notebook re-run): the second loses a rank before its first
    checkpoint. Its retry starts afresh (its own run has no checkpoint) instead of loading the first
    run's last one, so its result is its own: equal to an uninterrupted second run, bit for bit."""
    x, y = digits.load()
    x, y = x[:256], y[:256]
    model_dir = str(tmp_path / "shared")
    with own_python_workers(spark, BIT_FOR_BIT):  # compared bit for bit: workers with one pool size
        first = TFOptimizer(cnn_net(0), SCE, optim.SGD(0.05, momentum=0.9), model_dir=model_dir)
        first.optimize((x, y), epochs=2, batch_size=32, num_workers=2, verbose=0)
        killed = _kill_rank_of_new_run(model_dir, {first.last_run["run_id"]})
        second = TFOptimizer(cnn_net(1), SCE, optim.SGD(0.05, momentum=0.9), model_dir=model_dir)
        with pytest.warns(RuntimeWarning, match="Training stage attempt 1 failed"):
            h_second = second.optimize((x, y), epochs=2, batch_size=32, num_workers=2, verbose=0, timeout=60)
        killed["thread"].join(5)
        straight = TFOptimizer(cnn_net(1), SCE, optim.SGD(0.05, momentum=0.9))
        h_straight = straight.optimize((x, y), epochs=2, batch_size=32, num_workers=2, verbose=0)
    assert "pid" in killed and killed["ckpts_then"] == [], "rank 1 died before the run's first checkpoint"
    assert second.last_run["attempts"] == 2 and second.last_run["run_id"] == killed["run"]
    assert second.last_run["resumed_from"] is None and second.last_run["attempt_log"][-1]["start_step"] == 0
    for name, w in straight.net.get_weights().items():
        assert np.array_equal(second.net.get_weights()[name], w), name
        assert not np.array_equal(first.net.get_weights()[name], w), name
    assert h_second == h_straight
    # both runs keep their own checkpoints; neither pruned the other's
    runs = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    assert runs == sorted([first.last_run["run_id"], second.last_run["run_id"]])


def test_validation_slower_than_the_timeout_finishes_in_one_attempt(spark, tmp_path):
    """Validation outlasts `timeout` (4 s) on each rank: a forward hook holds each eager batch until the rank's
    watchdog has checked twice since the batch began (its checks are at least 1 s apart: 7 batches per rank, 7 s
    or more), and leaves a file for each; the compiled training step traces it once, without waiting. The wait is
    on the watchdog's own checks, not a sleep raced against the bound: every check it made during validation found
    the rank within its bound, since the watchdog is kicked per validation batch and the wait for the other rank's
    validation has the long bound: one attempt."""
    x, y = digits.load()
    net = cnn_net()
    slept = tmp_path / "slept"
    slept.mkdir()

    def slow(outputs, folder=str(slept)):
        import tempfile

        import tensorflow as tf

        from optim.rank.watchdog import Watchdog

        if not tf.executing_eagerly():
            return
        if not hasattr(Watchdog, "checks"):  # count the watchdog's checks in this rank's process
            Watchdog.checks, overdue = 0, Watchdog.overdue

            def counted(self):
                Watchdog.checks += 1
                return overdue(self)

            Watchdog.overdue = counted
        start, deadline = Watchdog.checks, time.monotonic() + 60
        while Watchdog.checks < start + 2:
            assert time.monotonic() < deadline, "the watchdog made no checks in 60 s"
            time.sleep(0.01)
        tempfile.NamedTemporaryFile(dir=folder, delete=False).close()

    handle = net.register_forward_hook(slow)
    opt = TFOptimizer(net, SCE, optim.SGD(0.05), metrics=["accuracy"])
    history = opt.optimize((x[:128], y[:128]), epochs=1, batch_size=32, validation_data=(x[:224], y[:224]),
                           num_workers=2, verbose=0, timeout=4, max_retries=0)
    handle.remove()
    assert opt.last_run["attempts"] == 1
    # 7 validation batches of 16 per rank, each held over two of the watchdog's checks
    assert len(history["val_loss"]) == 1 and len(list(slept.iterdir())) == 2 * 7


def test_distributed_validation_metrics_equal_local_ones(spark):
    """Metric states are sums: the validation accuracy of a 2-rank run (uneven shards of 301
    rows, a partial batch) equals, exactly, the local evaluation with the final weights."""
    x, y = digits.load()
    opt = TFOptimizer(cnn_net(), SCE, optim.SGD(0.05), metrics=["accuracy"])
    history = opt.optimize((x[:256], y[:256]), epochs=1, batch_size=32, validation_data=(x[1000:1301], y[1000:1301]),
                           num_workers=2, verbose=0)
    local = opt.evaluate((x[1000:1301], y[1000:1301]), batch_size=16)
    assert history["val_accuracy"][-1] == local["accuracy"]
    assert history["val_accuracy"][-1] * 301 == pytest.approx(round(history["val_accuracy"][-1] * 301), abs=1e-9)
    assert history["val_loss"][-1] == pytest.approx(local["loss"], rel=1e-6)


def test_errors_keep_their_types_across_spark(spark):
    """A bad row in training data raises BadRowError (a TFNetError) from optimize(); a bad row in a
    lazy prediction raises BadRowError from the user's own action (also Spark's own class), and
    from_spark_error / raise_tfnet_errors, which did that conversion before, still give it back."""
    from optim import TFPredictor
    from optim.errors import BadRowError, from_spark_error, raise_tfnet_errors
    from tfnet.errors import InputSpecError

    bad = spark.createDataFrame([([0.0] * 64, 1), ([0.0] * 63, 2)] * 4, "pixels array<float>, label long")
    data = optim.TFDataset.from_dataframe(bad.repartition(2), "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    opt = TFOptimizer(cnn_net(), SCE, optim.SGD(0.1))
    with pytest.raises(BadRowError, match=r"Column 'pixels' row \d+ of partition \d has 63 values; expected 64"):
        opt.optimize(data, batch_size=2, num_workers=2, verbose=0)
    predictor = TFPredictor(opt.net, batch_per_thread=4)
    with pytest.raises(InputSpecError):  # numpy: raised directly, a TFNetError
        predictor.predict(np.zeros((2, 7, 7, 1), np.float32))
    scored = predictor.predict(bad, feature_cols="pixels")  # lazy: nothing runs yet
    with pytest.raises(BadRowError, match="the array has 63 values; input") as caught:
        scored.collect()
    assert isinstance(caught.value, TFNetError) and caught.value.spark_error is not None
    assert from_spark_error(caught.value) is caught.value
    err = from_spark_error(caught.value.spark_error)  # Spark's own exception, as before
    assert type(err) is BadRowError and "the array has 63 values; input" in str(err)
    with pytest.raises(BadRowError, match="the array has 63 values"):
        with raise_tfnet_errors():
            scored.collect()
    with pytest.raises(ZeroDivisionError):  # other errors pass unchanged
        with raise_tfnet_errors():
            1 / 0  # noqa: B018


def _no_such_class():
    raise TypeError("Could not locate class 'HalfSquares'. Make sure custom classes and functions are decorated with "
                    "`@keras.saving.register_keras_serializable()`.")


class _DriverOnlyLoss:
    """A loss the driver pickles and no worker can unpickle, as a class only the driver's Python has (a notebook's,
    pickled as Keras pickles its objects) is read on a worker."""

    def __call__(self, y_true, y_pred):
        return SCE(y_true, y_pred)

    def __reduce__(self):
        return (_no_such_class, ())


def test_a_job_the_workers_cannot_unpickle_fails_once_with_their_reason(spark, recwarn):
    """Before: three attempts and "the stage failed with no report from a rank (An error occurred while calling
    o1066.collectToPython.)"; PySpark's worker fails reading the job, before any of tfnet's code runs there."""
    opt = TFOptimizer(cnn_net(), _DriverOnlyLoss(), optim.SGD(0.1))
    x, y = (a[:16] for a in digits.load())
    with pytest.raises(optim.errors.DistributedTrainingError,
                       match=r"^Training failed: the workers could not unpickle the training job \(TypeError: Could "
                             r"not locate class 'HalfSquares'"):
        opt.optimize((x, y), batch_size=4, num_workers=2, verbose=0)
    assert not [w for w in recwarn if "retrying" in str(w.message)], "retried what cannot succeed"


def _driver_resources(sc):
    import psutil

    me = psutil.Process()
    spark_tmp = sc._temp_dir
    files = [p for p in glob.glob(os.path.join(spark_tmp, "**"), recursive=True) if os.path.isfile(p)]
    ours = sorted(n for n in os.listdir(tempfile.gettempdir()) if n.startswith("tfnet-exchange-"))
    return {"spark_tmp_files": len(files), "exchange_dirs": ours, "threads": threading.active_count(),
            "sockets": len(me.net_connections(kind="inet"))}


def test_five_calls_leave_nothing_behind(spark, tmp_path, monkeypatch):
    """optimize() five times in one process, one of them failing in its stage (NaN loss) and one
    before it (a bad batch size): the driver's temporary files (broadcasts, exchange folders),
    threads and open sockets come back to where they were."""
    x, y = digits.load()
    x, y = x[:128], y[:128]
    import tensorflow as tf

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))  # this process's temporary files only

    net = cnn_net()
    opt = TFOptimizer(net, SCE, optim.SGD(0.05), model_dir=str(tmp_path))
    nan_opt = TFOptimizer(net, lambda t, o: SCE(t, o) * tf.constant(float("nan")), optim.SGD(0.05),
                          model_dir=str(tmp_path))
    opt.optimize((x, y), epochs=1, batch_size=32, num_workers=2, verbose=0)  # warm: Py4J's pool, workers
    sc = spark.sparkContext
    before = _driver_resources(sc)
    for i in range(5):
        if i == 2:
            with pytest.raises(optim.NonFiniteLossError):
                nan_opt.optimize((x, y), epochs=1, batch_size=32, num_workers=2, verbose=0)
        elif i == 3:
            with pytest.raises(ValueError, match="must split evenly"):
                opt.optimize((x, y), epochs=1, batch_size=33, num_workers=2, verbose=0)
        else:
            opt.optimize((x, y), epochs=1, batch_size=32, num_workers=2, verbose=0)
    deadline = time.time() + 20
    after = _driver_resources(sc)
    while after != before and time.time() < deadline:
        time.sleep(0.5)
        after = _driver_resources(sc)
    assert after == before
    assert not glob.glob(str(tmp_path / ".exchange" / "*"))
