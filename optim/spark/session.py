"""Getting a Spark session, with clear errors when Java or Spark is missing. Driver side."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from optim.errors import SparkSetupError


def java_version() -> int | None:
    """The major version of the ``java`` Spark would use (JAVA_HOME first), or None if none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stderr + out.stdout
    import re

    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def require_java() -> None:
    version = java_version()
    if version is None:
        raise SparkSetupError(
            "Spark needs Java 17 or newer, and no `java` was found (JAVA_HOME is "
            f"{os.environ.get('JAVA_HOME')!r}). Install it, e.g. `sudo apt-get install -y "
            "openjdk-17-jre-headless`, or set JAVA_HOME."
        )
    if version < 17:
        raise SparkSetupError(f"Spark 4 needs Java 17 or newer; found Java {version}. Install Java 17 or set JAVA_HOME.")


#: tfnet's Python worker daemon (pyspark's, with TensorFlow imported before it forks): the value of
#: ``spark.python.daemon.module`` that :func:`build_session` sets, and a user's own session may.
WORKER_DAEMON = "optim.spark.worker_daemon"


#: The bound on an Arrow batch's bytes that :func:`build_session` sets (Spark's own: 64 MiB); a session of one's
#: own takes the same setting (README, "Inference over Spark").
ARROW_BATCH_BYTES_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
ARROW_BATCH_BYTES = "16m"


def build_session(app_name: str = "tfnet", master: str | None = None, conf: dict[str, str] | None = None,
                  verbose: int = 1, warm_up: bool = True):
    """The one SparkSession builder of tfnet (the examples, benchmarks and tests use it): the
    active session if there is one, else a new one on ``master`` (Spark's default when None) with
    the settings tfnet's workers need, quiet at ``verbose < 2`` (see :mod:`optim.logs`). Its Python
    workers are forked with TensorFlow imported (``spark.python.daemon.module``:
    :mod:`optim.spark.worker_daemon`), so a worker Spark starts mid-application costs no import.

    Args:
        app_name: Default ``"tfnet"``.
        master: ``"local[2]"``, ``"spark://host:7077"``, ... Default: Spark's own (``local[*]``
            unless ``spark-submit`` set one).
        conf: More Spark settings; they win over tfnet's.
        verbose: 2 or more keeps Spark's own INFO/WARN lines. Default 1.
        warm_up: Start the workers' imports of TensorFlow, Horovod and tfnet in the background at
            once (:func:`optim.warm_up_workers`), so the first ``optimize()`` finds them warm.
            Default True.

    Raises:
        SparkSetupError: Java is missing or too old.
    """
    from pyspark.sql import SparkSession

    from optim.logs import noisy, spark_log_conf

    active = SparkSession.getActiveSession()
    if active is not None:
        return _warmed(active, warm_up)
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {
        "spark.ui.showConsoleProgress": "false",
        "spark.executorEnv.TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"),
        "spark.python.daemon.module": WORKER_DAEMON,
        # Arrow batches to Python workers of at most 16 MiB, against Spark's 64 MiB (its 10,000-row bound is far
        # above that for image rows): in TFPredictor's Arrow UDF, OpenVINO INT8 on ResNet-50 images as float rows
        # kept 0.91-0.93 of its engine's gain over TensorFlow fp32, 0.78-0.82 with Spark's default (batches of
        # about 110 rows of 600 KB); uint8 rows gained less (docs/benchmarks.md, "Arrow batches of 16 MiB").
        ARROW_BATCH_BYTES_KEY: ARROW_BATCH_BYTES,
    }
    if os.environ.get("SPARK_LOCAL_IP"):
        settings["spark.driver.host"] = os.environ["SPARK_LOCAL_IP"]
    settings.update(spark_log_conf(verbose))
    settings.update(conf or {})
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if verbose < 2 and not noisy():
        _start_filtered_context(app_name, master, settings)
    session = builder.getOrCreate()
    if verbose < 2:
        session.sparkContext.setLogLevel("ERROR")
    return _warmed(session, warm_up)


def _warmed(session, warm_up: bool):
    """The session, with its workers' imports started (:func:`optim.warm_up_workers`) when asked."""
    if warm_up:
        from optim.spark.warm_up import ensure_warm_up

        ensure_warm_up(session)
    return session


#: The one JVM line tfnet drops from the driver JVM's stderr at ``verbose < 2``: Spark 4's launcher
#: adds ``--add-modules=jdk.incubator.vector`` and the JVM has no flag to silence its notice.
JVM_NOISE = "WARNING: Using incubator modules: jdk.incubator.vector"


def forward_stderr(source, drop: str = JVM_NOISE) -> threading.Thread:
    """Copies ``source`` (a binary pipe) to ``sys.stderr`` line by line from a daemon thread,
    leaving out the lines that contain ``drop``; every other line (Spark's ERROR lines, Java
    exceptions) reaches the user. Returns the started thread; it ends at the pipe's end."""

    def pump() -> None:
        with source:
            for raw in iter(source.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                if drop in line:
                    continue
                for stream in (sys.stderr, sys.__stderr__):
                    try:
                        stream.write(line)
                        stream.flush()
                        break
                    except (AttributeError, OSError, ValueError):  # closed, or None at shutdown
                        continue

    thread = threading.Thread(target=pump, name="tfnet-jvm-stderr", daemon=True)
    thread.start()
    return thread


def _start_filtered_context(app_name: str, master: str | None, settings: dict[str, str]) -> None:
    """Starts the driver JVM with its stderr piped through :func:`forward_stderr` and a
    SparkContext on it, so that the session builder picks that context up. Does nothing when a
    JVM is already there (a stopped session's, or one ``spark-submit`` started)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf(loadDefaults=False).setAppName(app_name)
    if master:
        conf.setMaster(master)
    for key, value in settings.items():
        conf.set(key, value)
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    forward_stderr(gateway.proc.stderr)
    SparkContext(conf=conf, gateway=gateway)


def get_spark(create: bool = True):
    """The active SparkSession, or a new one from :func:`build_session` when ``create`` is True.

    Raises:
        SparkSetupError: no session is active and Java is missing or too old.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None or not create:
        return active
    return build_session()


#: Spark's SQL Python runners add ``SPARK_SIMPLIFIED_TRACEBACK=1`` to their workers' environment when
#: this is on (its default), and Spark keeps one pool of Python workers per environment.
SIMPLIFIED_TRACEBACK = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


#: The settings tfnet holds for the duration of its jobs: ``(id(session), key) -> [depth, the user's value]``.
_HELD: dict[tuple[int, str], list] = {}
_HELD_LOCK = threading.Lock()


@contextmanager
def _held_setting(spark, key: str, value: str | None) -> Iterator[None]:
    """Sets the session's SQL ``key`` to ``value`` for the duration (None: leaves it), and puts the
    user's value back when the last of tfnet's overlapping calls on the session ends: calls from several
    threads nest, whatever order they end in. Does nothing without a SQL conf."""
    conf = getattr(spark, "conf", None) if value is not None else None
    slot = (id(spark), key)
    with _HELD_LOCK:
        entry = _HELD.get(slot)
        if entry is not None:
            entry[0] += 1
        elif conf is not None:
            try:
                before = conf.get(key, None)
                conf.set(key, value)
            except Exception:  # noqa: BLE001 - no SQL conf here: nothing to hold
                conf = None
            else:
                entry = _HELD[slot] = [1, before]
    try:
        yield
    finally:
        with _HELD_LOCK:
            if entry is not None:
                entry[0] -= 1
                if entry[0] == 0:
                    _HELD.pop(slot, None)
                    _restore(conf, key, entry[1])


def _restore(conf, key: str, before: str | None) -> None:
    try:
        if before is None:
            conf.unset(key)
        else:
            conf.set(key, before)
    except Exception:  # noqa: BLE001 - the session stopped meanwhile
        pass


def shared_python_workers(spark):
    """For the duration of tfnet's jobs, a DataFrame job (the training stage's ``mapInArrow``,
    the row counts) runs in the same Python workers as an RDD job, those that
    :func:`optim.warm_up_workers` warmed: Spark keys its worker pools by environment, and its SQL
    runners set ``SPARK_SIMPLIFIED_TRACEBACK`` unless :data:`SIMPLIFIED_TRACEBACK` is off. Without
    this the first DataFrame training stage of an application waited for fresh workers to import
    TensorFlow (about 6 s on 2 cores) although the warm-up had run. The user's setting is put back
    when the last of tfnet's overlapping calls on the session ends (tfnet reports a rank's errors
    itself, not through those tracebacks). A context manager."""
    return _held_setting(spark, SIMPLIFIED_TRACEBACK, "false")


#: Rows of each Arrow batch Spark sends a Python worker; Spark's default is 10,000.
ARROW_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"


def small_arrow_batches(spark, rows: int | None):
    """For the duration of tfnet's jobs, Spark sends a task's rows in Arrow batches of at most ``rows``
    rows (None: as the session says). A streaming rank holds one batch at a time, so the batch Spark sends
    is what its memory holds from Spark: at Spark's default of 10,000 rows, a rank's 8,000 PNG images of
    64x64x3 came as one batch of about 100 MB, and its peak grew with its rows (+25% from 2,000 to 8,000
    rows a rank; +3.5% at 256). A smaller setting of the user's stays; the user's is put back afterwards.
    A context manager."""
    value = None
    if rows:
        try:
            before = spark.conf.get(ARROW_BATCH_ROWS, None)
            current = int(before) if before not in (None, "") else 10000
            value = None if 0 < current <= rows else str(int(rows))
        except Exception:  # noqa: BLE001 - no SQL conf here: batches as they come
            value = None
    return _held_setting(spark, ARROW_BATCH_ROWS, value)
