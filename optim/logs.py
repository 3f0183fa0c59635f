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
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

__all__ = ["VERBOSE_ENV", "configure", "console_error", "import_tensorflow", "noisy", "paused_console_progress",
           "quiet_lazy_task_failures", "quiet_task_failures", "quiet_worker", "spark_log_conf", "user_stacklevel",
           "wait_for_running_tasks"]

from tfnet.quiet import VERBOSE_ENV, import_tensorflow, noisy  # noqa: F401 (part of this module's API)

logging.getLogger("tfnet").addHandler(logging.NullHandler())

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = tuple(os.path.join(_ROOT, package) + os.sep for package in ("optim", "tfnet"))


def user_stacklevel() -> int:
    """The ``stacklevel`` for :func:`warnings.warn`, called from the function that warns, that points the
    warning at the first frame outside tfnet's packages (``optim``, ``tfnet``): the user's call, however many of
    tfnet's frames stand between (Python 3.12's ``skip_file_prefixes``, for 3.11)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGES):
        frame, level = frame.f_back, level + 1
    return level


def configure(verbose: int = 1, stream=None) -> logging.Logger:
    """Sets the ``tfnet`` logger's level (INFO at ``verbose >= 1``, DEBUG at ``verbose >= 2``,
    WARNING at 0) and, for a script that has not configured logging, gives it a console handler
    (idempotent). ``verbose >= 2`` also sets ``TFNET_VERBOSE`` so that TensorFlow's and Spark's own
    lines come back. Returns the logger.

    As the logging HOWTO asks of a library ("Configuring Logging for a Library"), tfnet adds no
    handler where logging is configured already: with ``logging.basicConfig(...)`` (or a handler of
    your own on ``tfnet``) tfnet's lines go through your handlers only, once each. The console
    handler also stays silent for any line that a handler configured later would print (the root's,
    say, which ``logging.basicConfig`` or a library's module-level ``logging.info(...)`` adds)."""
    logger = logging.getLogger("tfnet")
    logger.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose >= 1 else logging.WARNING)
    configured = [h for h in _handlers_from(logger) if not isinstance(h, (logging.NullHandler, _Console))]
    if not configured and not any(isinstance(h, _Console) for h in logger.handlers):
        handler = _Console(stream or sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    if verbose >= 2:
        os.environ[VERBOSE_ENV] = "1"
    return logger


def _handlers_from(logger: logging.Logger) -> list[logging.Handler]:
    """Every handler a record logged to ``logger`` reaches: its own and, while loggers propagate, its
    ancestors' (as ``Logger.callHandlers`` walks them)."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        current = current.parent if current.propagate else None
    return found


class _Console(logging.StreamHandler):
    """:func:`configure`'s console handler: it prints a record only when no other handler that the
    record reaches would print it too, so no line is printed twice."""

    def handle(self, record: logging.LogRecord) -> bool:
        others = [h for h in _handlers_from(logging.getLogger(record.name))
                  if h is not self and not isinstance(h, logging.NullHandler) and record.levelno >= h.level]
        if others:
            return False
        return super().handle(record)


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
#: The JVM loggers that say, for each task of a cancelled stage (Ctrl-C), that its Python worker is being
#: killed ("Incomplete task interrupted: Attempting to kill Python Worker").
TASK_KILL_LOGGERS = ("org.apache.spark.sql.execution.python", "org.apache.spark.api.python")


#: A message that carries a tfnet error raised on a worker (the worker's traceback ends with its line).
TYPED_ERROR_MESSAGE = r"(?s).*\b(?:optim|tfnet)\.errors\.[A-Za-z_]\w*(?:Error|Exception): .*"
#: The executor's own line for a failed task, which the scheduler's "Lost task" line repeats.
EXECUTOR_TASK_ERROR = r"(?s)Exception in task \d.*"
_LAZY_QUIET: set = set()


def quiet_lazy_task_failures(sc) -> None:
    """A lazy result (the DataFrame or RDD that ``TFPredictor.predict`` returns) fails in the user's
    own action, outside any job tfnet runs, so :func:`quiet_task_failures` cannot bracket it: Spark's
    console would show each failed task's Python and Java traces (about 30 lines each, from the
    executor and again from the scheduler) before tfnet's one-line error. Once per driver JVM, its
    console appenders stop showing those lines (Spark's other appenders, its log files, keep them):
    every line that names a tfnet error raised on a worker (the scheduler's ``Lost task ...``) and,
    where the executor runs in the driver's JVM (a ``local`` master), the executor's ``Exception in
    task ...``, which the scheduler's line repeats. Nothing changes at ``TFNET_VERBOSE=1``, without a
    JVM (a Spark Connect client) or with another logging back-end."""
    if noisy() or sc is None:
        return
    try:
        key = sc.applicationId
        if key in _LAZY_QUIET:
            return
        core = sc._jvm.org.apache.logging.log4j.core
        result = core.Filter.Result
        patterns = [TYPED_ERROR_MESSAGE] + ([EXECUTOR_TASK_ERROR] if sc.master.startswith("local") else [])
        filters = [core.filter.RegexFilter.createFilter(p, None, False, result.DENY, result.NEUTRAL) for p in patterns]
        appenders = core.LoggerContext.getContext(False).getConfiguration().getAppenders().values()
        for appender in appenders:
            if appender.getClass().getName() == "org.apache.logging.log4j.core.appender.ConsoleAppender":
                for f in filters:
                    appender.addFilter(f)
        _LAZY_QUIET.add(key)
    except Exception:  # noqa: BLE001 - no JVM view, or another logging back-end: leave the console as it is
        pass


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
    say ``(0 + 2) / 2`` until the end and redraw itself over tfnet's progress bar on the same line;
    tfnet's background warm-up would show as a stage the user never started.

    Pauses nest, from any thread (the warm-up's runs beside a training call): the bar comes back
    when the last one ends. Through the JVM (``SparkContext._progressBar``, a private field, set
    by reflection): nothing happens without a bar, or without a JVM (a Spark Connect client), or
    when the JVM does not have that field (another Spark version); the bar is put back only if the
    context still runs."""
    key = id(sc)
    with _PAUSES_LOCK:
        pause = _PAUSES.get(key)
        if pause is None:
            pause = _PAUSES[key] = {"count": 0, "field": _remove_progress_bar(sc)}
        pause["count"] += 1
    try:
        yield
    finally:
        with _PAUSES_LOCK:
            pause["count"] -= 1
            if pause["count"] == 0:
                del _PAUSES[key]
                if pause["field"] is not None:
                    _restore_progress_bar(sc, pause["field"])


_PAUSES: dict = {}  # id(SparkContext) -> {"count": pauses running, "field": the bar's field, when one was removed}
_PAUSES_LOCK = threading.Lock()


def _remove_progress_bar(sc):
    """Takes the context's console progress bar away; returns the reflected field to put one back, or None."""
    try:
        jsc = sc._jsc.sc()
        bar = jsc.progressBar()
        if not bar.isDefined():
            return None
        field = jsc.getClass().getDeclaredField("_progressBar")
        field.setAccessible(True)
        field.set(jsc, sc._jvm.scala.Option.empty())  # runJob's finishAll() finds no bar
        bar.get().finishAll()  # clears a bar on the screen now
        bar.get().stop()  # its timer: no more redraws
        return field
    except Exception:  # noqa: BLE001 - no JVM view, or another Spark: leave the bar alone
        return None


def _restore_progress_bar(sc, field) -> None:
    try:
        jsc = sc._jsc.sc()
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
        for name in TASK_FAILURE_LOGGERS + TASK_KILL_LOGGERS:
            own = context.getConfiguration().getLoggerConfig(name).getName() == name
            saved[name] = log4j.LogManager.getLogger(name).getLevel() if own else None
            configurator.setLevel(name, log4j.Level.OFF)
    except Exception:  # noqa: BLE001 - no JVM view (a Connect client): nothing to quiet
        saved = {}
    try:
        yield
    finally:
        if saved:
            wait_for_running_tasks(sc)
        for name, level in saved.items():
            try:
                if level is None:
                    context.getConfiguration().removeLogger(name)
                    context.updateLoggers()
                else:
                    configurator.setLevel(name, level)
            except Exception:  # noqa: BLE001 - the JVM is gone
                break


def wait_for_running_tasks(sc, timeout_s: float = 15.0) -> None:
    """Waits (bounded) until the driver's task scheduler runs no task: a cancelled or failed stage's
    other tasks are killed after its job has ended, and the executor and the scheduler log each kill.
    The scheduler's own count is live (the status tracker's lags for a stage that ran long)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            counts = sc._jsc.sc().taskScheduler().runningTasksByExecutors().valuesIterator()
            running = 0
            while counts.hasNext():
                running += int(counts.next())
        except Exception:  # noqa: BLE001 - no JVM view (another Spark, a stopped context): nothing to wait for
            return
        if running == 0:
            return
        time.sleep(0.1)
