"""Logging for tfnet, and keeping other libraries' start-up noise out of the user's console.

tfnet logs through ``logging.getLogger("tfnet")`` and its children (``tfnet.training``,
``tfnet.spark.driver``, ...); library code never prints. :func:`configure` gives the ``tfnet``
logger a console handler for scripts. At the default verbosity, TensorFlow's C++ start-up lines
(the oneDNN banner, written before its log levels apply) and Spark's JVM warnings are kept out of
the console; ``verbose=2`` or the environment variable ``TFNET_VERBOSE=1`` brings them back.
While tfnet trains over Spark, Spark's console progress bar is paused (:func:`paused_console_progress`).
Imports no Spark at module level.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

__all__ = ["VERBOSE_ENV", "configure", "console_error", "import_tensorflow", "noisy", "paused_console_progress",
           "quiet_task_failures", "quiet_worker", "spark_log_conf"]

from tfnet.quiet import VERBOSE_ENV, import_tensorflow, noisy  # noqa: F401 (part of this module's API)

logging.getLogger("tfnet").addHandler(logging.NullHandler())


def configure(verbose: int = 1, stream=None) -> logging.Logger:
    """Gives the ``tfnet`` logger one console handler (idempotent) for scripts: INFO at
    ``verbose >= 1``, DEBUG at ``verbose >= 2``, WARNING at 0. ``verbose >= 2`` also sets
    ``TFNET_VERBOSE`` so that TensorFlow's and Spark's own lines come back. Returns the logger."""
    logger = logging.getLogger("tfnet")
    logger.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose >= 1 else logging.WARNING)
    if not any(getattr(h, "_tfnet_console", False) for h in logger.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._tfnet_console = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    if verbose >= 2:
        os.environ[VERBOSE_ENV] = "1"
    return logger


def quiet_worker(level: int = logging.WARNING) -> None:
    """In a Spark worker: tfnet's loggers at ``level``, TensorFlow imported quietly and its
    Python logger at ERROR (unless :func:`noisy`)."""
    logging.getLogger("tfnet").setLevel(level)
    if noisy() or level <= logging.DEBUG:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = import_tensorflow()
    tf.get_logger().setLevel(logging.ERROR)


def console_error(err: BaseException) -> BaseException:
    """``err``, a typed error that a Spark job raised on its ranks, made short for the console: its
    traceback starts where the caller raises it again, and the Spark exception that carried it (a
    ``Py4JJavaError`` and its JVM stack, about 120 lines) is no longer its printed cause but its
    ``spark_error`` attribute, logged at DEBUG to ``tfnet.spark`` with the rank's traceback. With
    ``TFNET_VERBOSE=1`` it is returned as it is, whole.

    Example:
        >>> try:                                                              # doctest: +SKIP
        ...     result = optimize_distributed(...)
        ... except TFNetError as err:
        ...     raise console_error(err)
    """
    if noisy():
        return err
    cause = err.__cause__ or err.__context__
    if cause is not None and getattr(err, "spark_error", None) is None:
        err.spark_error = getattr(cause, "spark_error", cause)  # type: ignore[attr-defined]  # Spark's own
    err.__cause__, err.__suppress_context__ = None, True
    logging.getLogger("tfnet.spark").debug(
        "%s from a Spark job; the rank's traceback:\n%s\nSpark's error:\n%s", type(err).__name__,
        getattr(err, "worker_traceback", "(none)"), getattr(err, "spark_error", None))
    return err.with_traceback(None)


_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n
# the same level for the shell's logger (PySpark's is its gateway's), or Spark resets the root
# level to WARN and says so
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
logger.pyspark.name = org.apache.spark.api.python.PythonGatewayServer
logger.pyspark.level = {level}
# A failed task's stack trace: tfnet raises the rank's own error (with its traceback) instead.
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = fatal
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = fatal
"""


_LOG4J2_PATH: str | None = None


def _log4j2_file() -> str:
    """The log4j2 configuration, written once per process into a private folder of its own
    (``mkdtemp``: mode 0700, a fresh name): a file someone else made is never trusted."""
    global _LOG4J2_PATH
    if _LOG4J2_PATH is None or not os.path.isfile(_LOG4J2_PATH):
        folder = tempfile.mkdtemp(prefix="tfnet-log4j2-")
        path = os.path.join(folder, "log4j2.properties")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_LOG4J2.format(level="error"))
        atexit.register(shutil.rmtree, folder, True)
        _LOG4J2_PATH = path
    return _LOG4J2_PATH


def spark_log_conf(verbose: int = 1) -> dict[str, str]:
    """Spark settings that keep the JVM's start-up warnings (``NativeCodeLoader``, ...) and the
    executors' TensorFlow notices out of the console at ``verbose < 2``: a log4j2 configuration
    at level ERROR for the driver, and ``TF_CPP_MIN_LOG_LEVEL=2`` for the executors."""
    if verbose >= 2 or noisy():
        return {}
    path = _log4j2_file()
    return {
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{path}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{path}",
        "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }


#: The JVM loggers that print a failed task's whole Python and Java traceback (about 45 lines each,
#: per task): tfnet raises the rank's own error, with that traceback attached, instead.
TASK_FAILURE_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager")


@contextmanager
def quiet_task_failures(sc, verbose: int = 1, pause_progress: bool = True) -> Iterator[None]:
    """While tfnet's own Spark jobs run, in any session (one the user built too), the executor's and
    the scheduler's task-failure lines stay out of the console; the levels they had are put back
    afterwards. Nothing changes at ``verbose >= 2`` or with ``TFNET_VERBOSE=1``. With
    ``pause_progress`` (training: tfnet shows its own bar), Spark's console progress bar is paused
    for the duration at every verbosity (:func:`paused_console_progress`)."""
    with paused_console_progress(sc) if pause_progress else nullcontext():
        with _quiet_levels(sc, verbose):
            yield


@contextmanager
def paused_console_progress(sc) -> Iterator[None]:
    """Spark's console progress bar (``[Stage 3:>   (0 + 2) / 2]``, written to the driver JVM's
    stderr every 200 ms for each stage that runs longer than 500 ms) stops for the duration and a
    fresh one starts afterwards. Spark 4 makes one whenever ``spark.ui.showConsoleProgress`` is
    true, which ``spark-submit`` sets for its shells, ``pyspark-shell`` among them, and PySpark
    starts every driver JVM, a plain ``python script.py`` too, as ``pyspark-shell``: so a session
    the user built has the bar unless they turned it off. During tfnet's training stage it would
    say ``(0 + 2) / 2`` until the end and redraw itself over tfnet's progress bar on the same line.

    Through the JVM (``SparkContext._progressBar``, a private field, set by reflection): nothing
    happens without a bar, or without a JVM (a Spark Connect client), or when the JVM does not
    have that field (another Spark version); the bar is put back only if the context still runs."""
    jsc = field = None
    try:
        jsc = sc._jsc.sc()
        bar = jsc.progressBar()
        if bar.isDefined():
            field = jsc.getClass().getDeclaredField("_progressBar")
            field.setAccessible(True)
            field.set(jsc, sc._jvm.scala.Option.empty())  # runJob's finishAll() finds no bar
            bar.get().finishAll()  # clears a bar on the screen now
            bar.get().stop()  # its timer: no more redraws
    except Exception:  # noqa: BLE001 - no JVM view, or another Spark: leave the bar alone
        field = None
    try:
        yield
    finally:
        if field is not None:
            try:
                if not jsc.isStopped():
                    field.set(jsc, sc._jvm.scala.Some(sc._jvm.org.apache.spark.ui.ConsoleProgressBar(jsc)))
            except Exception:  # noqa: BLE001 - the JVM is gone
                pass


@contextmanager
def _quiet_levels(sc, verbose: int) -> Iterator[None]:
    """The task-failure loggers off for the duration. Put back as they were: a level of their own
    is set again; a logger that had none (it followed the root's) loses the one tfnet gave it,
    because Spark's shell filter (``SparkShellLoggingFilter``, which keeps a plain session's console
    at WARN while the root logger stays at INFO) lets through every line of a logger with a level
    of its own: setting its old effective level back would bring Spark's INFO lines to the console."""
    if verbose >= 2 or noisy():
        yield
        return
    saved: dict = {}
    try:
        log4j = sc._jvm.org.apache.logging.log4j
        configurator = log4j.core.config.Configurator
        context = log4j.core.LoggerContext.getContext(False)
        for name in TASK_FAILURE_LOGGERS:
            own = context.getConfiguration().getLoggerConfig(name).getName() == name
            saved[name] = log4j.LogManager.getLogger(name).getLevel() if own else None
            configurator.setLevel(name, log4j.Level.OFF)
    except Exception:  # noqa: BLE001 - no JVM view (a Connect client): nothing to quiet
        saved = {}
    try:
        yield
    finally:
        if saved:
            _wait_for_running_tasks(sc)
        for name, level in saved.items():
            try:
                if level is None:
                    context.getConfiguration().removeLogger(name)
                    context.updateLoggers()
                else:
                    configurator.setLevel(name, level)
            except Exception:  # noqa: BLE001 - the JVM is gone
                break


def _wait_for_running_tasks(sc, timeout_s: float = 15.0) -> None:
    """Waits (bounded) until no executor runs a task: a failed barrier stage's other tasks are
    killed after the job has failed, and the executor logs each kill; the levels go back after."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            infos = sc._jsc.sc().statusTracker().getExecutorInfos()
            if sum(int(info.numRunningTasks()) for info in infos) == 0:
                return
        except Exception:  # noqa: BLE001 - no JVM view: nothing to wait for
            return
        time.sleep(0.1)
