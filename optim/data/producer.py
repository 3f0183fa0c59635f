"""A streamed rank's producer thread (:mod:`optim.data.stream`): small batches decoded several at a time, and
the thread that makes them ahead of the step. Pure: pyarrow and numpy.

With one task CPU a rank has one core, and its producer's work comes out of the step's time. Part of that
work is paid once per call whatever the batch (the Arrow reads and checks of a decode, the hand-over through
the queue), so consecutive small batches are decoded in one call (:func:`decoded_groups`), cut apart
(:func:`split_batch`: views) and handed over together (:class:`Prefetch`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from optim.data.base import Batch
from optim.errors import DataError
from optim.losses import SampleWeighted

__all__ = ["DECODE_BYTES", "MAX_DECODE_BATCHES", "Prefetch", "decoded_groups", "split_batch"]

#: Decoded bytes one decode aims at: consecutive small batches are read from Arrow in one call and
#: handed over together, so that each pays the per-call cost once (a batch of this size or more is
#: decoded alone). With ``prefetch``, the most the producer holds decoded ahead of the step.
DECODE_BYTES = 4 << 20
#: The most batches decoded in one call.
MAX_DECODE_BATCHES = 32
#: Decoded items made ahead of the consumer, by default.
DEFAULT_DEPTH = 2


def split_batch(batch: Batch, sizes: Sequence[int]) -> list[Batch]:
    """A decoded batch cut into consecutive batches of ``sizes`` rows (views, no copies).

    >>> import numpy as np
    >>> [f[0].tolist() for f, _ in split_batch(([np.arange(5)], None), [2, 3])]
    [[0, 1], [2, 3, 4]]
    """
    out, lo = [], 0
    for n in sizes:
        out.append(_rows(batch, lo, lo + n))
        lo += n
    return out


def _rows(value, lo: int, hi: int):
    if value is None:
        return None
    if isinstance(value, SampleWeighted):
        return SampleWeighted(_rows(value.labels, lo, hi), value.weights[lo:hi])
    if isinstance(value, tuple):
        return tuple(_rows(v, lo, hi) for v in value)
    if isinstance(value, list):
        return [_rows(v, lo, hi) for v in value]
    return value[lo:hi]


def decoded_groups(tables: Iterator[pa.Table], decoder: Callable[[pa.Table], Batch], batch_size: int,
                   target_bytes: int = DECODE_BYTES,
                   max_batches: int = MAX_DECODE_BATCHES) -> Iterator[list[tuple[Batch, pa.Table]]]:
    """The batches of ``tables`` (tables of whole batches: a multiple of ``batch_size`` rows each, the last may
    hold fewer; :func:`~optim.data.stream.row_batches`), decoded a group of consecutive ones at a time: a list of
    ``(batch, table)`` per group, the batches equal to ``decoder(table)`` of each ``batch_size`` rows. A group is
    a slice of one table (no copy before the decode) of about ``target_bytes`` of decoded values (the first
    decode, one batch, measures a row), at most ``max_batches`` batches. A group with a bad row is decoded again
    a batch at a time: the batches before the bad one come out first, then the error that ``decoder(table)`` of
    that batch raises."""
    per_group, measured = 1, False
    for table in tables:
        lo = 0
        while lo < table.num_rows:
            rows = min(per_group * batch_size, table.num_rows - lo)
            group = table.slice(lo, rows)
            lo += rows
            for batches in _decode_group(group, [group.slice(i, batch_size) for i in range(0, rows, batch_size)],
                                         decoder):
                yield batches
                if not measured:
                    (first, first_rows), measured = batches[0], True
                    row_bytes = max(_nbytes(first) / max(first_rows.num_rows, 1), 1.0)
                    per_group = int(min(max(target_bytes // (row_bytes * batch_size), 1), max_batches))


def _decode_group(group: pa.Table, parts: list[pa.Table],
                  decoder: Callable[[pa.Table], Batch]) -> Iterator[list[tuple[Batch, pa.Table]]]:
    if len(parts) > 1:
        try:
            whole = decoder(group)
        except Exception:  # noqa: BLE001 - decoded again a batch at a time below, where it is raised
            pass
        else:
            yield list(zip(split_batch(whole, [t.num_rows for t in parts]), parts))
            return
    out, error = [], None
    for table in parts:
        try:
            out.append((decoder(table), table))
        except Exception as exc:  # noqa: BLE001 - raised as it is, after the batches before it
            error = exc
            break
    if out:
        yield out  # the batches before a bad one first
    if error is not None:
        raise error


def _nbytes(value) -> int:
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))


class _End:
    pass


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetch:
    """Runs ``make()`` (an iterator) in a daemon thread, ``depth`` items ahead of the consumer. The
    producer's error is raised in the consumer, with its own type; closing the consumer (or dropping it)
    stops the producer at its next item. Every wait is bounded by ``poll_s`` and checks that the other
    side is still there.

    >>> list(Prefetch(lambda: iter(range(3)), depth=1))
    [0, 1, 2]
    """

    def __init__(self, make: Callable[[], Iterator], depth: int = DEFAULT_DEPTH, name: str = "tfnet-input",
                 poll_s: float = 0.1):
        self._make, self._poll = make, poll_s
        self._queue: queue.Queue = queue.Queue(maxsize=max(int(depth), 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=self._poll)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._make():
                if not self._put(item):
                    return
            self._put(_End())
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put(_Failed(exc))

    def __iter__(self) -> Iterator:
        self._thread.start()
        try:
            while True:
                try:
                    item = self._queue.get(timeout=self._poll)
                except queue.Empty:
                    if not self._thread.is_alive() and self._queue.empty():
                        raise DataError("The input thread ended without handing over its last batch.") from None
                    continue
                if isinstance(item, _End):
                    return
                if isinstance(item, _Failed):
                    raise item.exc
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stops the producer (it ends at its next item) and waits briefly for it."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self._poll + 1.0)
