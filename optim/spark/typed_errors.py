"""tfnet's own errors out of the user's Spark actions. Driver side.

A lazy result (the DataFrame or RDD that :meth:`TFPredictor.predict` returns) fails in the user's
own action (``collect()``, ``toPandas()``, ``write.parquet(...)``), and Spark wraps the worker's
error in its own: pyspark's ``PythonException`` or a ``Py4JJavaError``, with about 70 lines of the
worker's traceback and executor log. :func:`install` makes such an action raise the tfnet error the
worker raised instead (a :class:`~optim.BadRowError` naming the column, the partition and the row),
as an instance of *both* classes, so ``except BadRowError`` and an existing
``except PythonException`` both catch it. Its message is the worker's one line; the worker's
traceback is kept in ``worker_traceback`` and the JVM's in its cause (logged at DEBUG to the
``tfnet.spark`` logger), not printed.

How: pyspark routes every JVM call through ``py4j.java_gateway.get_return_value`` (wrapped by its
own ``capture_sql_exception``, which turns JVM errors into pyspark's); :func:`install` wraps that
once more, and pyspark's ``convert_exception`` (classic, for errors read from an Arrow stream, and
Spark Connect's) likewise. Errors that name no tfnet error
pass unchanged. :meth:`TFPredictor.predict` installs it; ``optim.raise_tfnet_errors()`` still works.
"""

from __future__ import annotations

import functools
import logging

from optim.errors import typed_spark_error
from optim.logs import quiet_lazy_task_failures

__all__ = ["install"]

log = logging.getLogger("tfnet.spark")
_MARK = "_tfnet_typed_errors"


def _retyped(exc: BaseException) -> BaseException | None:
    err = typed_spark_error(exc)
    if err is exc:
        return None
    log.debug("A Spark action failed with %s raised in a worker; the worker's traceback:\n%s", type(err).__name__,
              getattr(err, "worker_traceback", ""))
    return err


def _wrap(fn):
    @functools.wraps(fn)
    def get_return_value(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only errors that name a tfnet error are replaced
            err = _retyped(exc)
            if err is None:
                raise
            raise err from None

    setattr(get_return_value, _MARK, True)
    return get_return_value


def install() -> None:
    """Idempotent; again after a new SparkContext (pyspark puts its own handler back then). The
    console of a classic session's driver stops showing the failed tasks' traces that the worker's
    error comes with (:func:`optim.logs.quiet_lazy_task_failures`)."""
    try:
        from pyspark import SparkContext

        quiet_lazy_task_failures(SparkContext._active_spark_context)
    except ImportError:  # pragma: no cover - pyspark is there whenever a lazy result is
        pass
    try:
        import py4j.java_gateway as gateway
    except ImportError:  # pragma: no cover - pyspark always ships py4j
        gateway = None
    if gateway is not None and not getattr(gateway.get_return_value, _MARK, False):
        gateway.get_return_value = _wrap(gateway.get_return_value)
    try:  # the conversion pyspark applies to errors that arrive outside a JVM call (toPandas' Arrow stream)
        from pyspark.errors.exceptions import captured
    except ImportError:  # pragma: no cover
        captured = None
    if captured is not None and not getattr(captured.convert_exception, _MARK, False):
        captured.convert_exception = _converting(captured.convert_exception)
    _install_connect()


def _converting(convert):
    @functools.wraps(convert)
    def convert_exception(*args, **kwargs):
        exc = convert(*args, **kwargs)
        err = _retyped(exc)
        return exc if err is None else err

    setattr(convert_exception, _MARK, True)
    return convert_exception


def _install_connect() -> None:
    try:
        from pyspark.sql.connect.client import core
    except Exception:  # noqa: BLE001 - no Spark Connect client here (its extra is not installed)
        return
    convert = getattr(core, "convert_exception", None)
    if convert is not None and not getattr(convert, _MARK, False):
        core.convert_exception = _converting(convert)
