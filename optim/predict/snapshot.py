"""What TFPredictor ships to the workers: a frozen graph with the weights baked in, its input and
output names, dtypes and per-row shapes. Built on the driver; plain data, so it pickles small and
cheap (the graph is one ``bytes``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from tensorflow.core.framework import graph_pb2

from tfnet import storage
from tfnet.errors import TensorNameError
from tfnet.graph_io import META_FILE, PathLike

__all__ = ["TensorInfo", "ModelSnapshot", "ModelSource"]

ModelSource = Union["TFNet", "ModelSnapshot", PathLike, bytes, graph_pb2.GraphDef]  # noqa: F821 (TFNet: lazily)

_META_KEY = "tfnet_predictor"


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output.

    Attributes:
        name: The tensor name, ``"name:0"``.
        dtype: The numpy dtype name (``"float32"``), or ``"string"``.
        row_shape: The shape of one row (the batch dimension left out); ``None`` for unknown
            dimensions, and ``None`` as a whole for an unknown rank.
    """

    name: str
    dtype: str
    row_shape: tuple | None

    @property
    def short_name(self) -> str:
        return self.name[:-2] if self.name.endswith(":0") else self.name

    def describe(self) -> str:
        shape = "unknown" if self.row_shape is None else str(tuple(self.row_shape))
        return f"{self.name!r} ({self.dtype}, per-row shape {shape})"

    @classmethod
    def from_spec(cls, name: str, spec) -> TensorInfo:
        dims = spec.shape.as_list() if spec.shape.rank is not None else None
        return cls(name, spec.dtype.name, None if dims is None else tuple(dims[1:]))

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype,
                "row_shape": None if self.row_shape is None else list(self.row_shape)}

    @classmethod
    def from_json(cls, obj: dict) -> TensorInfo:
        shape = obj.get("row_shape")
        return cls(obj["name"], obj["dtype"], None if shape is None else tuple(shape))


@dataclass(frozen=True)
class ModelSnapshot:
    """A frozen graph (serialized ``GraphDef``) and the description of its inputs and outputs.

    Attributes:
        graph: The serialized frozen ``GraphDef``, weights as constants.
        inputs: The inputs, in the order the graph takes them.
        outputs: The outputs, in the order the graph returns them.
        model_id: A checksum of all of the above; workers cache loaded models under it.
    """

    graph: bytes
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    model_id: str

    @classmethod
    def create(cls, graph: bytes, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> ModelSnapshot:
        digest = hashlib.sha256(graph)
        digest.update(json.dumps([[t.to_json() for t in inputs], [t.to_json() for t in outputs]]).encode())
        return cls(graph, tuple(inputs), tuple(outputs), digest.hexdigest()[:24])

    @classmethod
    def from_net(cls, net) -> ModelSnapshot:
        """The net's graph with its current weights baked in, and its phase tensors (training-mode
        inputs) fixed to their inference values. Forward hooks (Python functions) are not part of
        the graph and do not travel."""
        graph = net.frozen_graph_def(phase="inference").SerializeToString(deterministic=True)
        inputs = [TensorInfo.from_spec(n, s) for n, s in zip(net.input_names, net.input_specs)]
        outputs = [TensorInfo.from_spec(n, s) for n, s in zip(net.output_names, net.output_specs)]
        return cls.create(graph, inputs, outputs)

    @classmethod
    def from_source(cls, source: ModelSource, inputs=None, outputs=None, storage_options=None) -> ModelSnapshot:
        """From a TFNet, an export folder (what ``TFNet.save`` writes; local, or a URI read with fsspec's
        ``storage_options``), a SavedModel folder, or a frozen graph (a ``.pb`` path, bytes or a ``GraphDef``;
        these need ``inputs`` and ``outputs``). A snapshot is returned as it is."""
        if isinstance(source, ModelSnapshot):
            return source
        return cls.from_net(load_net(source, inputs, outputs, storage_options))

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def input_specs(self) -> list:
        """The inputs as ``tf.TensorSpec``s with the batch dimension first (``None`` for an unknown rank), as
        ``TFNet.input_specs`` gives them."""
        import tensorflow as tf

        return [tf.TensorSpec(None if t.row_shape is None else [None, *t.row_shape], tf.as_dtype(t.dtype))
                for t in self.inputs]

    def graph_def(self) -> graph_pb2.GraphDef:
        graph_def = graph_pb2.GraphDef()
        graph_def.ParseFromString(self.graph)
        return graph_def

    def save(self, folder: PathLike) -> None:
        """Writes the Analytics Zoo export layout (``TFNet.load`` reads it back), with the
        input and output descriptions added to ``graph_meta.json``."""
        from tfnet.saving import write_export_files

        write_export_files(folder, self.graph, self.input_names, self.output_names, extra={
            _META_KEY: {"inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]},
        })

    @classmethod
    def load(cls, folder: PathLike) -> ModelSnapshot:
        """Reads an export folder; the checksum in ``graph_meta.json`` is checked."""
        from tfnet.saving import read_export_folder

        graph_def, meta = read_export_folder(folder)
        described = meta.get(_META_KEY)
        if not described:  # a folder written by TFNet.save: build the net once to learn the specs
            return cls.from_source(os.fspath(folder))
        return cls.create(
            graph_def.SerializeToString(deterministic=True),
            [TensorInfo.from_json(t) for t in described["inputs"]],
            [TensorInfo.from_json(t) for t in described["outputs"]],
        )


def load_net(source: ModelSource, inputs=None, outputs=None, storage_options=None):
    """A TFNet from any source :class:`TFPredictor` takes (an export folder at a URI read with fsspec's
    ``storage_options``). A TFNet is returned as it is."""
    from tfnet import TFNet

    if isinstance(source, TFNet):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if storage.is_remote(path):  # an export folder on an object store (what TFNet.save wrote there)
            return TFNet.load(path, storage_options=storage_options)
        if os.path.isdir(path) and os.path.exists(os.path.join(path, META_FILE)):
            return TFNet.load(path)
        if os.path.isdir(path) and os.path.exists(os.path.join(path, "saved_model.pb")):
            return TFNet.from_saved_model(path)
    elif not isinstance(source, (bytes, bytearray, graph_pb2.GraphDef)):
        raise TypeError(
            "TFPredictor takes a tfnet.TFNet, a path (a frozen graph .pb, an export folder or a "
            f"SavedModel folder), bytes or a GraphDef. Received: {type(source).__name__}. For a "
            "Keras model use TFNet.from_keras(model) first."
        )
    if inputs is None or outputs is None:
        raise TensorNameError(
            "A frozen graph file carries no input and output names: pass `inputs` and `outputs` "
            f"(tensor names). Placeholders in the graph: {_placeholders(source)}."
        )
    return TFNet.from_frozen_graph(source, inputs, outputs)


def _placeholders(source) -> list[str]:
    from tfnet.graph_io import read_graph_def
    from tfnet.graph_utils import placeholders

    return placeholders(read_graph_def(source))
