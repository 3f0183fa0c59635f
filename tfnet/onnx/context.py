"""The state of one conversion: every ONNX value as a TensorFlow tensor, and its layout.

ONNX image tensors are NCHW; TensorFlow's CPU convolutions and pools are NHWC. A 4-D value made by
a convolution, pool or batch norm is kept in NHWC (``Value.nhwc``) and stays so through element-wise
ops; it is transposed back to NCHW only where an op needs the ONNX layout (a flatten, a reshape, a
concat), and each transpose is made once (``Ctx.plain`` / ``Ctx.nhwc`` cache them). With
``propagate=False`` every NHWC result is transposed back at once: the baseline that the benchmark
compares against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from tfnet.onnx.errors import OnnxConversionError

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


@dataclass
class Value:
    """An ONNX value: a TF tensor in ONNX layout, or (``nhwc=True``) its 4-D NHWC transpose."""

    tensor: tf.Tensor
    nhwc: bool = False
    other: tf.Tensor | None = None  # the same value in the other layout, once made


@dataclass
class Ctx:
    opset: int  # the default-domain opset of the nodes being converted (a function body's may differ)
    propagate: bool = True
    version: int = 0  # the version of the operator being converted
    onnx_types: dict[str, int] = field(default_factory=dict)  # value -> ONNX element type, where TF holds it wider
    values: dict[str, Value] = field(default_factory=dict)
    statistics: list[str] = field(default_factory=list)  # TF names of batch-norm mean/variance weights
    weight_tf_names: dict[str, str] = field(default_factory=dict)  # ONNX initializer name -> TF node name
    onnx_of: dict[str, tuple[str, bool]] = field(default_factory=dict)  # TF tensor -> (ONNX value, NHWC?)
    shapes: dict[str, list] = field(default_factory=dict)  # a Shape output -> its entries, None where dynamic
    aliases: dict[str, str] = field(default_factory=dict)  # value -> the initializer it is (through Identity)
    stat_copies: dict[str, tf.Tensor] = field(default_factory=dict)  # shared initializer -> its statistic copy
    #: converts nodes into this context (:func:`tfnet.onnx.convert.convert_nodes`, set by the converter), for
    #: handlers of subgraphs (``If``, ``Scan``), so that no handler imports the converter back
    converter: Callable | None = None
    #: constant tensors that handlers share by a key of their own (a ConstantOfShape's fill of a static shape): a
    #: model that writes its weights as ConstantOfShape nodes (onnx's ``light`` networks) makes each fill once
    shared: dict[tuple, tf.Tensor] = field(default_factory=dict)
    #: ONNX sequence values: a list of tensors, or a tensor split along an axis of run-time size (tfnet.onnx.ops_sequence)
    sequences: dict[str, list] = field(default_factory=dict)
    #: the element dtype of an empty sequence, where the node that made it says (``SequenceEmpty``'s ``dtype``)
    sequence_dtypes: dict[str, tf.DType] = field(default_factory=dict)
    #: ONNX optional values that hold nothing (an ``Optional`` without input); one that holds a tensor or a sequence
    #: is that value itself (tfnet.onnx.ops_sequence)
    empty_optionals: set[str] = field(default_factory=set)
    _session: tf.compat.v1.Session | None = None
    _const_ops: dict[str, bool] = field(default_factory=dict)

    def convert_nodes(self, nodes, opset: int | None = None) -> None:
        """Converts ``nodes`` (a subgraph's, an inlined branch's) into this context."""
        if self.converter is None:
            raise RuntimeError("This conversion context has no converter (made outside tfnet.onnx.convert).")
        self.converter(self, nodes, opset)

    def has(self, name: str) -> bool:
        return bool(name) and name in self.values

    def plain(self, name: str) -> tf.Tensor:
        """The value in ONNX layout."""
        v = self._get(name)
        if not v.nhwc:
            return v.tensor
        if v.other is None:
            v.other = tf.transpose(v.tensor, TO_NCHW)
            self.onnx_of.setdefault(v.other.name, (name, False))
        return v.other

    def nhwc(self, name: str) -> tf.Tensor:
        """A 4-D value in NHWC layout."""
        v = self._get(name)
        if v.nhwc:
            return v.tensor
        if v.tensor.shape.rank != 4:
            raise OnnxConversionError(f"Value {name!r} should be 4-D (NCHW); it has shape {v.tensor.shape}.")
        if v.other is None:
            v.other = tf.transpose(v.tensor, TO_NHWC)
            self.onnx_of.setdefault(v.other.name, (name, True))
        return v.other

    def onnx_type(self, name: str) -> int:
        """The ONNX element type of a value: recorded where TensorFlow holds it in a carrier type
        (:mod:`tfnet.onnx.dtypes`) or where a cast made it, else that of its TensorFlow dtype."""
        if name in self.onnx_types:
            return self.onnx_types[name]
        from onnx import helper

        return helper.np_dtype_to_tensor_dtype(np.dtype(self._get(name).tensor.dtype.as_numpy_dtype))

    def is_nhwc(self, name: str) -> bool:
        return self._get(name).nhwc

    def static(self, name: str):
        """The value as a numpy array when it is known while converting (constants, static
        shapes), else None."""
        if not name:
            return None
        v = self._get(name)
        if v.nhwc:
            return None
        try:
            value = tf.get_static_value(v.tensor)
        except (TypeError, ValueError):
            value = None
        if value is None and self._constant(v.tensor.op):
            value = self._evaluate(v.tensor)
        return value

    def partial_ints(self, name: str) -> list[int | None] | None:
        """A 1-D integer value (a shape) entry by entry, None where known only at run time: the parts
        of a ``Concat`` computed from constants and static dimensions are evaluated while converting
        (``Concat(Shape(x)[:2], Unsqueeze(Gather(Shape(y), 2)), ...)``, how PyTorch writes
        ``F.interpolate(x, size=y.shape[-2:])``), the rest read from the shapes TensorFlow knows.
        None when even the length is unknown."""
        if not name:
            return None
        value = self.static(name)
        if value is not None:
            return [int(v) for v in np.asarray(value).reshape(-1)]
        v = self._get(name)
        return None if v.nhwc else self._partial(v.tensor)

    def _partial(self, t: tf.Tensor) -> list[int | None] | None:
        from tensorflow.python.framework import tensor_util

        if t.shape.rank != 1 or t.shape[0] is None:
            return None
        if self._constant(t.op):
            return [int(v) for v in np.asarray(self._evaluate(t)).reshape(-1)]
        if t.op.type == "ConcatV2":
            parts = [self._partial(i) for i in t.op.inputs[:-1]]
            return None if any(p is None for p in parts) else [d for p in parts for d in p]
        if t.op.type in ("Cast", "Identity"):
            return self._partial(t.op.inputs[0])
        try:
            shape = tensor_util.constant_value_as_shape(t)
        except (TypeError, ValueError):
            return [None] * t.shape[0]
        return shape.as_list() if shape.rank == t.shape[0] else [None] * t.shape[0]

    def _evaluate(self, t: tf.Tensor):
        if self._session is None:
            self._session = tf.compat.v1.Session(graph=t.graph)
        return self._session.run(t)

    def _constant(self, op: tf.Operation) -> bool:
        """Whether ``op`` depends on constants only (no placeholder, no stateful op); memoised per op."""
        stack = [(op, False)]
        while stack:
            cur, expanded = stack.pop()
            if cur.name in self._const_ops:
                continue
            if cur.type == "Placeholder" or cur.op_def.is_stateful:
                self._const_ops[cur.name] = False
                continue
            deps = [t.op for t in cur.inputs] + list(cur.control_inputs)
            if expanded:
                self._const_ops[cur.name] = all(self._const_ops[d.name] for d in deps)
                continue
            stack.append((cur, True))
            stack.extend((d, False) for d in deps if d.name not in self._const_ops)
        return self._const_ops[op.name]

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    @contextlib.contextmanager
    def own_constants(self):
        """Constant folding of its own for a subgraph converted into another TensorFlow graph (a loop's body, a
        branch of ``tf.cond``): a fresh memo of which ops are constant, and a session on that graph, both dropped
        afterwards."""
        saved = self._const_ops, self._session
        self._const_ops, self._session = {}, None
        try:
            yield
        finally:
            self.close()
            self._const_ops, self._session = saved

    def static_ints(self, name: str) -> list[int] | None:
        value = self.static(name)
        return None if value is None else [int(i) for i in np.asarray(value).reshape(-1)]

    def set(self, name: str, tensor: tf.Tensor, nhwc: bool = False) -> None:
        if not name:
            return
        if nhwc and not self.propagate:
            tensor, nhwc = tf.transpose(tensor, TO_NCHW), False
        self.values[name] = Value(tensor, nhwc)
        self.onnx_of.setdefault(tensor.name, (name, nhwc))

    def sequence(self, name: str):
        """A sequence value: its tensors in order, or an ``ops_sequence.Unstacked`` tensor."""
        if name in self.sequences:
            return self.sequences[name]
        if name in self.values:
            raise OnnxConversionError(f"Value {name!r} is a tensor where a sequence is expected.")
        raise OnnxConversionError(f"The ONNX graph uses value {name!r} before any node makes it.")

    def set_sequence(self, name: str, tensors) -> None:
        if name:
            self.sequences[name] = list(tensors) if isinstance(tensors, (list, tuple)) else tensors

    def _get(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            if name in self.sequences:
                raise OnnxConversionError(
                    f"Value {name!r} is a sequence where a tensor is expected: "
                    "tfnet takes and returns tensors (a sequence converts inside the graph, with "
                    "SequenceAt, ConcatFromSequence or SequenceLength to turn it into a tensor).") from None
            raise OnnxConversionError(f"The ONNX graph uses value {name!r} before any node makes it.") from None
