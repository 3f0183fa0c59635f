"""Checking and converting user inputs against a graph's input specs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfnet.errors import InputSpecError, InputTypeError, unknown_name_message
from tfnet.graph_utils import tensor_name


def _describe(value) -> str:
    shape = tuple(getattr(value, "shape", ()))
    dtype = getattr(value, "dtype", type(value).__name__)
    dtype = getattr(dtype, "name", dtype)
    return f"{type(value).__name__} of shape {shape} and dtype {dtype}"


def as_name_list(names: str | Sequence[str], what: str) -> list[str]:
    if isinstance(names, str):
        return [names]
    if isinstance(names, (list, tuple)) and names and all(isinstance(n, str) for n in names):
        return list(names)
    raise TypeError(f"`{what}` must be a tensor name or a non-empty list of names. Received: {names!r}")


def arrange(inputs: Any, names: Sequence[str], what: str = "input") -> list:
    """Puts ``inputs`` (one value, a list in graph order, or a dict by name) in graph order."""
    n = len(names)
    if isinstance(inputs, Mapping):
        by_name = {}
        for key, value in inputs.items():
            full = tensor_name(key) if isinstance(key, str) else key
            if full not in names:
                raise InputSpecError(unknown_name_message(f"{what} name", key, names))
            by_name[full] = value
        missing = [nm for nm in names if nm not in by_name]
        if missing:
            raise InputSpecError(f"Missing {what}s {missing}. The graph takes {list(names)}.")
        return [by_name[nm] for nm in names]
    if isinstance(inputs, (list, tuple)) and not (n == 1 and _is_single_array_like(inputs)):
        if len(inputs) != n:
            raise InputSpecError(
                f"The graph takes {n} {what}(s) {list(names)}; received {len(inputs)} values."
            )
        return list(inputs)
    if n != 1:
        raise InputSpecError(
            f"The graph takes {n} {what}s {list(names)}; received one value ({_describe(inputs)}). "
            "Pass a list in that order or a dict by name."
        )
    return [inputs]


def _is_single_array_like(value) -> bool:
    """A list of numbers (``[[1., 2.]]``) is one array, a list holding one array is a list."""
    if len(value) != 1:
        return False
    first = value[0]
    return not isinstance(first, (np.ndarray, tf.Tensor, tf.Variable)) and not hasattr(first, "__array__")


#: The dtypes a float input takes into the graph as they are, cast inside it (:func:`convert` with ``narrow``): decoded
#: pixels and other small integers cross to the graph at a byte or two a value, not four. Every value of these is
#: exact in float32, and a cast rounds the same inside the graph as in numpy where a narrower float cannot hold one.
NARROW_DTYPES = ("uint8", "int8", "uint16", "int16")


def taken_as_is(want, got) -> bool:
    """Whether a value of dtype ``got`` goes into an input of dtype ``want`` as it is, for the graph (or engine) to
    cast: narrow integers (:data:`NARROW_DTYPES`) into a float input. Either dtype a tf.DType, a numpy dtype or a
    name.

    >>> taken_as_is("float32", "uint8"), taken_as_is("float32", "int32"), taken_as_is("int32", "uint8")
    (True, False, False)
    """
    return getattr(got, "name", str(got)) in NARROW_DTYPES and tf.as_dtype(want).is_floating


def convert(value: Any, spec: tf.TensorSpec, name: str, narrow: bool = False) -> tf.Tensor:
    """Converts one value to a tensor of ``spec``'s dtype, checking kind, rank and shape.

    Floats take any float, integer or bool input (cast); integers take integers; strings take
    str/bytes/object arrays; bools take bools. A batch of scalars ``(N,)`` feeds an input of shape
    ``(None, 1)`` as ``(N, 1)``, as Keras takes it. With ``narrow``, a float input given one of
    :data:`NARROW_DTYPES` keeps it: the caller's graph casts it (:func:`tfnet.net_compute.run_graph`).
    """
    want = spec.dtype
    if value is None:
        raise InputTypeError(f"Input {name!r} is None; expected an array of dtype {want.name}.")
    if isinstance(value, (tf.Tensor, tf.Variable)):
        got = value.dtype
        tensor = value
    else:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise InputTypeError(
                f"Input {name!r} could not be turned into an array ({exc}); expected {want.name} "
                f"with shape {spec.shape}."
            ) from None
        got = arr.dtype
        tensor = arr
    _check_kind(got, want, name, spec)
    shape = tuple(tensor.shape)
    if one_value_per_row(shape, spec):  # (N,) for a (None, 1) input, as Keras takes it
        tensor = tensor.reshape(shape + (1,)) if isinstance(tensor, np.ndarray) else tf.expand_dims(tensor, -1)
        shape = shape + (1,)
    _check_shape(shape, spec, name)
    if narrow and taken_as_is(want, got):
        return tf.convert_to_tensor(tensor)
    if isinstance(tensor, np.ndarray):
        if want == tf.string:
            return tf.constant(tensor, dtype=tf.string)
        return tf.convert_to_tensor(tensor.astype(want.as_numpy_dtype, copy=False))
    tensor = tf.convert_to_tensor(tensor)
    return tensor if tensor.dtype == want else tf.cast(tensor, want)


def _kind(dtype) -> str:
    if isinstance(dtype, tf.DType):
        if dtype == tf.string:
            return "string"
        if dtype.is_bool:
            return "bool"
        if dtype.is_floating:
            return "float"
        if dtype.is_integer:
            return "int"
        return dtype.name
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return "string"
    if dtype.kind == "V":  # ml_dtypes' bfloat16, float8 and 4-bit types
        try:
            return _kind(tf.as_dtype(dtype))
        except TypeError:
            return dtype.name
    return {"b": "bool", "f": "float", "i": "int", "u": "int"}.get(dtype.kind, dtype.name)


_ACCEPTS = {
    "float": {"float", "int", "bool"},
    "int": {"int", "bool"},
    "bool": {"bool"},
    "string": {"string"},
}


def _check_kind(got, want: tf.DType, name: str, spec: tf.TensorSpec) -> None:
    want_kind, got_kind = _kind(want), _kind(got)
    if got_kind not in _ACCEPTS.get(want_kind, {want_kind}):
        got_name = getattr(got, "name", str(got))
        raise InputTypeError(
            f"Input {name!r} expects dtype {want.name} (shape {spec.shape}); received dtype "
            f"{got_name}, which cannot be converted without loss."
        )


def one_value_per_row(shape: tuple, spec: tf.TensorSpec) -> bool:
    """Whether a value of ``shape`` holds one value per row for an input of per-row shape ``(1,)``: a batch of
    scalars, which Keras takes for a ``(None, 1)`` input (it adds the last axis).

    >>> one_value_per_row((32,), tf.TensorSpec((None, 1)))
    True
    """
    want = spec.shape
    return len(shape) == 1 and want.rank == 2 and want[1] == 1


def _check_shape(shape: tuple, spec: tf.TensorSpec, name: str) -> None:
    want = spec.shape
    if want.rank is None:
        return
    if len(shape) != want.rank:
        raise InputSpecError(
            f"Input {name!r} expects rank {want.rank} with shape {_fmt(want)}; received rank "
            f"{len(shape)} with shape {shape}."
        )
    for i, (g, w) in enumerate(zip(shape, want.as_list())):
        if w is not None and g is not None and g != w:
            raise InputSpecError(
                f"Input {name!r} expects shape {_fmt(want)}; received shape {shape} "
                f"(dimension {i} is {g}, expected {w})."
            )


def _fmt(shape: tf.TensorShape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape.as_list()) + ")"


def is_batched(spec: tf.TensorSpec | None) -> bool:
    """Whether an input of ``spec`` takes a batch: its dimension 0 is left open (or its rank is). An input
    whose dimension 0 is fixed (a shape, a parameter, a model exported without a batch) is a whole tensor.

    >>> is_batched(tf.TensorSpec((None, 3))), is_batched(tf.TensorSpec((2,)))
    (True, False)
    """
    return spec is None or spec.shape.rank is None or (spec.shape.rank > 0 and spec.shape[0] is None)


def batch_size_of(tensors: Sequence[tf.Tensor], specs: Sequence[tf.TensorSpec] | None = None) -> int | None:
    """The batch size the ``tensors`` share, or None when none has one.

    With ``specs`` only the inputs that take a batch (:func:`is_batched`) count: the others are whole tensors,
    whatever their leading size. Without, every tensor of rank >= 1 counts (rows to split, as a predictor's).

    Raises:
        InputSpecError: the counted tensors' leading sizes differ.
    """
    specs = [None] * len(tensors) if specs is None else specs
    sizes = {int(t.shape[0]) for t, s in zip(tensors, specs)
             if t.shape.rank and t.shape[0] is not None and is_batched(s)}
    if len(sizes) > 1:
        raise InputSpecError(f"All inputs must have the same batch size; received sizes {sorted(sizes)}.")
    return sizes.pop() if sizes else None
