"""A rank's rows streamed from stored blocks, with bounded memory. Runs wherever the loop runs (every rank,
or one process). Pure: pyarrow and numpy (TensorFlow only where :mod:`optim.arrow` decodes images).

The rows sit in *blocks* of encoded Arrow rows (images stay compressed bytes, arrays stay Arrow lists): a
local copy of a Spark partition (:mod:`optim.data.spool`), or row groups of Parquet files
(:mod:`optim.data.parquet`). :class:`StreamedDataset` gives the loop its batches for an epoch:

* **order**: with ``shuffle``, a seeded permutation of the blocks (``[seed, epoch, rank, pass]``), then a
  row shuffle inside *windows* of at least ``shuffle_buffer`` rows (consecutive blocks of that order; a
  partition of at most ``shuffle_buffer`` rows is shuffled in full). Without, the rows in stored order.
  Unlike a full shuffle, a row only moves within its window: rows of one block stay closer together
  than a permutation of the whole partition would leave them;
* **equal steps**: with ``steps``, exactly that many full batches; a shard that runs out of rows goes on
  with a new pass (a new block order, new windows), as :class:`~optim.data.arrays.ArrayDataset`
  does;
* **resume**: ``skip=k`` replays the same order and leaves out the first ``k`` batches' rows; windows
  wholly inside them are not even read;
* **overlap**: reading, decoding, augmentation and batching run in a producer thread, ``prefetch``
  groups of batches ahead of the step (:class:`Prefetch`); its errors surface in the loop, typed, after
  the batches before the failing one;
* **few calls**: consecutive small batches are decoded in one call and handed over together, a group of
  about :data:`~optim.data.producer.DECODE_BYTES` of decoded values
  (:func:`~optim.data.producer.decoded_groups`): a small model's step is short,
  and the per-call cost of the Arrow reads and of the hand-over would otherwise take a share of the
  rank's core. The batches are the ones a decode a batch gives, bit for bit.

* **one copy**: a window's rows are gathered once, in their shuffled order, into one buffer a column
  (:func:`gather_rows`); its groups are slices of it, and stored uint8 pixels come out of it as views, as
  uint8 (the step casts them inside its graph).

Memory is set by four numbers, none by the rows of the partition: the decoded groups (``prefetch + 1``
of them at once, each about :data:`~optim.data.producer.DECODE_BYTES`, or one batch where a batch is larger; a
group of uint8 pixels is a view that keeps its window's gathered rows alive), the window (``shuffle_buffer`` rows,
encoded, and once gathered; a few rows of the one before), one block (:data:`DEFAULT_BLOCK_ROWS` rows, encoded) and
the encoded rows of the group being decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from optim.arrow import ColumnRead, read_column, rebatch
from optim.data.base import Batch, DataAdapter
from optim.data.decode import row_weights
from optim.data.producer import MAX_DECODE_BATCHES, Prefetch, decoded_groups
from optim.errors import DataError
from optim.losses import SampleWeighted

__all__ = ["DEFAULT_BLOCK_ROWS", "DEFAULT_PREFETCH", "DEFAULT_SHUFFLE_BUFFER", "PIXELS_KEY", "ROW_COLUMN", "ArrowStream",
           "Decoder", "FilteredSource", "Prefetch", "StreamedDataset", "Window", "numbered", "pixel_column", "positions",
           "gather_rows", "rebatch", "row_batches", "windows"]

log = logging.getLogger("tfnet.data")

#: Rows per stored block: the unit of the block shuffle and of a read.
DEFAULT_BLOCK_ROWS = 256
#: Rows of a shuffle window (encoded); a partition of at most this many rows is shuffled in full.
DEFAULT_SHUFFLE_BUFFER = 2048
#: Decoded groups of batches made ahead of the step (a group: see :data:`optim.data.producer.DECODE_BYTES`).
DEFAULT_PREFETCH = 2
#: The column that holds each stored row's position in its partition (for errors that name a row).
ROW_COLUMN = "__tfnet_row"
#: Field metadata of a column of decoded pixels stored narrower than the decoder gives them: the dtype to give.
PIXELS_KEY = b"tfnet.pixels"


def pixel_column(name: str, pixels: np.ndarray) -> tuple[pa.Field, pa.Array]:
    """Decoded images (``(rows, h, w, c)``: uint8 as decoded, float32 once one was resized) as a stored column:
    ``uint8`` where that holds every value exactly (images decoded at their own size: a quarter of the bytes to
    store, read, shuffle and copy every epoch), else as they are (resized images). The field says which dtype the
    :class:`Decoder` gives back (uint8 pixels stay uint8, for the step to cast inside its graph), so the batches
    are the decoded ones either way, bit for bit."""
    flat = pixels.reshape(len(pixels), -1)
    stored = flat
    if flat.dtype != np.uint8:
        narrow = flat.astype(np.uint8)
        stored = narrow if np.array_equal(narrow, flat) else flat
    array = pa.FixedSizeListArray.from_arrays(pa.array(stored.reshape(-1)), flat.shape[1])
    return pa.field(name, array.type, metadata={PIXELS_KEY: str(pixels.dtype).encode()}), array


# ---------------------------------------------------------------- the order


@dataclass(frozen=True)
class Window:
    """Consecutive blocks of one pass's order, read together; ``order`` is the permutation of their
    rows (None: as stored)."""

    blocks: tuple[int, ...]
    rows: int
    order: np.ndarray | None


def windows(block_rows: Sequence[int], *, seed: int, epoch: int, rank: int, shuffle: bool, shuffle_buffer: int,
            passes: int | None = 1) -> Iterator[Window]:
    """The windows of an epoch, pass after pass (``passes=None``: without end).

    >>> [w.blocks for w in windows([4, 4, 2], seed=0, epoch=0, rank=0, shuffle=False, shuffle_buffer=8)]
    [(0,), (1,), (2,)]
    >>> [w.rows for w in windows([4, 4, 2], seed=0, epoch=0, rank=0, shuffle=True, shuffle_buffer=8)]
    [10]
    """
    p = 0
    while passes is None or p < passes:
        if shuffle:
            order = np.random.default_rng([seed, epoch, rank, p]).permutation(len(block_rows))
        else:
            order = np.arange(len(block_rows))
        group: list[int] = []
        rows = w = 0
        for b in order:
            group.append(int(b))
            rows += int(block_rows[b])
            if not shuffle or rows >= shuffle_buffer:
                yield _window(group, rows, shuffle, [seed, epoch, rank, p, 11, w])
                group, rows, w = [], 0, w + 1
        if group:
            yield _window(group, rows, shuffle, [seed, epoch, rank, p, 11, w])
        p += 1


def _window(blocks: list[int], rows: int, shuffle: bool, key: list[int]) -> Window:
    order = np.random.default_rng(key).permutation(rows) if shuffle and rows > 1 else None
    return Window(tuple(blocks), rows, order)


def row_batches(read: Callable[[int], pa.Table], plan: Iterator[Window], batch_size: int, start: int,
                stop: int | None) -> Iterator[pa.Table]:
    """The rows ``start`` to ``stop`` (None: to the end) of the stream that ``plan`` lays out, as tables of whole
    batches: each holds a multiple of ``batch_size`` rows (the last may hold fewer), one chunk per column, its rows
    copied once from the blocks read (:func:`gather_rows`). A window's rows after its last whole batch are gathered
    with the next window's, so no batch is put together from two tables. Windows before ``start`` are not read."""
    pos = 0
    carry: list[pa.Table] = []  # the blocks that rows not yet gathered sit in, and those rows
    carry_index = np.zeros(0, np.int64)
    for win in plan:
        first, pos = pos, pos + win.rows
        if pos <= start or win.rows == 0:
            continue
        if stop is not None and first >= stop:
            break
        parts = [read(b) for b in win.blocks]
        order = win.order if win.order is not None else np.arange(win.rows)
        lo = max(start - first, 0)
        hi = win.rows if stop is None else min(stop - first, win.rows)
        offset = sum(t.num_rows for t in carry)
        index = np.concatenate([carry_index, order[lo:hi].astype(np.int64) + offset])
        parts = carry + parts
        last = stop is not None and pos >= stop
        whole = len(index) if last else len(index) // batch_size * batch_size
        if whole:
            yield gather_rows(parts, index[:whole])
        carry, carry_index = _still_needed(parts, index[whole:])
        if last:
            return
    if len(carry_index):
        yield gather_rows(carry, carry_index)


def _still_needed(parts: list[pa.Table], index: np.ndarray) -> tuple[list[pa.Table], np.ndarray]:
    """The parts that rows ``index`` (positions in the concatenation of ``parts``) sit in, and the rows' positions
    in the concatenation of those parts alone."""
    if not len(index):
        return [], np.zeros(0, np.int64)
    owner, local = _locate(parts, index)
    keep = np.unique(owner)
    new_starts = np.cumsum([0] + [parts[k].num_rows for k in keep])
    remap = np.zeros(len(parts), np.int64)
    remap[keep] = new_starts[:-1]
    return [parts[k] for k in keep], local + remap[owner]


def _locate(parts: Sequence[pa.Table], index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each position of ``index`` in the concatenation of ``parts``: the part it is in, and its row there."""
    starts = np.cumsum([0] + [t.num_rows for t in parts])
    owner = np.searchsorted(starts, index, side="right") - 1
    return owner, index - starts[owner]


def gather_rows(parts: Sequence[pa.Table], index: np.ndarray) -> pa.Table:
    """The rows ``index`` (positions in the concatenation of ``parts``, tables of one schema) as one table with one
    chunk per column, each row copied once. A column of fixed-width numbers, or of fixed-size lists of them (stored
    pixels), without nulls, is copied row by row into one new buffer; any other column goes through Arrow's take
    of its concatenation (encoded bytes, labels with nulls: small next to pixels). Arrow's own take over the
    chunks of a window is several times slower on rows of kilobytes, and leaves chunks that a read copies again.

    >>> t = pa.table({"x": [1, 2, 3]})
    >>> gather_rows([t.slice(0, 2), t.slice(2)], np.array([2, 0])).column("x").to_pylist()
    [3, 1]
    """
    schema = parts[0].schema
    owner, local = _locate(parts, index)
    columns = []
    for name in schema.names:
        chunks = [c for t in parts for c in t.column(name).chunks]
        rows = None if len(chunks) != len(parts) else _fixed_width_rows(chunks)
        if rows is None:
            whole = pa.concat_arrays(chunks) if len(chunks) != 1 else chunks[0]
            columns.append(whole.take(pa.array(index)))
            continue
        out = np.empty((len(index),) + rows[0].shape[1:], rows[0].dtype)
        if out.ndim == 1 or out.shape[1] < 64:  # a number (or a short list) a row: fancy indexing is cheaper
            out[:] = np.concatenate(rows)[index]
        else:
            for j, (k, r) in enumerate(zip(owner.tolist(), local.tolist())):
                out[j] = rows[k][r]
        values = pa.array(out.reshape(-1))  # no copy: Arrow holds the numpy buffer
        field = schema.field(name)
        columns.append(values if out.ndim == 1 else pa.FixedSizeListArray.from_arrays(values, type=field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _fixed_width_rows(chunks: list[pa.Array]) -> list[np.ndarray] | None:
    """Each chunk as a numpy view of its rows (``(rows,)`` or ``(rows, list size)``) where the column holds fixed-width
    numbers or fixed-size lists of them and no nulls; else None."""
    t = chunks[0].type
    listed = pa.types.is_fixed_size_list(t)
    leaf = t.value_type if listed else t
    if not (pa.types.is_integer(leaf) or pa.types.is_floating(leaf)) or pa.types.is_float16(leaf):
        return None
    views = []
    for c in chunks:
        if c.null_count or (listed and c.values.null_count):
            return None
        flat = c.flatten() if listed else c
        views.append(flat.to_numpy(zero_copy_only=True).reshape((len(c), t.list_size) if listed else (len(c),)))
    return views


def numbered(batches, first: int = 0) -> Iterator[pa.RecordBatch]:
    """Each record batch with :data:`ROW_COLUMN` added: the rows' positions, counted from ``first``."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        yield batch.append_column(ROW_COLUMN, pa.array(np.arange(first, first + batch.num_rows, dtype=np.int64)))
        first += batch.num_rows


# ---------------------------------------------------------------- decoding


class Decoder:
    """Encoded rows (an Arrow table) to a batch of numpy arrays: one array per feature spec and per
    label spec (:class:`optim.data.decode.TensorColumns`), read through :func:`optim.arrow.read_column`.
    A row that cannot become a tensor raises :class:`~optim.errors.BadRowError` naming its column and
    where the row is: ``locate(row)`` of its position (:data:`ROW_COLUMN`), by default ``"row R of
    partition P"`` (a Parquet source names the file and the row in it)."""

    def __init__(self, features: Sequence, labels: Sequence, single_label: bool, partition: int, weight=None,
                 locate: Callable[[int], str] | None = None):
        self.features, self.labels = tuple(features), tuple(labels)
        self.single_label, self.partition = single_label, partition
        self.weight = weight  # the TensorColumns of sample weights, or None
        self.locate = locate

    def where(self, row: int) -> str:
        """Where the row at position ``row`` is, as errors name it."""
        return self.locate(row) if self.locate is not None else f"row {row} of partition {self.partition}"

    def __call__(self, table: pa.Table) -> Batch:
        arrays = [self._spec(table, spec) for spec in self.features + self.labels]
        feats, labels = arrays[:len(self.features)], arrays[len(self.features):]
        if not labels:
            return feats, None
        labels = labels[0] if self.single_label else labels
        if self.weight is None:
            return feats, labels
        column = self.weight.columns[0]
        rows = positions(table)
        weights = row_weights(self._column(table, column, None), column, self.partition, rows, where=self.where)
        return feats, SampleWeighted(labels, weights)

    def _spec(self, table: pa.Table, spec) -> np.ndarray:
        if len(spec.columns) == 1:
            return self._column(table, spec.columns[0], spec.shape)
        return np.stack([self._column(table, c, None) for c in spec.columns], axis=1)

    def _column(self, table: pa.Table, column: str, shape) -> np.ndarray:
        metadata = table.schema.field(column).metadata or {}
        dtype = metadata[PIXELS_KEY].decode() if PIXELS_KEY in metadata else None  # pixels stored narrower
        values, bad = read_column(table.column(column), ColumnRead(shape=shape, dtype=dtype), on_bad="collect",
                                  column=column, partition=self.partition)
        if bad:
            row = min(bad)
            where = int(table.column(ROW_COLUMN)[row].as_py()) if ROW_COLUMN in table.column_names else row
            raise bad[row].error_at(column, self.where(where))
        return values


def positions(table: pa.Table) -> np.ndarray:
    """Each row's position (:data:`ROW_COLUMN`), or ``0..n-1`` where the table has none."""
    if ROW_COLUMN in table.column_names:
        return table.column(ROW_COLUMN).to_numpy()
    return np.arange(table.num_rows)


# ---------------------------------------------------------------- the dataset


class BlockSource:
    """Where a :class:`StreamedDataset` reads its blocks: ``block_rows`` (the rows of each block) and
    ``open()``, a reader ``read(block) -> pa.Table`` with ``close()``, one per pass over the data."""

    block_rows: Sequence[int] = ()

    def open(self):  # pragma: no cover - interface
        raise NotImplementedError

    def release(self) -> None:
        """Removes what the source holds (a local copy); a no-op for files it does not own."""


class FilteredSource(BlockSource):
    """Some rows of another source's blocks: ``keep[b]`` (a boolean per row of block ``b``) says which."""

    def __init__(self, source: BlockSource, keep: list[np.ndarray]):
        self.source, self.keep = source, [np.asarray(k, bool) for k in keep]
        self.block_rows = [int(k.sum()) for k in self.keep]

    def open(self):
        return _FilteredReader(self.source.open(), self.keep)

    def release(self) -> None:
        self.source.release()


class _FilteredReader:
    def __init__(self, reader, keep: list[np.ndarray]):
        self.reader, self.keep = reader, keep

    def read(self, block: int) -> pa.Table:
        return self.reader.read(block).filter(pa.array(self.keep[block]))

    def close(self) -> None:
        self.reader.close()


class StreamedDataset(DataAdapter):
    """One rank's rows, read block by block from ``source`` (a :class:`BlockSource`): see the module.

    Args:
        source: The blocks.
        decoder: Encoded rows to a batch (:class:`Decoder`).
        augment: ``fn(features, rng) -> features`` for training batches, seeded by ``[seed, epoch,
            rank, batch]`` as :class:`~optim.data.arrays.ArrayDataset` seeds it. Default: none.
        shuffle_buffer: Rows of a shuffle window. Default :data:`DEFAULT_SHUFFLE_BUFFER`.
        prefetch: Decoded groups of batches made ahead of the step (:func:`~optim.data.producer.decoded_groups`). Default
            :data:`DEFAULT_PREFETCH`.
        on_batch: ``fn(batch, index, positions) -> batch`` run in the producer on every batch (checks of
            data that was not checked when stored; ``positions``: each row's :data:`ROW_COLUMN`). Default: none.
    """

    has_labels = True
    #: The most batches decoded in one call (1: a batch a decode).
    max_decode_batches = MAX_DECODE_BATCHES

    def __init__(self, source: BlockSource, decoder: Decoder, augment: Callable | None = None,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, prefetch: int = DEFAULT_PREFETCH,
                 on_batch: Callable | None = None):
        self.source, self.decoder, self.augment = source, decoder, augment
        self.shuffle_buffer, self.prefetch, self.on_batch = int(shuffle_buffer), int(prefetch), on_batch
        self.has_labels = bool(decoder.labels)
        self.single_label = decoder.single_label
        self.n = int(sum(source.block_rows))

    def __len__(self) -> int:
        return self.n

    def rows_on(self, rank: int, size: int) -> int:
        """The rows of this rank (they are its own already, whatever ``rank`` and ``size``)."""
        return self.n

    def num_batches(self, batch_size, *, rank=0, size=1, drop_remainder=False) -> int:
        return self.n // batch_size if drop_remainder else -(-self.n // batch_size)

    def batches(self, batch_size, *, epoch=0, seed=0, shuffle=True, skip=0, rank=0, size=1,
                drop_remainder=False, steps=None, training=False) -> Iterator[Batch]:
        """This rank's batches for one epoch (the arguments of :meth:`ArrayDataset.batches
        <optim.data.arrays.ArrayDataset.batches>`; the rows are this rank's already)."""
        if steps is not None and self.n == 0:
            raise DataError(f"Rank {rank} has no rows to train on.")
        if steps is not None:
            stop, passes = steps * batch_size, None
        else:
            stop, passes = ((self.n // batch_size) * batch_size if drop_remainder else self.n), 1
        start = skip * batch_size
        if start >= stop:
            return iter(())
        augment = self.augment if training else None

        def produce():
            reader = self.source.open()
            try:
                plan = windows(self.source.block_rows, seed=seed, epoch=epoch, rank=rank, shuffle=shuffle,
                               shuffle_buffer=self.shuffle_buffer, passes=passes)
                b = skip
                tables = row_batches(reader.read, plan, batch_size, start, stop)
                for group in decoded_groups(tables, self.decoder, batch_size, max_batches=self.max_decode_batches):
                    out = []
                    try:
                        for (features, labels), table in group:
                            if self.on_batch is not None:
                                features, labels = self.on_batch((features, labels), b, positions(table))
                            if augment is not None:
                                features = augment(features, np.random.default_rng([seed, epoch, rank, b, 7]))
                            out.append((features, labels))
                            b += 1
                    except BaseException:
                        if out:
                            yield out  # the batches before the one that failed, as one at a time gave them
                        raise
                    del group
                    yield out
            finally:
                reader.close()

        def flat():
            groups = iter(Prefetch(produce, self.prefetch, name=f"tfnet-input-rank{rank}"))
            try:
                for group in groups:
                    yield from group
            finally:
                groups.close()  # stops the producer when the loop drops its batches

        return flat()

    def release(self) -> None:
        """Removes the source's local copy (if it owns one)."""
        self.source.release()


class ArrowStream(DataAdapter):
    """A partition's Arrow record batches read once, in order, a batch at a time, with no copy kept
    (distributed evaluation). :meth:`batches` can be called once."""

    def __init__(self, batches, decoder: Decoder):
        self._batches, self.decoder = batches, decoder
        self.has_labels = bool(decoder.labels)
        self._used = False

    def num_batches(self, batch_size, *, rank=0, size=1, drop_remainder=False):
        return None

    def batches(self, batch_size, *, epoch=0, seed=0, shuffle=False, skip=0, rank=0, size=1,
                drop_remainder=False, steps=None, training=False) -> Iterator[Batch]:
        if self._used:
            raise DataError("A partition streamed for evaluation is read once; it has been read.")
        self._used = True
        for b, table in enumerate(rebatch(numbered(self._batches), batch_size)):
            if b < skip or (drop_remainder and table.num_rows < batch_size):
                continue
            yield self.decoder(table)
