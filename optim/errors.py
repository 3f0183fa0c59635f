"""Every error and warning that ``optim`` raises, one class per concept. Pure: no TensorFlow,
Spark or Horovod.

Each error derives from :class:`tfnet.TFNetError` and from the builtin a caller would expect, so
both ``except ValueError`` and ``except tfnet.TFNetError`` catch it. Errors carry ``retryable``:
whether rerunning the distributed training stage can help (see :mod:`optim.launch.retry`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from tfnet.errors import TFNetError

__all__ = [
    "BackendError",
    "BackendFallbackWarning",
    "BackendUnavailableError",
    "BadRowError",
    "CalibrationError",
    "CheckpointError",
    "CheckpointWarning",
    "ColumnError",
    "DataError",
    "DistributedTrainingError",
    "KerasMappingError",
    "KerasTrainingWarning",
    "LabelShapeError",
    "NonFiniteInputError",
    "NonFiniteLossError",
    "OptimizerStateError",
    "PrecisionError",
    "PrecisionWarning",
    "RendezvousError",
    "SparkSetupError",
    "StageRetryError",
    "StorageError",
    "WorkerError",
    "error_class",
    "from_spark_error",
    "raise_tfnet_errors",
    "typed_spark_error",
]


# ---------------------------------------------------------------- data and columns


class DataError(TFNetError, ValueError):
    """Training data that cannot be used (wrong structure, mismatched lengths, empty)."""

    retryable = False


class CorruptFileError(DataError):
    """A data file that cannot be decoded (a truncated Parquet file, corrupt pages): the message names the
    file. A retry reads the same bytes, so the stage is not retried."""

    retryable = False


class BadRowError(TFNetError, ValueError):
    """A row cannot become a tensor: a null, an array of the wrong length, an undecodable image.

    Raised inside a Spark worker (training or prediction); the message names the column, the row
    (its position in its partition) and what was expected.
    """

    retryable = False


class ColumnError(TFNetError, ValueError):
    """The feature, label or output columns do not fit the model or the DataFrame (a missing
    column, a column type the input cannot take, an output column that already exists)."""

    retryable = False


class LabelShapeError(TFNetError, ValueError):
    """Labels and predictions have shapes the loss cannot pair."""

    retryable = False


# ---------------------------------------------------------------- training


class NonFiniteInputError(DataError):
    """Features with NaN or Inf: the message names the row (and the partition, over Spark). Pass
    ``on_nonfinite="skip"`` to leave such rows out instead."""

    retryable = False


class NonFiniteLossError(TFNetError, FloatingPointError):
    """The loss or a gradient became NaN or infinite; the weights are left at their last good state."""

    retryable = False


class OptimizerStateError(TFNetError, ValueError):
    """An optimiser state that does not fit the transformation it is given to (made by another
    method or chain: a different number of parts, or parts of another kind)."""

    retryable = False


class CheckpointError(TFNetError, ValueError):
    """A checkpoint (or another tfnet container) does not match what it is loaded into, or is corrupt."""

    retryable = False


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped because it is truncated or corrupt."""


class KerasTrainingWarning(UserWarning):
    """A Keras model holds a layer whose training-time randomness tfnet's step does not draw (a recurrent layer's
    dropout, a random augmentation layer): it trains as if in inference mode, where Keras's ``fit`` would draw."""


class StorageError(TFNetError, OSError):
    """A file could not be written or read for a reason a rerun cannot mend: a full disk or quota,
    a read-only file system, no permission. The message holds the path and the system's reason."""

    retryable = False


class KerasMappingError(TFNetError, ValueError):
    """A Keras optimiser, loss or metric that tfnet cannot map."""

    retryable = False


# ---------------------------------------------------------------- Spark and Horovod


class SparkSetupError(TFNetError, RuntimeError):
    """Spark cannot start here (no Java, or a Java older than 17), or its workers cannot run tfnet."""

    retryable = False


class DistributedTrainingError(TFNetError, RuntimeError):
    """The training stage failed on every attempt, or could not start."""

    retryable = True


class StageRetryError(TFNetError, RuntimeError):
    """Spark resubmitted the barrier stage by itself; tfnet retries from the driver instead."""

    retryable = True


class RendezvousError(TFNetError, RuntimeError):
    """The driver's rendezvous server did not answer, refused this rank, or the ranks did not all
    arrive in time."""

    retryable = True


class WorkerError(TFNetError, RuntimeError):
    """A worker failed with an exception that is not one of tfnet's (a bug, or a library error).
    The message holds the original class and message; ``worker_traceback`` the worker's traceback."""

    retryable = False


# ---------------------------------------------------------------- prediction


class BackendError(TFNetError, ValueError):
    """An unknown backend name, or a backend that cannot run this model at all."""

    retryable = False


class BackendUnavailableError(TFNetError, ImportError):
    """The requested backend's package is not installed (``pip install tfnet[openvino]``)."""

    retryable = False


class BackendFallbackWarning(UserWarning):
    """OpenVINO could not convert or compile the graph; TensorFlow runs it instead. The message
    names the operations OpenVINO could not convert."""


class CalibrationError(TFNetError, ValueError):
    """INT8 calibration data that cannot calibrate this model: empty, or of the wrong shape, dtype
    or number of inputs."""

    retryable = False


# PrecisionError (an unknown precision, or int8 without OpenVINO) and PrecisionWarning (bf16 on a CPU
# without it: fp32 runs) live with the training step in tfnet.precision; listed here for callers.
from tfnet.precision import PrecisionError, PrecisionWarning  # noqa: E402


def error_class(name: str) -> type[Exception] | None:
    """The tfnet or optim error class called ``name`` (the worker sends the name), or None."""
    import tfnet.errors as tfnet_errors

    for module in (globals(), vars(tfnet_errors)):
        cls = module.get(name)
        if isinstance(cls, type) and issubclass(cls, TFNetError):
            return cls
    return None


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception)): (.*)$")


def _tfnet_error_in(text: str) -> tuple[type[Exception], str] | None:
    """The last tfnet error named in ``text`` (a worker's traceback) and its message, or None."""
    found = None
    for line in text.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m and error_class(m.group(1)) is not None:
            found = m
    if found is None:
        return _daemon_failure_in(text)
    return error_class(found.group(1)), found.group(2)


#: Spark's words when the Python daemon of ``spark.python.daemon.module`` did not start (optim.spark.worker_daemon)
_DAEMON_FAILED = "EOFException occurred while reading the port number from optim.spark.worker_daemon's stdout"
#: the daemon's own last words, which Spark quotes: ``<python>: Error while finding module specification for
#: '<module>' (<error>)``, or the last line of a traceback
_DAEMON_SPEC = re.compile(r"^\s*(\S+): Error while finding module specification for '[^']+' \((.*)\)\s*$", re.M)
_DAEMON_SAID = re.compile(r"Error from python worker:\n(.*?)\nPYTHONPATH was:", re.S)


def _daemon_failure_in(text: str) -> tuple[type[Exception], str] | None:
    """A :class:`SparkSetupError` for a worker Python that cannot start tfnet's worker daemon (no tfnet there),
    which Spark reports only as an ``EOFException`` reading the daemon's port; else None."""
    if _DAEMON_FAILED not in text:
        return None
    spec = _DAEMON_SPEC.search(text)
    if spec:
        python, why = spec.groups()
    else:  # it started and failed later: the last line it wrote
        said = _DAEMON_SAID.search(text)
        lines = [line.strip() for line in said.group(1).splitlines() if line.strip()] if said else []
        python, why = "PYSPARK_PYTHON", lines[-1] if lines else "it exited before it started"
    return SparkSetupError, (
        f"The Spark workers' Python ({python}) cannot import tfnet, whose daemon starts them (spark.python.daemon.module "
        f"= optim.spark.worker_daemon): {why}. Install tfnet there (pip install tfnet, or the same .venv), point "
        "PYSPARK_PYTHON at a Python that has it, or leave spark.python.daemon.module unset.")


def from_spark_error(exc: BaseException) -> BaseException:
    """The tfnet error inside a Spark exception, or ``exc`` itself.

    tfnet's own calls (``optimize``, ``evaluate``, ``TFPredictor.predict`` on numpy) raise tfnet's
    errors directly. But a lazy result (the DataFrame or RDD that ``TFPredictor.predict`` returns)
    fails later, in the user's own Spark action, and Spark wraps the worker's error in its own
    exception (``PythonException``, ``Py4JJavaError``). This finds the last tfnet error named in that
    exception's text and rebuilds it, with the same class and message, ``exc`` as its cause and the
    worker's text as ``worker_traceback``. (Since ``TFPredictor.predict`` installs
    :mod:`optim.spark.typed_errors`, such actions raise the tfnet error themselves.)

    Example:
        >>> try:                                                     # doctest: +SKIP
        ...     scored = predictor.predict(df).collect()
        ... except Exception as exc:
        ...     raise optim.errors.from_spark_error(exc) from exc
    """
    if getattr(exc, "worker_traceback", None) is not None and isinstance(exc, TFNetError):
        return exc  # typed already
    found = _tfnet_error_in(str(exc))
    if found is None:
        return exc
    err = found[0](found[1])
    err.__cause__ = exc
    err.worker_traceback = str(exc)  # type: ignore[attr-defined]
    return err


_DUALS: dict[tuple[type, type], type] = {}


def typed_spark_error(exc: BaseException) -> BaseException:
    """``exc`` (pyspark's ``PythonException``, a ``Py4JJavaError``, ...) as the tfnet error it
    carries, or ``exc`` itself when it carries none. The result is an instance of both the tfnet
    class and ``type(exc)``, so a handler for either catches it; its message is the worker's one
    line, ``worker_traceback`` the worker's text and ``spark_error`` the original."""
    if isinstance(exc, TFNetError):
        return exc
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a pyspark exception whose JVM is gone cannot print itself
        return exc
    found = _tfnet_error_in(text)
    if found is None:
        return exc
    cls, message = found
    key = (cls, type(exc))
    if key not in _DUALS:
        try:
            _DUALS[key] = type(cls.__name__, (cls, type(exc)), {
                "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                "__str__": lambda self: Exception.__str__(self),
                "__repr__": lambda self: f"{cls.__name__}({Exception.__str__(self)!r})",
                "__init__": lambda self, *args: Exception.__init__(self, *args),
            })
        except TypeError:  # the two classes cannot be combined: the tfnet class alone
            _DUALS[key] = cls
    dual = _DUALS[key]
    err = dual.__new__(dual)
    err.__dict__.update(getattr(exc, "__dict__", {}))
    Exception.__init__(err, message)
    err.worker_traceback = text  # type: ignore[attr-defined]
    err.spark_error = exc  # type: ignore[attr-defined]
    return err


@contextmanager
def raise_tfnet_errors() -> Iterator[None]:
    """Inside it, a Spark action that fails with a tfnet error raises that error (see
    :func:`from_spark_error`); other exceptions pass unchanged.

    Example:
        >>> with optim.errors.raise_tfnet_errors():                  # doctest: +SKIP
        ...     predictor.predict(df).write.parquet(path)
    """
    try:
        yield
    except Exception as exc:
        err = from_spark_error(exc)
        if err is exc:
            raise
        raise err from exc
