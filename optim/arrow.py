"""Arrow columns to numpy arrays, checked row by row, and numpy arrays back to Arrow columns; Arrow batches cut
and joined into batches of a given number of rows (:func:`rebatch`).

The one reader for both sides: training (:mod:`optim.data.decode`) and prediction
(:mod:`optim.predict.worker`). Pure: pyarrow and numpy only (TensorFlow is imported when an image
column is decoded); no PySpark, no Horovod.

Column kinds (inferred from the Arrow type unless a :class:`ColumnRead` names one):

* ``"array"``: lists of numbers (``list``, ``large_list``, ``fixed_size_list``), flat (reshaped
  to the per-row shape) or nested to the per-row shape's rank (each dimension checked);
* ``"scalar"``: one number (or bool) per row;
* ``"image"``: encoded image bytes (JPEG, PNG, GIF, BMP, WebP), decoded and resized to a per-row
  shape ``(height, width, channels)``, or raw uint8 pixels of exactly that shape (``height * width *
  channels`` bytes), the smallest rows a decoded image can cross Arrow in;
* ``"bytes"``: strings or bytes, as a numpy object array.

A row that cannot become a tensor (a null, an array of the wrong length, a null inside an array,
an undecodable image) is a :class:`RowProblem`. :func:`read_column` has two policies for them:
``on_bad="raise"`` raises :class:`~optim.errors.BadRowError` at the first bad row (training: every
row must be usable), ``on_bad="collect"`` returns them with the values (bad rows hold zeros) so the
caller can null those rows (prediction with ``on_error="null"``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from optim.errors import BadRowError, ColumnError

__all__ = ["ColumnRead", "RowProblem", "ColumnValues", "read_column", "decode_image", "is_encoded_image", "is_image_shape",
           "array_to_arrow", "rebatch", "KINDS"]

KINDS = ("array", "scalar", "image", "bytes")


@dataclass(frozen=True)
class ColumnRead:
    """How to read one column.

    Attributes:
        kind: One of :data:`KINDS`. Default: inferred from the Arrow type (binary with an image
            ``shape`` is ``"image"``, other binary and strings are ``"bytes"``).
        shape: The per-row shape. Default: as stored (a flat array: the first valid row's
            length; a nested one: the first valid row's dimensions; a scalar: ``()``).
        dtype: The numpy dtype of the result. Default: as stored; images as decoded: uint8 where every row
            of the column is at its shape (raw pixels, or files decoded at their own size), float32 where
            one was resized (:func:`decode_image`).
        tensor: The tensor the column feeds, named in the reasons (``"input 'x:0' needs 6"``).
    """

    kind: str | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    tensor: str | None = None


@dataclass(frozen=True)
class RowProblem:
    """Why one row cannot become a tensor.

    Attributes:
        what: ``"null"``, ``"nested_null"``, ``"dimension"``, ``"length"``, ``"element_null"``
            or ``"image"``.
        text: The reason as a phrase, e.g. ``"the value is null"``.
        got: For ``"length"``: the number of values the row holds.
        want: For ``"length"``: the number of values expected.
        shape: The per-row shape expected.
    """

    what: str
    text: str
    got: int | None = None
    want: int | None = None
    shape: tuple[int, ...] | None = None

    def error(self, column: str, row: int, partition: int) -> BadRowError:
        """The training error for this problem at ``row`` of ``partition``."""
        return self.error_at(column, f"row {row} of partition {partition}")

    def error_at(self, column: str, where: str) -> BadRowError:
        """The training error for this problem at ``where`` (``"row 3 of partition 1"``, ``"row 3 of file
        'part-0.parquet'"``)."""
        if self.what == "null":
            return BadRowError(f"Column {column!r} is null at {where}; every training row needs a value.")
        if self.what == "length":
            return BadRowError(f"Column {column!r} {where} has {self.got} values; "
                               f"expected {self.want} (per-row shape {self.shape}).")
        return BadRowError(f"Column {column!r} {where}: {self.text}.")


class ColumnValues(NamedTuple):
    """What :func:`read_column` returns: one entry per row (bad rows hold zeros), and the bad rows."""

    values: np.ndarray
    bad: dict[int, RowProblem]


NULL = RowProblem("null", "the value is null")


def read_column(col: pa.Array | pa.ChunkedArray, how: ColumnRead = ColumnRead(), *, on_bad: str = "collect",
                column: str = "?", partition: int = 0, row_offset: int = 0) -> ColumnValues:
    """Reads one Arrow column into an array of shape ``(rows, *per_row_shape)``.

    Args:
        col: The column.
        how: Its kind, per-row shape and dtype. Default: all inferred.
        on_bad: ``"raise"``: raise at the first bad row; ``"collect"``: return the bad rows.
            Default ``"collect"``.
        column: The column's name, for errors.
        partition: The partition the column comes from, for errors.
        row_offset: The position of the column's first row in its partition, for errors.

    Returns:
        The values and ``{row: problem}`` (rows counted from the column's first row; empty with
        ``on_bad="raise"``).

    Raises:
        BadRowError: ``on_bad="raise"`` and a row is bad (the first one is named).
        ColumnError: the column's type cannot give tensors of this kind and shape.
        ValueError: ``on_bad`` is neither ``"raise"`` nor ``"collect"``.
    """
    if on_bad not in ("raise", "collect"):
        raise ValueError(f"`on_bad` must be 'raise' or 'collect'. Received: on_bad={on_bad!r}")
    if isinstance(col, pa.ChunkedArray):  # one chunk is read as it is: combine_chunks copies even that
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    kind = how.kind or _infer_kind(col.type, how.shape, column)
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {KINDS}. Received: kind={kind!r}")
    bad: dict[int, RowProblem] = {}
    values = _READERS[kind](col, how, bad, column)
    if bad and on_bad == "raise":
        row = min(bad)
        raise bad[row].error(column, row_offset + row, partition)
    return ColumnValues(values, bad)


# ---------------------------------------------------------------- kinds


def _list_like(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t)


def is_image_shape(shape) -> bool:
    """Whether ``shape`` is a per-row image shape: ``(height, width, channels)``, all known, with 1, 3
    or 4 channels (what an encoded-image column decodes to)."""
    return shape is not None and len(shape) == 3 and None not in shape and shape[2] in (1, 3, 4)


def _infer_kind(t: pa.DataType, shape, column: str) -> str:
    if _list_like(t):
        leaf = t
        while _list_like(leaf):
            leaf = leaf.value_type
        if _numeric(leaf):
            return "array"
    elif _numeric(t):
        return "scalar"
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "image" if is_image_shape(shape) else "bytes"
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        return "bytes"
    raise ColumnError(
        f"Column {column!r} has type {t}; tensors come from numeric columns, arrays of numbers, binary "
        "columns of encoded images (with a (height, width, channels) shape) or strings."
    )


def _nulls(col: pa.Array, bad: dict[int, RowProblem]) -> np.ndarray:
    """Marks null rows bad; returns the validity as a numpy bool array."""
    valid = np.ones(len(col), bool) if col.null_count == 0 else col.is_valid().to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(~valid):
        bad.setdefault(int(i), NULL)
    return valid


def _owners(row_offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The row each element position belongs to, given row offsets into that element level."""
    return np.searchsorted(row_offsets, positions, side="right") - 1


def _offsets(level: pa.Array) -> np.ndarray:
    """Offsets of ``level``'s entries into ``level.values`` (which ignores a slice's offset)."""
    if pa.types.is_fixed_size_list(level.type):
        return (np.arange(len(level) + 1, dtype=np.int64) + level.offset) * level.type.list_size
    return level.offsets.to_numpy().astype(np.int64, copy=False)


def _depth(t: pa.DataType) -> int:
    depth = 0
    while _list_like(t):
        t, depth = t.value_type, depth + 1
    return depth


def _first_row_shape(col: pa.Array, valid: np.ndarray, depth: int) -> tuple[int, ...]:
    rows = np.flatnonzero(valid)
    value = col[int(rows[0])].as_py() if len(rows) else None
    dims = []
    for _ in range(depth):
        dims.append(len(value) if value is not None else 0)
        value = value[0] if value else None
    return tuple(dims)


def _read_array(col: pa.Array, how: ColumnRead, bad: dict[int, RowProblem], column: str) -> np.ndarray:
    n, depth = len(col), _depth(col.type)
    valid = _nulls(col, bad)
    shape = tuple(int(d) for d in how.shape) if how.shape is not None else _first_row_shape(col, valid, depth)
    nested = depth > 1
    if nested and depth != len(shape):
        raise ColumnError(f"Column {column!r} is nested {depth} deep, but the per-row shape is {shape}; use a flat "
                          f"array or one nested {len(shape)} deep.")
    size = math.prod(shape)
    level, row_off, d = col, np.arange(n + 1), 0
    while _list_like(level.type):
        if d > 0 and level.null_count:
            for row in _owners(row_off, np.flatnonzero(level.is_null().to_numpy(zero_copy_only=False))):
                bad.setdefault(int(row), RowProblem("nested_null", "a nested array inside it is null"))
        offsets = _offsets(level)
        if nested:
            lengths = np.diff(offsets)
            wrong = np.flatnonzero(lengths != shape[d])
            wrong = wrong[(wrong >= row_off[0]) & (wrong < row_off[-1])]
            for pos, row in zip(wrong, _owners(row_off, wrong)):
                bad.setdefault(int(row), RowProblem(
                    "dimension", f"dimension {d} has length {int(lengths[pos])}, expected {shape[d]} "
                                 f"(per-row shape {shape})", shape=shape))
        row_off = offsets[row_off]
        level, d = level.values, d + 1
    counts = np.diff(row_off)
    needs = f"input {how.tensor!r} needs" if how.tensor else "expected"
    for row in np.flatnonzero(counts != size):
        if int(row) not in bad:
            bad[int(row)] = RowProblem("length", f"the array has {int(counts[row])} values; {needs} {size} "
                                                 f"(per-row shape {shape})", int(counts[row]), size, shape)
    if level.null_count:
        nulls = np.flatnonzero(level.is_null().to_numpy(zero_copy_only=False))
        nulls = nulls[(nulls >= row_off[0]) & (nulls < row_off[-1])]
        for row in _owners(row_off, nulls):
            bad.setdefault(int(row), RowProblem("element_null", "the array holds a null value"))
        level = level.fill_null(0)
    values = level.to_numpy(zero_copy_only=False)
    if not bad and np.array_equal(row_off - row_off[0], np.arange(n + 1) * size):
        out = values[row_off[0]:row_off[-1]]
    else:
        out = np.zeros((n, size), values.dtype)
        good = np.ones(n, bool)
        good[list(bad)] = False
        if good.any() and size:  # a mask over the elements: good rows hold exactly `size` each
            out[good] = values[row_off[0]:row_off[-1]][np.repeat(good, counts)].reshape(-1, size)
    return _cast(out.reshape((n,) + shape), how.dtype)


def _read_scalar(col: pa.Array, how: ColumnRead, bad: dict[int, RowProblem], column: str) -> np.ndarray:
    _nulls(col, bad)
    values = (col.fill_null(False if pa.types.is_boolean(col.type) else 0) if col.null_count else col)
    out = values.to_numpy(zero_copy_only=False)
    if how.shape is not None:
        out = out.reshape((len(col),) + tuple(how.shape))
    return _cast(out, how.dtype)


def _cast(out: np.ndarray, dtype: str | None) -> np.ndarray:
    """``out`` as ``dtype``; without one, as stored (decimals, which numpy holds as objects, as float64)."""
    if dtype:
        return out.astype(np.dtype(dtype), copy=False)
    return out.astype(np.float64) if out.dtype == object else out


def _read_bytes(col: pa.Array, how: ColumnRead, bad: dict[int, RowProblem], column: str) -> np.ndarray:
    _nulls(col, bad)
    values = [b"" if v is None else v for v in col.to_pylist()]
    out = np.empty(len(values), object)
    out[:] = values
    return out.reshape((len(values),) + tuple(how.shape or ()))


def _read_images(col: pa.Array, how: ColumnRead, bad: dict[int, RowProblem], column: str) -> np.ndarray:
    if not is_image_shape(how.shape):
        raise ColumnError(f"Column {column!r} holds encoded images, which need a per-row shape (height, width, "
                          f"channels) with 1, 3 or 4 channels. Received: shape={how.shape}")
    height, width, channels = how.shape
    dtype = np.dtype(how.dtype) if how.dtype else None  # None: as decoded (uint8 unless a row is resized)
    raw = _raw_pixel_rows(col, height * width * channels)
    if raw is not None:  # every row holds raw pixels' size: one view, one copy (or conversion)
        out = raw.reshape(len(col), height, width, channels).astype(dtype or np.uint8)
        for i in np.flatnonzero(_starts_like_a_file(raw)):  # (rare) decoded if it is a file, as one row is
            image = decode_image(raw[i].tobytes(), height, width, channels, dtype)
            out = out if image.dtype == out.dtype else out.astype(image.dtype)  # resized: the column is float32
            out[i] = image
        return out
    rows: list = [None] * len(col)
    for i, data in enumerate(col.to_pylist()):
        if data is None:
            bad.setdefault(i, NULL)
            continue
        try:
            rows[i] = decode_image(data, height, width, channels, dtype)
        except ValueError as exc:
            bad.setdefault(i, RowProblem("image", str(exc)))
    resized = any(r is not None and r.dtype != np.uint8 for r in rows)
    out = np.zeros((len(col), height, width, channels), dtype or (np.float32 if resized else np.uint8))
    for i, image in enumerate(rows):
        if image is not None:
            out[i] = image
    return out


def _raw_pixel_rows(col: pa.Array, size: int) -> np.ndarray | None:
    """``col``'s rows as one ``(rows, size)`` uint8 view of its data buffer (no copy) when it is a binary column
    without nulls whose every row holds exactly ``size`` bytes; else None, and the rows are read one by one
    (:func:`decode_image`). A binary column of raw pixels is how decoded images cross Arrow at a byte a value:
    reading it row by row made a Python ``bytes`` copy of every image before the conversion. A row of that size
    may still be an image file (:func:`decode_image` decodes it if it is one): the caller decodes the rows
    :func:`_starts_like_a_file` finds."""
    n = len(col)
    if n == 0 or col.null_count or not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        return None
    offset_type = np.int64 if pa.types.is_large_binary(col.type) else np.int32
    _, offsets_buf, data_buf = col.buffers()
    offsets = np.frombuffer(offsets_buf, offset_type)[col.offset:col.offset + n + 1]
    if data_buf is None or offsets[-1] - offsets[0] != n * size or np.any(np.diff(offsets) != size):
        return None
    return np.frombuffer(data_buf, np.uint8)[offsets[0]:offsets[-1]].reshape(n, size)


def _starts_like_a_file(rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows`` (``(n, size)`` uint8): whether it starts like a PNG, JPEG, GIF, BMP or WebP file, as
    :func:`is_encoded_image` says for one row's bytes."""
    found = np.zeros(len(rows), bool)
    for magic in _MAGIC:
        if rows.shape[1] < len(magic):
            continue
        hit = np.all(rows[:, :len(magic)] == np.frombuffer(magic, np.uint8), axis=1)
        if magic == b"RIFF":  # a RIFF file is an image only as WebP
            hit &= (np.all(rows[:, 8:12] == np.frombuffer(b"WEBP", np.uint8), axis=1) if rows.shape[1] >= 12
                    else False)
        found |= hit
    return found


_READERS = {"array": _read_array, "scalar": _read_scalar, "image": _read_images, "bytes": _read_bytes}


_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM", b"RIFF")


def is_encoded_image(data: bytes) -> bool:
    """Whether ``data`` starts like a PNG, JPEG, GIF, BMP or WebP file."""
    return data.startswith(_MAGIC) and (not data.startswith(b"RIFF") or data[8:12] == b"WEBP")


def decode_image(data: bytes, height: int, width: int, channels: int, dtype=np.float32) -> np.ndarray:
    """Decodes a JPEG, PNG, GIF, BMP or WebP image to ``channels`` channels and resizes it (bilinear)
    to ``height`` x ``width``; bytes that are no such file and hold exactly ``height * width * channels``
    bytes are raw pixels (uint8, row-major: ``ndarray.tobytes()`` of a ``uint8`` image), taken as they are.
    Values stay in 0..255. ``dtype=None``: as decoded, uint8, or float32 where the image was resized.

    Raises:
        ValueError: the bytes are empty, or neither raw pixels of that shape nor an image TensorFlow can
            decode.
    """
    if not data:
        raise ValueError("the image is empty (0 bytes)")
    raw = len(data) == height * width * channels
    if raw and not is_encoded_image(data):
        return np.frombuffer(data, np.uint8).reshape(height, width, channels).astype(dtype or np.uint8)
    try:
        return _decode(data, height, width, channels, dtype)
    except ValueError:
        if raw:  # raw pixels that happen to start like a file
            return np.frombuffer(data, np.uint8).reshape(height, width, channels).astype(dtype or np.uint8)
        raise


def _decode(data: bytes, height: int, width: int, channels: int, dtype) -> np.ndarray:
    import tensorflow as tf  # only where images are decoded: OpenVINO prediction workers need not load it

    try:
        if data[:3] == b"\xff\xd8\xff":  # JPEG: the accurate IDCT, as libjpeg's default and Pillow use
            image = tf.io.decode_jpeg(data, channels=min(channels, 3), dct_method="INTEGER_ACCURATE")
            if channels == 4:
                alpha = tf.fill(tf.concat([tf.shape(image)[:2], [1]], 0), tf.constant(255, tf.uint8))
                image = tf.concat([image, alpha], -1)
        else:
            image = tf.io.decode_image(data, channels=channels, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as exc:
        reason = (exc.message or str(exc)).strip().splitlines()[0]
        reason = re.sub(r"\s*\[Op:\w+\].*$", "", re.sub(r"\{\{function_node [^}]*\}\}\s*", "", reason))
        raise ValueError(f"the image could not be decoded ({len(data)} bytes; JPEG, PNG, GIF, BMP or WebP "
                         f"expected, or {height * width * channels} bytes of raw uint8 pixels): {reason}") from None
    if tuple(image.shape[:2]) != (height, width):
        image = tf.image.resize(image, (height, width), method="bilinear")
    array = image.numpy()
    if dtype is None:  # as decoded: uint8, float32 once resized
        return array
    if np.issubdtype(dtype, np.integer):
        array = np.clip(np.rint(array), 0, 255)
    return array.astype(dtype, copy=False)


# ---------------------------------------------------------------- numpy -> Arrow


def array_to_arrow(values: np.ndarray, valid: np.ndarray | None, dtype: str) -> pa.Array:
    """One output column: a scalar per row, or nested lists to the row's rank. Rows where
    ``valid`` is False are null."""
    values = np.asarray(values)
    n, dims = values.shape[0], values.shape[1:]
    nulls = None if valid is None or valid.all() else ~np.asarray(valid, bool)
    row_nulls = nulls if not dims else None  # a scalar column carries the nulls in its leaf
    if dtype == "object":
        flat = [v if isinstance(v, bytes) else str(v).encode() for v in values.reshape(-1).tolist()]
        if row_nulls is not None:
            flat = [None if null else v for v, null in zip(flat, row_nulls)]
        leaf = pa.array(flat, pa.binary())
    else:
        leaf = pa.array(values.reshape(-1).astype(dtype, copy=False), mask=row_nulls)
    if not dims:
        return leaf
    mask = None if nulls is None else pa.array(nulls)
    arr, count = leaf, n * math.prod(dims)
    for d in reversed(dims[1:]):
        count //= d
        arr = pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32) * d), arr)
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * dims[0]), arr, mask=mask)


def rebatch(tables, batch_size: int) -> Iterator[pa.Table]:
    """Arrow tables (or record batches) cut and joined into tables of ``batch_size`` rows, in order (the
    last may be shorter)."""
    pending: list[pa.Table] = []
    have = 0
    for table in tables:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        while table.num_rows:
            piece = table.slice(0, batch_size - have)
            table = table.slice(piece.num_rows)
            pending.append(piece)
            have += piece.num_rows
            if have == batch_size:
                yield pa.concat_tables(pending) if len(pending) > 1 else pending[0]
                pending, have = [], 0
    if pending:
        yield pa.concat_tables(pending) if len(pending) > 1 else pending[0]
