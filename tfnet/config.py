"""Process-wide TensorFlow settings."""

from __future__ import annotations

import tensorflow as tf


def set_num_threads(intra_op: int | None = None, inter_op: int | None = None, *, strict: bool = True) -> bool:
    """Sets TensorFlow's intra-op and inter-op thread pools for this process. The one place in
    tfnet that sets them (workers, predictors and benchmarks call it too).

    TensorFlow fixes its thread pools when it first runs an op, so call this before any TFNet is
    built or run. Setting the same values again is a no-op.

    Args:
        intra_op: Threads used inside one op (a matmul, a convolution). ``None`` leaves it as is.
        inter_op: Ops run in parallel. ``None`` leaves it as is.
        strict: Raise when the pools already run with other counts (default); with False,
            return False instead (a reused worker process keeps its pools).

    Returns:
        True when the pools have the requested counts, False when they could not change
        (``strict=False`` only).

    Raises:
        ValueError: a count below 1.
        RuntimeError: TensorFlow has already started with different counts (``strict=True``).
    """
    for label, value in (("intra_op", intra_op), ("inter_op", inter_op)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"`{label}` must be a positive integer. Received: {label}={value!r}")
    pairs = (
        (intra_op, tf.config.threading.get_intra_op_parallelism_threads,
         tf.config.threading.set_intra_op_parallelism_threads, "intra_op"),
        (inter_op, tf.config.threading.get_inter_op_parallelism_threads,
         tf.config.threading.set_inter_op_parallelism_threads, "inter_op"),
    )
    for value, get, set_, label in pairs:
        if value is None or get() == value:
            continue
        try:
            set_(value)
        except RuntimeError:
            if not strict:
                return False
            raise RuntimeError(
                f"TensorFlow's thread pools are already running, so {label} cannot change to "
                f"{value} (it is {get() or 'the default'}). Call tfnet.set_num_threads() before "
                "building or running any model in this process."
            ) from None
    return True


def get_num_threads() -> tuple[int, int]:
    """Returns ``(intra_op, inter_op)``; 0 means TensorFlow's default (one per core)."""
    return (
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    )
