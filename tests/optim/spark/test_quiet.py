"""At the default verbosity a distributed job prints only what the user asked for: no TensorFlow
start-up banner, no Spark WARN lines, no JVM incubator-module notice, in the driver or the
executors; a real JVM error still reaches the user."""

import os
import sys
import textwrap

import pytest

from tests.console_checks import Program

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

JOB = textwrap.dedent("""
    from optim.logs import configure, import_tensorflow
    configure(1)
    import_tensorflow()
    import optim
    from optim import TFOptimizer
    from optim.spark.session import build_session
    from tests import digits
    from tfnet import TFNet
    spark = build_session("quiet-test", "local[2]", {"spark.ui.enabled": "false"})
    # a real JVM error (an ERROR line and a Java exception) must still reach the user
    log4j = spark._jvm.org.apache.logging.log4j.LogManager.getLogger("tfnet.quiet.test")
    log4j.error("TFNET-JVM-ERROR-LINE", spark._jvm.java.lang.IllegalStateException("tfnet-jvm-boom"))
    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(True),
                      optim.SGD(0.05))
    opt.optimize((x[:128], y[:128]), epochs=1, batch_size=32, num_workers=2, verbose=0)
    print("DONE", opt.global_step)
    spark.stop()
""")
NOISE = ("oneDNN custom operations", "absl::InitializeLog", " WARN ", "NativeCodeLoader", "cpu_feature_guard",
         "Using incubator modules")


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """:data:`JOB` and :data:`PLAIN`, each a process of its own, started together as the module begins (each pays
    its own start-up; together, one's waits overlap the other's work)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    env.pop("TFNET_VERBOSE", None)
    started = {"JOB": Program(JOB, tmp_path_factory.mktemp("job"), env),
               # the user's own setting, as for any PySpark job with a venv
               "PLAIN": Program(PLAIN, tmp_path_factory.mktemp("plain"), dict(env, PYSPARK_PYTHON=sys.executable))}
    try:
        yield started
    finally:
        for program in started.values():
            program.kill()


def test_default_verbosity_shows_no_start_up_noise(programs):
    returncode, stdout, stderr = programs["JOB"].result(timeout=400)
    assert returncode == 0, stderr[-3000:]
    assert "DONE 4" in stdout
    lines = (stdout + stderr).splitlines()
    noisy = [line for line in lines if any(n in line for n in NOISE)]
    assert noisy == [], noisy
    assert "ERROR test: TFNET-JVM-ERROR-LINE" in stderr, stderr[-3000:]
    assert "java.lang.IllegalStateException: tfnet-jvm-boom" in stderr, stderr[-3000:]


# One plain session (one interpreter, JVM and set of Python workers: a start-up saved) for two scenarios in turn: a
# failure (a bad row), then a run and a plain job with Spark's console progress bar on. The first ends with a marker
# on both streams; each test reads its own part.
PLAIN = textwrap.dedent("""
    import sys, time
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[2]").appName("plain").config("spark.ui.enabled", "false").getOrCreate()
    sc = spark.sparkContext
    # PySpark starts the driver JVM as "pyspark-shell", and spark-submit turns the bar on for shells
    SHOW_CONSOLE_PROGRESS = sc.getConf().get("spark.ui.showConsoleProgress")
    import optim
    from optim import TFDataset, TFOptimizer
    from tests import digits
    from tfnet import TFNet
    bad = spark.createDataFrame([([0.0] * 64, 1), ([0.0] * 63, 2)] * 8, "pixels array<float>, label long").repartition(2)
    data = TFDataset.from_dataframe(bad, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(True), optim.SGD(0.05))
    log4j = spark._jvm.org.apache.logging.log4j.LogManager
    levels = lambda: [log4j.getLogger("org.apache.spark." + n).getLevel().toString()  # noqa: E731
                      for n in ("executor.Executor", "scheduler.TaskSetManager")]
    before = levels()
    try:
        opt.optimize(data, batch_size=2, num_workers=2, verbose=0)
    except optim.BadRowError as exc:
        print("\\nCAUGHT", type(exc).__name__, "traceback attached:", "in run_rank" in exc.worker_traceback)
    print("LEVELS RESTORED", levels() == before, before)
    print("<<FAILURE-END>>", flush=True)
    print("<<FAILURE-END>>", file=sys.stderr, flush=True)

    print("SHOW CONSOLE PROGRESS", SHOW_CONSOLE_PROGRESS, flush=True)
    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(True), optim.SGD(0.05))
    print("<<TFNET-BEGIN>>", file=sys.stderr, flush=True)
    opt.optimize((x[:512], y[:512]), epochs=2, batch_size=32, num_workers=2, verbose=1)
    print("<<TFNET-END>>", file=sys.stderr, flush=True)
    print("BAR DEFINED AFTER", sc._jsc.sc().progressBar().isDefined(), flush=True)
    sc.parallelize(range(2), 2).map(lambda i: time.sleep(2) or i).collect()  # a plain job of 2 s: Spark's bar
    print("<<PLAIN-END>>", file=sys.stderr, flush=True)
    spark.stop()
""")


@pytest.fixture(scope="module")
def plain(programs):
    """:data:`PLAIN`'s run: ``(exit status, stdout, stderr)``."""
    return programs["PLAIN"].result(timeout=500)


def test_a_failure_under_a_plainly_built_session_shows_one_clean_error(plain):
    """A SparkSession the user built (not tfnet's): a bad row fails the stage on both ranks. The
    console shows the session's own start-up lines and tfnet's typed error, not the executors'
    task-failure tracebacks (about 95 lines before); the loggers' levels are put back after."""
    returncode, stdout, stderr = plain
    assert returncode == 0, stderr[-3000:]
    out, err = stdout.split("<<FAILURE-END>>")[0], stderr.split("<<FAILURE-END>>")[0]  # all it printed until then
    assert "CAUGHT BadRowError traceback attached: True" in out, out + err[-3000:]
    assert "LEVELS RESTORED True" in out
    lines = (out + err).strip().split("\n")  # as a terminal shows them: "\r" redraws a line
    assert len(lines) <= 25, "\n".join(lines)
    assert not any("ERROR Executor" in line or "WARN TaskSetManager" in line for line in lines)


def test_sparks_console_progress_bar_is_paused_while_tfnet_trains(plain):
    """A SparkSession built the plain way has Spark's console progress bar on (PySpark starts its JVM
    as a shell). While tfnet trains, no ``[Stage N:>`` redraw reaches the console, where it shared a
    line with tfnet's bar (the barrier stage, seconds long, redrew it every 200 ms); after the call
    the bar is back and shows a plain job's progress again. (:data:`PLAIN`'s session, after its failed run.)"""
    returncode, stdout, stderr = plain
    assert returncode == 0, stderr[-3000:]
    assert "SHOW CONSOLE PROGRESS true" in stdout, stdout
    before, rest = stderr.split("<<TFNET-BEGIN>>")
    during, after = rest.split("<<TFNET-END>>")
    assert "epoch 2/2 (step 32)" in during, "tfnet's own progress was shown (one line per epoch: not a terminal)"
    assert "[Stage" not in during, [part for part in during.replace("\r", "\n").split("\n") if "[Stage" in part][:5]
    assert "BAR DEFINED AFTER True" in stdout
    plain = after.split("<<PLAIN-END>>")[0]
    assert "[Stage" in plain, "Spark's bar shows a plain job's progress again"
    assert " INFO " not in plain, plain[-2000:]  # the task loggers follow the session's WARN again
