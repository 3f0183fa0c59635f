"""Worker side: Arrow columns to model input arrays, checked row by row, and model outputs back to
Arrow columns. No Spark here; only pyarrow and numpy (and TensorFlow to decode images).

Each ``*_to_array`` function returns an array with one entry per row of the column (bad rows hold
zeros) and records the bad rows in ``bad`` as ``{row: reason}``.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa

from optim.predict.columns import InputColumn

__all__ = ["column_to_array", "array_to_arrow", "decode_image"]


def column_to_array(col: pa.Array, spec: InputColumn, bad: dict[int, str]) -> np.ndarray:
    """The input batch for one column: shape ``(rows, *row_shape)``, the input's dtype."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    convert = {"array": _list_to_array, "scalar": _scalar_to_array, "image": _images_to_array,
               "bytes": _bytes_to_array}[spec.kind]
    return convert(col, spec, bad)


def _nulls(col: pa.Array, bad: dict[int, str]) -> np.ndarray:
    """Marks null rows bad; returns the validity as a numpy bool array."""
    valid = np.ones(len(col), bool) if col.null_count == 0 else col.is_valid().to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(~valid):
        bad.setdefault(int(i), "the value is null")
    return valid


def _owners(row_offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The row each element position belongs to, given row offsets into that element level."""
    return np.searchsorted(row_offsets, positions, side="right") - 1


def _list_to_array(col: pa.Array, spec: InputColumn, bad: dict[int, str]) -> np.ndarray:
    shape = tuple(spec.input.row_shape)
    size = math.prod(shape)
    n = len(col)
    _nulls(col, bad)
    nested = spec.depth > 1
    level, row_off, depth = col, np.arange(n + 1), 0
    while pa.types.is_list(level.type) or pa.types.is_large_list(level.type):
        if depth > 0 and level.null_count:
            for row in _owners(row_off, np.flatnonzero(level.is_null().to_numpy(zero_copy_only=False))):
                bad.setdefault(int(row), "a nested array inside it is null")
        offsets = level.offsets.to_numpy()
        if nested:
            lengths = np.diff(offsets)
            wrong = np.flatnonzero(lengths != shape[depth])
            wrong = wrong[(wrong >= row_off[0]) & (wrong < row_off[-1])]
            for pos, row in zip(wrong, _owners(row_off, wrong)):
                bad.setdefault(int(row), f"dimension {depth} has length {int(lengths[pos])}, expected {shape[depth]} "
                                         f"(per-row shape {shape})")
        row_off = offsets[row_off]
        level, depth = level.values, depth + 1
    counts = np.diff(row_off)
    for row in np.flatnonzero(counts != size):
        if int(row) not in bad:
            bad[int(row)] = (f"the array has {int(counts[row])} values; input {spec.input.name!r} needs {size} "
                             f"(per-row shape {shape})")
    if level.null_count:
        nulls = np.flatnonzero(level.is_null().to_numpy(zero_copy_only=False))
        nulls = nulls[(nulls >= row_off[0]) & (nulls < row_off[-1])]
        for row in _owners(row_off, nulls):
            bad.setdefault(int(row), "the array holds a null value")
        level = level.fill_null(0)
    values = level.to_numpy(zero_copy_only=False)
    dtype = np.dtype(spec.input.dtype)
    start = row_off[:-1]
    if not bad and np.array_equal(row_off - row_off[0], np.arange(n + 1) * size):
        out = values[row_off[0]:row_off[-1]]
    else:
        out = np.zeros((n, size), values.dtype)
        good = np.array([i not in bad for i in range(n)], bool)
        if good.any():
            out[good] = values[start[good, None] + np.arange(size)]
    return out.reshape((n,) + shape).astype(dtype, copy=False)


def _scalar_to_array(col: pa.Array, spec: InputColumn, bad: dict[int, str]) -> np.ndarray:
    _nulls(col, bad)
    values = (col.fill_null(0) if col.null_count else col).to_numpy(zero_copy_only=False)
    return values.reshape((len(col),) + tuple(spec.input.row_shape)).astype(np.dtype(spec.input.dtype), copy=False)


def _bytes_to_array(col: pa.Array, spec: InputColumn, bad: dict[int, str]) -> np.ndarray:
    _nulls(col, bad)
    values = [b"" if v is None else v for v in col.to_pylist()]
    out = np.empty(len(values), object)
    out[:] = values
    return out.reshape((len(values),) + tuple(spec.input.row_shape or ()))


def _images_to_array(col: pa.Array, spec: InputColumn, bad: dict[int, str]) -> np.ndarray:
    height, width, channels = spec.input.row_shape
    dtype = np.dtype(spec.input.dtype)
    out = np.zeros((len(col), height, width, channels), dtype)
    for i, data in enumerate(col.to_pylist()):
        if data is None:
            bad.setdefault(i, "the value is null")
            continue
        try:
            out[i] = decode_image(data, height, width, channels, dtype)
        except ValueError as exc:
            bad.setdefault(i, str(exc))
    return out


def decode_image(data: bytes, height: int, width: int, channels: int, dtype=np.float32) -> np.ndarray:
    """Decodes a JPEG, PNG, GIF, BMP or WebP image to ``channels`` channels and resizes it (bilinear)
    to ``height`` x ``width``. Values stay in 0..255.

    Raises:
        ValueError: the bytes are empty or not an image TensorFlow can decode.
    """
    import tensorflow as tf

    if not data:
        raise ValueError("the image is empty (0 bytes)")
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
                         f"expected): {reason}") from None
    if tuple(image.shape[:2]) != (height, width):
        image = tf.image.resize(image, (height, width), method="bilinear")
    array = image.numpy()
    if np.issubdtype(dtype, np.integer):
        array = np.clip(np.rint(array), 0, 255)
    return array.astype(dtype, copy=False)


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
