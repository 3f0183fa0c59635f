"""``validation_split``: a seeded fraction of the training rows held out for validation, the same rows on every
attempt and on every data road. Both sides (the driver splits numpy arrays; a rank splits its own rows as it reads
them, so no row leaves its rank).

A row is held out when a keyed hash of its values (BLAKE2b, keyed by the seed) falls in the lowest ``fraction`` of
the hash's range. The values are read alike on every road, so the same data held as numpy arrays, a DataFrame or
Parquet files loses the same rows: numbers as float32 (floats) or int64 (integers and booleans), strings as UTF-8,
binary values as their bytes, a row of an array as its values in order, whatever its shape.

>>> HoldOut(0.5, seed=0).mask([np.arange(8, dtype=np.float32)]).tolist()
[True, False, True, True, True, True, False, True]
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["HoldOut", "check_split"]


def check_split(fraction) -> float | None:
    """``validation_split`` checked: None, or a number in (0, 1).

    Raises:
        ValueError: anything else.
    """
    if fraction is None:
        return None
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"`validation_split` must be a fraction between 0 and 1. Received: "
                         f"validation_split={fraction!r}")
    return float(fraction)


@dataclass(frozen=True)
class HoldOut:
    """Which rows ``validation_split=fraction`` holds out, with ``seed``."""

    fraction: float
    seed: int = 0

    def _held(self, keys: list[bytes]) -> np.ndarray:
        key = int(self.seed).to_bytes(8, "little", signed=True)
        limit = int(self.fraction * 2 ** 64)
        return np.array([int.from_bytes(hashlib.blake2b(k, digest_size=8, key=key).digest(), "little") < limit
                         for k in keys], bool)

    def mask(self, arrays: list) -> np.ndarray:
        """A boolean per row (True: held out) of numpy arrays (rows first), one per feature and label."""
        n = len(arrays[0]) if arrays else 0
        parts = [_numpy_rows(a) for a in arrays]
        return self._held([b"".join(p[i] for p in parts) for i in range(n)])

    def mask_arrow(self, batch, columns: list[str]) -> np.ndarray:
        """A boolean per row of an Arrow record batch or table, from ``columns`` (the feature and label columns)."""
        parts = [_arrow_rows(batch.column(batch.schema.get_field_index(c))) for c in columns]
        return self._held([b"".join(p[i] for p in parts) for i in range(batch.num_rows)])


def _value_bytes(a: np.ndarray) -> np.ndarray:
    """``a`` in the dtype its values hash as."""
    if a.dtype.kind == "f":
        return a.astype(np.float32)
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    return a


def _framed(b: bytes) -> bytes:
    return len(b).to_bytes(4, "little") + b


def _numpy_rows(a) -> list[bytes]:
    a = np.asarray(a)
    if a.dtype.kind in "USO":
        return [_framed(_text(v)) for v in a.reshape(len(a), -1)[:, 0]] if a.ndim else []
    v = _value_bytes(a).reshape(len(a), -1)
    return [_framed(r.tobytes()) for r in v]


def _text(v) -> bytes:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    return str(v).encode("utf-8")


def _arrow_rows(col) -> list[bytes]:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        rows = []
        for value in col.to_pylist():
            flat = np.asarray(value if value is not None else [])
            rows.append(_framed(_value_bytes(flat.reshape(-1)).tobytes() if flat.dtype.kind not in "USO" else
                                b"".join(_text(x) for x in flat.reshape(-1))))
        return rows
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return [_framed(_text(v) if v is not None else b"") for v in col.to_pylist()]
    values = col.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "O":
        return [_framed(_text(v)) for v in values]
    return [_framed(r.tobytes()) for r in _value_bytes(values).reshape(len(values), -1)]
