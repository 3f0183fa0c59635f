"""ONNX sequence operators.

A sequence value is a Python list of TensorFlow tensors (``Ctx.sequences``): ``SequenceEmpty``,
``SequenceConstruct``, ``SequenceInsert``, ``SequenceErase``, ``SplitToSequence`` build it, and ``SequenceAt``,
``SequenceLength`` and ``ConcatFromSequence`` turn it back into tensors, so the TensorFlow graph holds only
tensors. Positions must be constants, except ``SequenceAt``'s over tensors of one static shape (a gather from
their stack). ``SplitToSequence`` without sizes along an axis whose size is known only at run time (the batch
that ``relax_batch`` opens) gives an :class:`Unstacked` sequence, the tensor itself: ``SequenceAt`` gathers from
it, ``SequenceLength`` is that size, ``ConcatFromSequence`` back along the same axis is the tensor. A sequence that
a ``Loop`` carries (:mod:`tfnet.onnx.ops_loop`) is :class:`Written`, a ``tf.TensorArray`` of run-time length:
``SequenceInsert`` appends to it, ``SequenceAt`` reads it, ``SequenceLength`` is its size, ``ConcatFromSequence``
concatenates or stacks it.

Optional values (``Optional``, ``OptionalHasElement``, ``OptionalGetElement``) inside the graph: one that holds an
element is the element (a tensor or a sequence), an empty one a name in ``Ctx.empty_optionals``; a model's own
inputs and outputs stay tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import register


@dataclass(frozen=True)
class Unstacked:
    """The pieces of size 1 of ``tensor`` along ``axis`` (without that axis unless ``keepdims``), as many as its
    size there, known only at run time."""

    tensor: tf.Tensor
    axis: int
    keepdims: bool


@dataclass(frozen=True)
class Written:
    """A sequence of run-time length held in a ``tf.TensorArray`` (a sequence that a ``Loop`` carries)."""

    array: tf.TensorArray


def _listed(ctx: Ctx, node, name: str) -> list[tf.Tensor]:
    """A sequence whose length is known while converting."""
    seq = ctx.sequence(name)
    if isinstance(seq, Written):
        raise OnnxConversionError(f"{node.op_type} {node.name!r} needs the length of sequence {name!r} known while "
                                  "converting; a Loop makes it, of a length known only at run time.")
    if isinstance(seq, Unstacked):
        raise OnnxConversionError(f"{node.op_type} {node.name!r} needs the length of sequence {name!r} known while "
                                  f"converting; it splits a tensor of shape {seq.tensor.shape} along axis {seq.axis}, "
                                  "known only at run time (pass relax_batch=False to keep the model's shapes).")
    return seq


def _position(ctx: Ctx, node, index: int, length: int, default: int, inclusive: bool = False) -> int:
    """A constant position input (negative ones count from the end), checked against ``length``."""
    if len(node.input) <= index or not node.input[index]:
        return default
    value = ctx.static_ints(node.input[index])
    if value is None:
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: the position must be a constant; it is computed "
                                  "at run time.")
    pos = value[0] + length if value[0] < 0 else value[0]
    if not 0 <= pos <= (length if inclusive else length - 1):
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: position {value[0]} is outside a sequence of "
                                  f"{length} tensors.")
    return pos


@register("SequenceEmpty", since=11)
def _sequence_empty(ctx: Ctx, node, attrs):
    from tfnet.onnx.dtypes import tf_type

    ctx.set_sequence(node.output[0], [])
    ctx.sequence_dtypes[node.output[0]] = tf_type(attrs.get("dtype", 1))  # float by default


@register("SequenceConstruct", since=11)
def _sequence_construct(ctx: Ctx, node, attrs):
    ctx.set_sequence(node.output[0], [ctx.plain(n) for n in node.input])


@register("SequenceInsert", since=11)
def _sequence_insert(ctx: Ctx, node, attrs):
    seq = ctx.sequence(node.input[0])
    if isinstance(seq, Written):  # appended at its end: the only position a run-time length allows
        array = seq.array
        if len(node.input) > 2 and node.input[2] and ctx.static_ints(node.input[2]) != [-1]:
            raise OnnxConversionError(f"SequenceInsert {node.name!r}: into a sequence of run-time length tfnet "
                                      "inserts at the end only (no position, or -1).")
        value = tf.cast(ctx.plain(node.input[1]), array.dtype)
        ctx.set_sequence(node.output[0], Written(array.write(array.size(), value)))
        return
    seq = list(_listed(ctx, node, node.input[0]))
    pos = _position(ctx, node, 2, len(seq), len(seq), inclusive=True)
    seq.insert(pos, ctx.plain(node.input[1]))
    ctx.set_sequence(node.output[0], seq)


@register("SequenceErase", since=11)
def _sequence_erase(ctx: Ctx, node, attrs):
    seq = list(_listed(ctx, node, node.input[0]))
    if not seq:
        raise OnnxConversionError(f"SequenceErase {node.name!r}: the sequence is empty.")
    del seq[_position(ctx, node, 1, len(seq), len(seq) - 1)]
    ctx.set_sequence(node.output[0], seq)


@register("SequenceAt", since=11)
def _sequence_at(ctx: Ctx, node, attrs):
    seq = ctx.sequence(node.input[0])
    if isinstance(seq, Written):
        pos = tf.cast(tf.reshape(ctx.plain(node.input[1]), []), tf.int32)
        size = seq.array.size()
        ctx.set(node.output[0], seq.array.read(tf.where(pos < 0, pos + size, pos)))
        return
    if isinstance(seq, Unstacked):
        pos = tf.cast(tf.reshape(ctx.plain(node.input[1]), []), tf.int64)
        n = tf.shape(seq.tensor, out_type=tf.int64)[seq.axis]
        piece = tf.gather(seq.tensor, tf.where(pos < 0, pos + n, pos), axis=seq.axis)
        ctx.set(node.output[0], tf.expand_dims(piece, seq.axis) if seq.keepdims else piece)
        return
    if ctx.static_ints(node.input[1]) is not None:
        ctx.set(node.output[0], tf.identity(seq[_position(ctx, node, 1, len(seq), 0)]))
        return
    shapes = {tuple(t.shape.as_list()) if t.shape.rank is not None else None for t in seq}
    if not seq or len(shapes) != 1 or None in shapes or None in next(iter(shapes)):
        raise OnnxConversionError(f"SequenceAt {node.name!r}: a position computed at run time needs tensors of one "
                                  f"static shape; they have {sorted(map(str, shapes))}.")
    pos = tf.cast(tf.reshape(ctx.plain(node.input[1]), []), tf.int64)
    n = tf.constant(len(seq), tf.int64)
    ctx.set(node.output[0], tf.gather(tf.stack(seq), tf.where(pos < 0, pos + n, pos)))


@register("SequenceLength", since=11)
def _sequence_length(ctx: Ctx, node, attrs):
    seq = ctx.sequence(node.input[0])
    if isinstance(seq, Written):
        ctx.set(node.output[0], tf.cast(seq.array.size(), tf.int64))
    elif isinstance(seq, Unstacked):
        ctx.set(node.output[0], tf.shape(seq.tensor, out_type=tf.int64)[seq.axis])
    else:
        ctx.set(node.output[0], tf.constant(len(seq), tf.int64))


@register("ConcatFromSequence", since=11)
def _concat_from_sequence(ctx: Ctx, node, attrs):
    seq = ctx.sequence(node.input[0])
    axis = attrs["axis"]
    if isinstance(seq, Written):
        ctx.set(node.output[0], _concat_written(node, seq.array, axis, bool(attrs.get("new_axis", 0))))
        return
    if isinstance(seq, Unstacked):  # back along the axis it was split on: the tensor itself
        rank = seq.tensor.shape.rank
        new_axis = bool(attrs.get("new_axis", 0))
        if new_axis != seq.keepdims and (axis + rank if axis < 0 else axis) == seq.axis:
            ctx.set(node.output[0], tf.identity(seq.tensor))
            return
        seq = _listed(ctx, node, node.input[0])
    if not seq:
        raise OnnxConversionError(f"ConcatFromSequence {node.name!r}: the sequence is empty.")
    if attrs.get("new_axis", 0):
        rank = seq[0].shape.rank + 1
        ctx.set(node.output[0], tf.stack(seq, axis=axis + rank if axis < 0 else axis))
    else:
        ctx.set(node.output[0], tf.concat(seq, axis=axis) if len(seq) > 1 else tf.identity(seq[0]))


@register("SplitToSequence", since=11)
def _split_to_sequence(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    axis = attrs.get("axis", 0)
    axis = axis + x.shape.rank if axis < 0 else axis
    size = x.shape[axis]
    split = node.input[1] if len(node.input) > 1 and node.input[1] else None
    if split is None:  # pieces of size 1, squeezed unless keepdims
        if size is None:
            ctx.set_sequence(node.output[0], Unstacked(x, axis, bool(attrs.get("keepdims", 1))))
            return
        parts = tf.split(x, size, axis=axis) if size else []
        if not attrs.get("keepdims", 1):
            parts = [tf.squeeze(p, axis) for p in parts]
        ctx.set_sequence(node.output[0], parts)
        return
    sizes = ctx.plain(split)
    static = ctx.static_ints(split)
    if sizes.shape.rank == 0:  # one size: equal pieces, the last one smaller
        if static is None or size is None:
            raise OnnxConversionError(f"SplitToSequence {node.name!r}: a scalar split needs it and axis {axis} "
                                      "known while converting.")
        chunk = static[0]
        pieces = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
        ctx.set_sequence(node.output[0], tf.split(x, pieces, axis=axis))
        return
    if sizes.shape[0] is None:
        raise OnnxConversionError(f"SplitToSequence {node.name!r}: the number of split sizes must be known.")
    if static is not None:
        ctx.set_sequence(node.output[0], tf.split(x, static, axis=axis))
    else:
        ctx.set_sequence(node.output[0], tf.split(x, sizes, axis=axis, num=int(sizes.shape[0])))


def _concat_written(node, array: tf.TensorArray, axis: int, new_axis: bool) -> tf.Tensor:
    """``ConcatFromSequence`` of a ``tf.TensorArray``: along axis 0 its own concat or stack; along another axis
    the stack of its tensors (of one shape then) with that axis moved."""
    if axis == 0:
        return array.stack() if new_axis else array.concat()
    stacked = array.stack()
    rank = stacked.shape.rank
    if rank is None:
        raise OnnxConversionError(f"ConcatFromSequence {node.name!r}: along axis {axis} the rank of the tensors of "
                                  "a Loop's sequence must be known.")
    if new_axis:
        return tf.experimental.numpy.moveaxis(stacked, 0, axis + rank if axis < 0 else axis)
    axis = axis + rank - 1 if axis < 0 else axis
    moved = tf.experimental.numpy.moveaxis(stacked, 0, axis)  # [..., n, d_axis, ...] -> merge n and d_axis
    shape = tf.shape(moved)
    return tf.reshape(moved, tf.concat([shape[:axis], [-1], shape[axis + 2:]], 0))


def _pass_on(ctx: Ctx, source: str, target: str) -> None:
    """``target`` is the same value as ``source``: a tensor (in its layout), a sequence or an empty optional."""
    if source in ctx.sequences:
        ctx.set_sequence(target, ctx.sequence(source))
    elif source in ctx.empty_optionals:
        ctx.empty_optionals.add(target)
    else:
        value = ctx.values.get(source)
        if value is None:
            ctx.plain(source)  # the converter's error for a value used before any node makes it
        ctx.set(target, value.tensor, nhwc=value.nhwc)


@register("Optional", since=15)
def _optional(ctx: Ctx, node, attrs):
    if len(node.input) and node.input[0]:
        _pass_on(ctx, node.input[0], node.output[0])
    else:
        ctx.empty_optionals.add(node.output[0])


@register("OptionalHasElement", since=15)
def _optional_has_element(ctx: Ctx, node, attrs):
    """False for no input or an empty optional; true for a tensor, a sequence or an optional that holds one."""
    given = bool(len(node.input) and node.input[0]) and node.input[0] not in ctx.empty_optionals
    ctx.set(node.output[0], tf.constant(given))


@register("OptionalGetElement", since=15)
def _optional_get_element(ctx: Ctx, node, attrs):
    if node.input[0] in ctx.empty_optionals:
        raise OnnxConversionError(
            f"OptionalGetElement {node.name!r}: the optional {node.input[0]!r} holds nothing (ONNX leaves reading it "
            "undefined).")
    _pass_on(ctx, node.input[0], node.output[0])
