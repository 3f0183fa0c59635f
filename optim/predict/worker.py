"""Runs inside Spark's Python workers: the per-process model cache and the partition loops.

A Python worker is reused across tasks (``spark.python.worker.reuse``, on by default), so a model is
loaded once per worker process and kept in :data:`_ENGINES`, keyed by the payload's checksum: not
once per task, batch or row. The payload itself travels once, as a Spark broadcast.

Rows are checked before the model sees them. A bad row (a null, an array of the wrong length, an
image that does not decode) raises :class:`BadRowError` naming the column and the row, or, with
``on_error="null"``, gets null outputs and its reason in the error column; the other rows of its
batch are still predicted.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from optim.arrow import array_to_arrow, decode_image, read_column, rebatch
from optim.carriers import Carrier
from optim.errors import BadRowError
from optim.predict.backends import Payload, build_engine
from optim.predict.columns import ColumnPlan
from tfnet.errors import GraphExecutionError

__all__ = ["WorkerJob", "predict_columns", "arrow_udf_body", "predict_rdd_partition", "get_engine", "load_count", "StatsParam"]

# Loaded engines of this process, most recently used last; at most _CACHE_SIZE models.
_ENGINES: OrderedDict[str, Any] = OrderedDict()
_CACHE_SIZE = int(os.environ.get("TFNET_PREDICTOR_CACHE_SIZE", "4"))
_LOADS: dict[str, int] = {}


@dataclass(frozen=True)
class WorkerJob:
    """Everything a task needs, pickled with the task (small: the model is in ``payload``).

    Attributes:
        model_id: The payload's checksum: the cache key.
        payload: The :class:`Payload` in its :class:`~optim.carriers.Carrier`: a Spark broadcast (classic), the
            plan (Spark Connect) or the job itself (locally), as :mod:`optim.predict.shipping` chose.
        plan: The column plan (DataFrames) or None (RDDs).
        batch_size: Rows per model call (``batch_per_thread``).
        on_error: ``"raise"`` or ``"null"``.
        stats: A Spark accumulator with :class:`StatsParam`, or None.
    """

    model_id: str
    payload: Carrier
    plan: ColumnPlan | None
    batch_size: int
    on_error: str
    stats: Any = None


class StatsParam:
    """Accumulator merge rule for prediction statistics: ``max_rows`` keeps the maximum, every
    other key sums. Keys: ``calls``, ``rows``, ``max_rows`` and ``loads@host:pid``."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:  # noqa: N802 (Spark's name)
        return merge_stats(a, b)


def merge_stats(a: dict, b: dict) -> dict:
    for key, value in b.items():
        a[key] = max(a.get(key, 0), value) if key == "max_rows" else a.get(key, 0) + value
    return a


def _record(job: WorkerJob, update: dict) -> None:
    if job.stats is not None:
        job.stats.add(update)


def get_engine(job: WorkerJob, set_threads: bool = True):
    """The engine for ``job``'s model, loaded on first use in this process and cached.
    ``set_threads`` marks a worker process (quiet TensorFlow, its thread pools set)."""
    engine = _ENGINES.get(job.model_id)
    if engine is not None:
        _ENGINES.move_to_end(job.model_id)
        return engine
    if set_threads:
        from optim.logs import quiet_worker

        quiet_worker()
    payload = job.payload.read()
    engine = build_engine(payload, set_threads=set_threads)
    _ENGINES[job.model_id] = engine
    while len(_ENGINES) > max(_CACHE_SIZE, 1):
        _ENGINES.popitem(last=False)
    _LOADS[job.model_id] = _LOADS.get(job.model_id, 0) + 1
    _record(job, {f"loads@{socket.gethostname()}:{os.getpid()}": 1})
    return engine


def load_count(model_id: str) -> int:
    """How many times this process has loaded the model ``model_id`` (1 once cached)."""
    return _LOADS.get(model_id, 0)


def _partition_id(default: int | None = 0) -> int | None:
    """This Spark task's partition, or ``default`` outside a task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else default


def _row_error(column: str | None, row: int, partition: int, reason: str) -> BadRowError:
    where = f"Column {column!r}, row {row}" if column else f"Row {row}"
    return BadRowError(
        f"{where} of partition {partition}: {reason}. Fix or filter the row, or pass on_error='null' to get "
        "null outputs and the reason in an error column."
    )


# ---------------------------------------------------------------------------- DataFrames


#: The worker's own SIGPIPE handling, saved while tfnet's outputs are written and until the worker's next task.
_PIPE: dict = {}


@contextmanager
def _ends_quietly_when_unread() -> Iterator[None]:
    """While a partition's outputs are written, the Python worker ends quietly (``SIGPIPE``'s default:
    the process ends) if the JVM stops reading them. ``show(n)``, ``limit(n)`` and ``take(n)`` stop
    reading a partition once they have their rows and close the worker's socket; the worker's next
    write (its outputs, pyspark's closing flush, or the error it writes when its next read finds the
    socket closed) then fails and pyspark's daemon prints that ``BrokenPipeError``, with its
    traceback, on the console, for every such task. Python ignores ``SIGPIPE`` (hence the error).
    The worker's own handling comes back when its next task arrives (:func:`_until_next_task`), so
    its later tasks (the user's own UDFs too) see a failed write as usual. Only in a Spark task, on
    the worker's main thread (where signals are set)."""
    if _partition_id(default=None) is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    except (ValueError, OSError, AttributeError):  # no SIGPIPE (Windows), or not allowed here
        yield
        return
    _PIPE.setdefault("saved", previous)  # a task after a tfnet task: the handling saved before still stands
    try:
        yield
    finally:
        _until_next_task()


class _UnreadStderr:
    """The worker's stderr between a tfnet task and its next one: lines pass through, except a traceback whose
    error is the JVM's closed or reset socket (``ConnectionResetError``, ``BrokenPipeError``). pyspark's daemon
    flushes the worker's output after each task; when the JVM stopped reading it (``show(n)``), that flush can
    fail with ``ECONNRESET``, which no ``SIGPIPE`` ends, and the daemon prints it before the worker exits."""

    QUIET = ("ConnectionResetError", "BrokenPipeError")
    #: the line pyspark's daemon prints before such a traceback (pyspark/daemon.py, worker()): held with it
    HEADER = "PySpark daemon failed to flush the output to the worker process:"

    def __init__(self, stream):
        self.stream, self._held, self._partial = stream, [], ""

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._line(line + "\n")
        return len(text)

    def _line(self, line: str) -> None:
        if (line.startswith((self.HEADER, "Traceback (most recent call last):"))
                or (self._held and line.startswith(" "))):
            self._held.append(line)  # a traceback's frames: held until its error line says whose it is
            return
        held, self._held = self._held, []
        if held and line.startswith(self.QUIET):
            return
        self.stream.write("".join(held) + line)
        self.stream.flush()

    def flush(self) -> None:
        if self._partial and not self._held:
            self.stream.write(self._partial)
            self._partial = ""
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _until_next_task() -> None:
    """Until the JVM sends this worker its next task, ``SIGPIPE`` ends the worker. pyspark's daemon
    looks its worker module's ``main`` up for every task; tfnet's stands in front of it once: when the
    next task's first bytes arrive it puts the worker's own ``SIGPIPE`` handling and stderr back and runs
    pyspark's ``main``; when the socket is closed instead (the JVM keeps no worker whose output it left
    unread) the worker ends quietly, where pyspark would print a ``BrokenPipeError`` writing its error back.
    Until then stderr drops the daemon's traceback of a reset socket (:class:`_UnreadStderr`).
    Without such a module (another pyspark), the handling comes back at once."""
    name = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].startswith("pyspark") else "pyspark.worker"
    module = sys.modules.get(name)
    pyspark_main = getattr(module, "main", None)
    if getattr(pyspark_main, "tfnet_next_task", False):
        return  # in front already
    if pyspark_main is None:
        signal.signal(signal.SIGPIPE, _PIPE.pop("saved"))
        return
    stderr = sys.stderr
    sys.stderr = _UnreadStderr(stderr)

    def main(infile, outfile):
        module.main = pyspark_main
        try:
            closed = infile.peek(1) == b""
        except OSError:  # reset by the JVM
            closed = True
        if closed:
            os._exit(0)
        sys.stderr.flush()
        sys.stderr = stderr
        signal.signal(signal.SIGPIPE, _PIPE.pop("saved"))
        return pyspark_main(infile, outfile)

    main.tfnet_next_task = True  # type: ignore[attr-defined]
    module.main = main


def predict_columns(batches: Iterable, job: WorkerJob) -> Iterator:
    """Body of the prediction's Arrow UDF (``ArrowUDFType.SCALAR_ITER``). Each item of ``batches`` holds the
    feature columns of one Arrow batch, in the plan's input order (a tuple of arrays, or one array); for every
    ``job.batch_size`` rows, in order, it yields a struct array with the output columns (and the error column).
    Only the feature columns come to the worker, and only the outputs go back: Spark keeps the other columns."""
    partition, row = _partition_id(), 0

    def counted(batches):
        for batch in batches:
            _record(job, {"arrow_batches": 1})
            yield batch

    with _ends_quietly_when_unread():
        for chunk in _chunks(counted(batches), job.batch_size):
            yield _predict_chunk(chunk, job, partition, row)
            row += len(chunk[0])


def _chunks(batches: Iterable, size: int) -> Iterator[list]:
    """The rows of ``batches`` (each a tuple of equal-length Arrow arrays, or one array) in chunks of ``size`` rows,
    a list of columns each, across the batches' boundaries (:func:`optim.arrow.rebatch`): Spark cuts a partition into
    Arrow batches by its own bounds (rows and bytes), and a chunk cut short at each boundary would be a smaller call of
    the model. A chunk that spans two batches holds two-chunk columns, which :func:`optim.arrow.read_column` joins
    (its own rows only). The partition's last chunk may be shorter. (An iterator Arrow UDF may answer later than it is
    fed, never sooner: pyspark checks both.)"""
    import pyarrow as pa

    def tables():
        for arrays in batches:
            arrays = tuple(arrays) if isinstance(arrays, (tuple, list)) else (arrays,)
            yield pa.Table.from_arrays(list(arrays), names=[str(i) for i in range(len(arrays))])

    for table in rebatch(tables(), size):
        yield table.columns


def arrow_udf_body(job: WorkerJob):
    """:func:`predict_columns` for ``job`` as ``pyspark.sql.functions.arrow_udf`` takes it: type hints say it is
    an iterator UDF (of one column, or of a tuple of columns), which pyspark prefers to an explicit UDF type."""
    import typing

    import pyarrow as pa

    def predict(batches):
        return predict_columns(batches, job)

    arg = typing.Iterator[pa.Array] if len(job.plan.inputs) == 1 else typing.Iterator[tuple[pa.Array, ...]]
    predict.__annotations__ = {"batches": arg, "return": typing.Iterator[pa.Array]}
    return predict


def _predict_chunk(chunk: list, job: WorkerJob, partition: int, first_row: int):
    import pyarrow as pa

    plan, n = job.plan, len(chunk[0])
    t0 = time.perf_counter()
    bad: dict[int, tuple[str, str]] = {}
    arrays = []
    for spec, column in zip(plan.inputs, chunk):
        values, col_bad = read_column(column, spec.reading)
        arrays.append(values)
        for r, problem in col_bad.items():
            bad.setdefault(r, (spec.column, problem.text))
    if bad and job.on_error == "raise":
        r = min(bad)
        raise _row_error(bad[r][0], first_row + r, partition, bad[r][1])
    good = np.ones(n, bool)
    good[list(bad)] = False
    messages = {r: f"column {c!r}: {reason}" for r, (c, reason) in bad.items()}
    feed = arrays if not bad else [a[good] for a in arrays]
    t1 = time.perf_counter()
    outputs = _run(job, feed, good, messages, f"rows {first_row} to {first_row + n - 1} of partition {partition}")
    t2 = time.perf_counter()
    columns = [array_to_arrow(o, good, spec.dtype) for o, spec in zip(outputs, plan.outputs)]
    names = [spec.column for spec in plan.outputs]
    if plan.error_col:
        columns.append(pa.array([messages.get(i) for i in range(n)], pa.string()))
        names.append(plan.error_col)
    out = pa.StructArray.from_arrays(columns, names=names)
    _record(job, {"read_s": t1 - t0, "write_s": time.perf_counter() - t2})
    return out


def _run(job: WorkerJob, feed: list, good: np.ndarray, messages: dict, where: str) -> list[np.ndarray]:
    """Runs the model on ``feed`` (the good rows only); returns full-length outputs, zeros where a
    row is not good. A model failure raises (``on_error="raise"``) or marks every good row."""
    n, k = len(good), int(good.sum())
    outs = None
    if k:
        try:
            engine = get_engine(job)
            t0 = time.perf_counter()
            outs = engine.run(feed)
            engine_s = time.perf_counter() - t0
        except Exception as exc:  # the engine's own error types vary (TF, OpenVINO)
            if job.on_error == "raise":
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise GraphExecutionError(f"The model failed on {where}: {type(exc).__name__}: {first}") from exc
            for i in np.flatnonzero(good):
                messages[int(i)] = f"the model failed on this row's batch: {type(exc).__name__}: {str(exc)[:300]}"
            good[:] = False
        else:
            _record(job, {"calls": 1, "rows": k, "max_rows": k, "engine_s": engine_s,
                          "input_bytes": sum(int(getattr(a, "nbytes", 0)) for a in feed)})
    if outs is not None and k == n:
        return list(outs)
    full = []
    for i, info in enumerate(_outputs(job)):
        if outs is not None:
            out = np.zeros((n,) + outs[i].shape[1:], outs[i].dtype)
            out[good] = outs[i]
        else:
            out = np.zeros((n,) + tuple(d or 1 for d in info.row_shape or ()),
                           object if info.dtype == "string" else np.float32)
        full.append(out)
    return full


def _outputs(job: WorkerJob):
    if job.plan is not None:
        return [spec.output for spec in job.plan.outputs]
    payload = job.payload.read()
    return list(payload.outputs)


# ---------------------------------------------------------------------------- RDDs


def predict_rdd_partition(index: int, rows: Iterable, job: WorkerJob) -> Iterator:
    """``mapPartitionsWithIndex`` body: one output per element, in order. An element is an array
    (one input), a list or tuple in input order, or a dict by input name; an output is an array
    (one output) or a list of arrays. With ``on_error="null"`` a bad element gives None."""
    payload = job.payload.read()
    buffer, first = [], 0
    with _ends_quietly_when_unread():
        for row in rows:
            buffer.append(row)
            if len(buffer) == job.batch_size:
                yield from _predict_rows(buffer, job, payload, index, first)
                first += len(buffer)
                buffer = []
        if buffer:
            yield from _predict_rows(buffer, job, payload, index, first)


def _predict_rows(rows: list, job: WorkerJob, payload: Payload, partition: int, first_row: int) -> Iterator:
    from tfnet.inputs import arrange

    names = [t.name for t in payload.inputs]
    n = len(rows)
    values: list = [None] * n
    messages: dict[int, str] = {}
    for r, row in enumerate(rows):
        try:
            values[r] = [_row_value(v, t) for v, t in zip(arrange(row, names, "input"), payload.inputs)]
        except (ValueError, TypeError) as exc:
            if job.on_error == "raise":
                raise _row_error(None, first_row + r, partition, str(exc)) from None
            messages[r] = str(exc)
    good = np.array([v is not None for v in values], bool)
    kept = [v for v in values if v is not None]
    feed = [np.stack([v[j] for v in kept]) for j in range(len(names))] if kept else []
    outputs = _run(job, feed, good, messages, f"elements {first_row} to {first_row + n - 1} of partition {partition}")
    for r in range(n):
        if not good[r]:
            yield None
        elif len(outputs) == 1:
            yield outputs[0][r]
        else:
            yield [o[r] for o in outputs]


def _row_value(value, info) -> np.ndarray:
    """One element's value for one input, checked against the per-row shape."""
    shape = tuple(info.row_shape or ())
    if value is None:
        raise ValueError(f"input {info.name!r} is None")
    if isinstance(value, (bytes, bytearray)) and info.dtype != "string" and len(shape) == 3:
        return decode_image(bytes(value), *shape, dtype=np.dtype(info.dtype))
    array = np.asarray(value, dtype=object if info.dtype == "string" else None)
    if info.dtype != "string" and array.dtype.kind not in "fiub":
        raise TypeError(f"input {info.name!r} takes numbers; received dtype {array.dtype}")
    if array.shape != shape:
        if None in shape or array.size != int(np.prod(shape)):
            raise ValueError(f"input {info.name!r} needs per-row shape {shape}; received shape {array.shape}")
        array = array.reshape(shape)
    return array
