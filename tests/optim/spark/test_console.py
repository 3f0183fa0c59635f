"""What a new user's console shows around Spark, each program run as a process of its own with a plain
``SparkSession.builder...getOrCreate()`` (the user's session, not tfnet's) and everything it prints
captured, the Python workers' and the JVM's output included:

* the README's bad-row example prints a few lines (71 before: Spark's task-failure Java traces);
* ``show(3)`` and ``limit(n)`` after ``TFPredictor.predict`` print the rows only (pyspark's daemon printed
  a ``BrokenPipeError`` traceback for each worker whose output was left unread);
* a distributed run written to a log file: one line per epoch, no ``\\r``, and no ``[Stage`` bar from
  tfnet's background warm-up;
* Ctrl-C, once and twice: ``KeyboardInterrupt`` from the user's call in 5 lines (33 before, and 164
  more lines of py4j tracebacks for a second Ctrl-C).
"""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.console_checks import Program, assert_each_action_printed_its_own_output, user_env

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# The README's quick-start net and its bad-row example, then show(3) and limit(5) on a predicted DataFrame.
PREDICT = textwrap.dedent("""
    from tfnet import TFNet
    import keras
    import numpy as np
    import optim
    from optim import TFPredictor
    from pyspark.sql import SparkSession

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"),
                              keras.layers.Conv2D(16, 3, activation="relu", name="conv"),
                              keras.layers.Flatten(name="features"),
                              keras.layers.Dense(10, name="logits")], name="digits")
    net = TFNet.from_keras(model)
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    predictor = TFPredictor(net, batch_per_thread=32)

    short = spark.createDataFrame([([0.5] * 63,)], "pixels array<float>")   # 63 values; the input takes 64
    try:
        predictor.predict(short, feature_cols="pixels").collect()   # raises optim.BadRowError, not PythonException
    except optim.BadRowError as error:
        message = str(error)                  # names the column, the partition and the row
    print(message)
    print("<<BAD ROW DONE>>", flush=True)

    df = spark.createDataFrame([([0.5] * 64, i) for i in range(2000)], "pixels array<float>, id long").repartition(2)
    df.cache().count()
    print("<<SHOW>>", flush=True)
    predictor.predict(df, feature_cols="pixels").select("id", "output").show(3, truncate=30)
    print("ROWS", predictor.predict(df, feature_cols="pixels").limit(5).count(), flush=True)
    images = df.rdd.map(lambda row: np.array(row.pixels, np.float32).reshape(8, 8, 1))   # an RDD of arrays
    print("TAKEN", len(predictor.predict(images).take(4)), flush=True)
    print("<<END>>", flush=True)

    # every action, on what each entry point returns (issue 56); each action prints one line of its own
    import tempfile, mlflow.spark
    from optim import TFNetEstimator, TFNetTransformer
    small = spark.createDataFrame([([float(i % 7) / 7] * 64, i % 10) for i in range(120)],
                                  "pixels array<float>, label long").repartition(2)
    fitted = TFNetEstimator(net, featureCols=["pixels"], featureShapes=[[8, 8, 1]], epochs=1, batchSize=32,
                            numWorkers=2, outputCols=["logits"]).fit(small)
    saved = tempfile.mkdtemp() + "/model"
    mlflow.spark.save_model(fitted, saved, pip_requirements=["tfnet"])  # MLflow's inference: a JVM of its own
    loaded = mlflow.spark.load_model(saved)  # (MLflow's own INFO line about DFS, before the actions)
    entries = {
        "predictor": lambda: predictor.predict(small, feature_cols="pixels"),
        "transformer": lambda: TFNetTransformer(net, inputCols=["pixels"], outputCols=["logits"]).transform(small),
        "fitted": lambda: fitted.transform(small),
        "mlflow": lambda: loaded.transform(small),
    }
    out_dir = tempfile.mkdtemp()
    actions = {
        "first": lambda d: d.first() is not None,
        "take": lambda d: len(d.take(3)),
        "head": lambda d: len(d.head(2)),
        "show": lambda d: d.select("label").show(2),
        "limit.collect": lambda d: len(d.limit(4).collect()),
        "toPandas": lambda d: len(d.toPandas()),
        "count": lambda d: d.count(),
        "write": lambda d: d.write.mode("overwrite").parquet(out_dir + "/w") or "written",
    }
    for entry, make in entries.items():
        for name, action in actions.items():
            print(f"<<ACTION {entry} {name}>>", flush=True)
            print(f"{entry} {name} ->", action(make()), flush=True)
    print("<<ACTIONS END>>", flush=True)
    spark.stop()
    print("<<STOPPED>>", flush=True)
""")


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """:data:`PREDICT` and :data:`LOGGED`, each a process of its own, started together as the module begins (each
    pays its own interpreter, JVM and Python workers' start-up; together, one's waits overlap the other's work)."""
    folders = {name: tmp_path_factory.mktemp(name.lower()) for name in ("PREDICT", "LOGGED")}
    started = {name: Program(source, folders[name], user_env(), merged=True, unbuffered=True, cwd=folders[name])
               for name, source in (("PREDICT", PREDICT), ("LOGGED", LOGGED))}
    try:
        yield started
    finally:
        for program in started.values():
            program.kill()


def test_a_bad_row_and_show_after_tfpredictor_print_what_the_user_asked_for(programs):
    returncode, out, _ = programs["PREDICT"].result(500)
    assert returncode == 0 and "<<END>>" in out, out[-4000:]
    bad_row, rest = out.split("<<BAD ROW DONE>>")
    lines = bad_row.strip().split("\n")  # as a terminal shows them: "\r" redraws a line
    assert len(lines) <= 25, bad_row
    assert "Column 'pixels', row 0 of partition" in bad_row and "63 values" in bad_row
    assert not [line for line in lines if line.lstrip().startswith("at ") or "ERROR Executor" in line
                or "PythonException" in line or "Lost task" in line], bad_row
    shown = rest.split("<<SHOW>>")[1].split("<<END>>")[0]
    assert "only showing top 3 rows" in shown and "ROWS 5" in shown and "TAKEN 4" in shown, shown
    assert "Traceback" not in shown and "BrokenPipeError" not in shown and "Error" not in shown, shown
    # each action on each entry point printed its own output and nothing else, and so did spark.stop()
    assert_each_action_printed_its_own_output(out.split("<<END>>")[1], 32)


# A user's training script, fed to ``python -`` (so its own frames print as "<stdin>", as in a REPL):
# a plain session, the digits as a DataFrame (which starts tfnet's warm-up), a run long enough to stop.
TRAIN = textwrap.dedent("""
    from tfnet import TFNet
    import sys
    import optim
    from optim import TFDataset, TFOptimizer
    from pyspark.sql import SparkSession
    from tests import digits

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    x, y = digits.load()
    df = spark.createDataFrame([(image.ravel().tolist(), int(label)) for image, label in zip(x[:256], y[:256])],
                               "pixels array<float>, label long")
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)),
                      optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05),
                      metrics=["accuracy"], model_dir=MODEL_DIR)
    opt.optimize(data, epochs=500, batch_size=32, num_workers=2, checkpoint_every=4)
""")


def start_train(folder) -> tuple[subprocess.Popen, object, object]:
    """Starts :data:`TRAIN` in ``folder`` with its output to a file there (no terminal); returns ``(process, its
    log, its model_dir)``."""
    model_dir = folder / "run"
    log = folder / "console.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-"], cwd=folder, env=user_env(), stdin=subprocess.PIPE,
                                stdout=f, stderr=subprocess.STDOUT)
    proc.stdin.write(TRAIN.replace("MODEL_DIR", repr(str(model_dir))).encode())
    proc.stdin.close()
    return proc, log, model_dir


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory):
    """One :data:`TRAIN` process for each Ctrl-C case, both started at once (each pays its own interpreter, JVM and
    Python workers' start-up; together, one's waits overlap the other's work). Each case interrupts its own."""
    runs = {signals: start_train(tmp_path_factory.mktemp(f"ctrl-c-{signals}")) for signals in (1, 2)}
    try:
        yield runs
    finally:
        for proc, _, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def interrupted_run(run, signals: int) -> tuple[str, str, int]:
    """Sends ``signals`` Ctrl-Cs half a second apart to ``run`` (:func:`start_train`'s) once it has trained a few
    steps, and returns ``(what it printed before, after, exit status)``."""
    proc, log, model_dir = run
    try:
        deadline = time.monotonic() + 420
        while not (glob.glob(str(model_dir / "checkpoints" / "*" / "ckpt-*.npz"))
                   and "epoch 1/500" in log.read_text(errors="replace")):
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint and no epoch within 420 s"
            time.sleep(0.1)
        mark = os.path.getsize(log)
        for i in range(signals):
            if i:
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)  # Ctrl-C
        status = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_bytes().decode(errors="replace")
    return text[:mark], text[mark:], status


@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_prints_five_lines_once_or_twice_and_a_log_file_gets_clean_lines(train_runs, signals):
    before, after, status = interrupted_run(train_runs[signals], signals)
    assert status in (-signal.SIGINT, 130), (status, after)
    lines = after.strip().split("\n")
    # epochs that ended between the test's look at the log and the Ctrl-C's handling (an epoch here is 0.1-1 s; the
    # handler waits for the GIL on a busy machine) printed their lines first; once the call stops, none
    # (optim/training/reporting.py; tests/optim/test_console.py::test_no_epoch_line_once_a_call_stops_on_ctrl_c)
    while lines and lines[0].startswith("epoch "):
        before += lines.pop(0) + "\n"
    assert len(lines) <= 5, after
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "KeyboardInterrupt", after
    assert 'File "<stdin>"' in lines[1] and "in optimize" in lines[2], after  # from the user's call
    # before Ctrl-C, written to a file: one line per epoch, no redraws, no Spark stage bar (the warm-up's)
    assert "\r" not in before and "[Stage" not in before, repr(before[-2000:])
    epochs = [line for line in before.splitlines() if line.startswith("epoch ")]
    assert epochs and epochs[0].startswith("epoch 1/500 (step 8): loss="), before[-3000:]
    assert len({line.split(" (")[0] for line in epochs}) == len(epochs), before[-3000:]



# A user's script with INFO logging: a distributed run, TFPredictor on the same workers, then a run whose callback fails
# on rank 0 with validation data (one Spark application for both scenarios: a start-up saved).
LOGGED = textwrap.dedent("""
    import logging
    logging.basicConfig(level=logging.INFO, format="%(threadName)s|%(name)s|%(message)s")
    import keras
    from tfnet import TFNet
    import optim
    from optim import TFDataset, TFOptimizer, TFPredictor
    from pyspark.sql import SparkSession
    from tests import digits

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise ValueError("the user's callback failed")

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    x, y = digits.load()
    df = spark.createDataFrame([(image.ravel().tolist(), int(label)) for image, label in zip(x[:128], y[:128])],
                               "pixels array<float>, label long")
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)),
                      optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05))
    opt.optimize(data, epochs=3, batch_size=32, num_workers=2, verbose=0)
    shaped = TFPredictor(opt.net, batch_per_thread=32).predict(df, feature_cols="pixels")
    print("COUNT", shaped.count(), "FIRST", len(shaped.first().output), flush=True)
    print("<<TRAIN>>", flush=True)
    import sys, traceback
    try:
        opt.optimize(data, epochs=2, batch_size=32, num_workers=2, verbose=0, validation_data=data, callbacks=[Boom()])
    except ValueError:
        traceback.print_exc()  # as the console would show it, uncaught
    print("<<FAILED>>", flush=True)
    spark.stop()
    print("<<STOPPED>>", flush=True)
""")


def test_tfnets_threads_leave_nothing_in_an_info_log_and_a_failing_callback_is_one_short_error(programs):
    """py4j logs "Closing down clientserver connection" for each thread that called the JVM when it ends: a plain
    PySpark job prints it once, for its main thread at exit; tfnet's own threads (a Spark job each, the warm-up)
    printed six more in a three-epoch run (issue 56). TFPredictor on workers that trained printed a RuntimeWarning
    per task that num_threads could not be applied: now said once at DEBUG. And a callback failing on rank 0 with
    validation data printed 289 lines with 92 Java frames (issue 51): the rank's error, rebuilt, was raised from the
    Py4J error it came through; now the rank's error alone, in at most 25 lines."""
    returncode, out, _ = programs["LOGGED"].result(500)
    assert returncode == 0 and "<<STOPPED>>" in out and "COUNT 128 FIRST 10" in out, out[-4000:]
    closing = [line for line in out.splitlines() if "Closing down clientserver connection" in line]
    assert len(closing) <= 1 and all(line.startswith("MainThread|") for line in closing), closing
    assert "could not be applied" not in out and "RuntimeWarning" not in out, out[-4000:]
    failed = out.split("<<TRAIN>>")[1].split("<<FAILED>>")[0]
    lines = [line for line in failed.strip().split("\n") if line.strip()]
    assert "ValueError: the user's callback failed (rank 0)" in failed and len(lines) <= 25, failed
    assert not [line for line in lines if line.lstrip().startswith("at ") or "Py4JJavaError" in line], failed


# Ctrl-C while the main thread waits for the JVM's answer to a Py4J call, with the handler a plain SparkSession
# installs (pyspark's: it cancels every job through py4j, then raises KeyboardInterrupt).
CTRL_C_IN_PY4J = textwrap.dedent("""
    import os, signal, threading, time
    from pyspark.sql import SparkSession
    from optim.training.interrupts import Interruptible

    spark = SparkSession.builder.master("local[1]").getOrCreate()
    jvm = spark.sparkContext._jvm
    caught = []
    try:
        with Interruptible():
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C, 1 s into the call
            jvm.java.lang.Thread.sleep(3000)  # the main thread waits for the JVM's answer
            print("<<RETURNED>>", flush=True)
            asleep = time.monotonic()
            time.sleep(60)  # the held Ctrl-C ends this sleep
            print("<<NOT INTERRUPTED>>", flush=True)
    except KeyboardInterrupt:
        caught.append(("KeyboardInterrupt", "in the sleep" if time.monotonic() - asleep < 50 else "after it"))
    print("<<RESULT>>", caught, spark.range(5).count(), signal.getsignal(signal.SIGINT).__module__, flush=True)
    spark.stop()
""")


def test_ctrl_c_during_a_py4j_call_waits_for_its_answer_and_leaves_the_connection_whole():
    """Under load, Ctrl-C landed while the driver's main thread waited in a Py4J call (run_job's watch): pyspark's
    handler called the JVM again through that same half-read connection ("RuntimeError: reentrant call inside
    <_io.BufferedReader>", a raw Py4J traceback, py4j's "KeyboardInterrupt while sending command"). The
    interrupt is now held until the JVM has answered, then raised as a plain KeyboardInterrupt, and the session
    still works (a count, then the handler put back)."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_IN_PY4J], env=user_env(), capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "<<RETURNED>>" in out and "<<NOT INTERRUPTED>>" not in out, out[-4000:]
    assert "<<RESULT>> [('KeyboardInterrupt', 'in the sleep')] 5 pyspark.core.context" in out, out[-4000:]
    assert "Traceback" not in out and "reentrant" not in out and "while sending command" not in out, out[-4000:]
