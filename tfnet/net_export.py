"""Writing a :class:`tfnet.TFNet` out: the export folder (:func:`save`), the Keras model it came from
(:func:`to_keras`), ONNX (:func:`save_onnx`), a SavedModel (:func:`save_saved_model`) and the frozen graph
itself (:func:`frozen_graph_def`).

``TFNet``'s methods of the same names are these functions: the writers (:mod:`tfnet.saving`,
:mod:`tfnet.onnx.export`) read a whole net through its public interface, so :func:`save`,
:func:`save_onnx` and :func:`save_saved_model` take the net; :func:`to_keras` and :func:`frozen_graph_def`
take its :class:`tfnet.net_state.NetState`. A net with low-rank adapters is written as its ``merged()`` net.
"""

from __future__ import annotations

import numpy as np
from tensorflow.core.framework import graph_pb2

from tfnet import graph_utils as gu
from tfnet.errors import KerasSourceError
from tfnet.graph_io import PathLike
from tfnet.keras_source import rebuild
from tfnet.keras_training import inference_graph
from tfnet.net_state import NetState
from tfnet.onnx.export import write_onnx
from tfnet.saving import write_export_folder, write_saved_model
from tfnet.tables import with_init_all_tables

__all__ = ["frozen_graph_def", "save", "save_onnx", "save_saved_model", "to_keras"]


def _served(net):
    """The net as it is written: its ``merged()`` net when it has adapters."""
    return net.merged() if net.state.adapters else net


def save(net, path: PathLike, *, storage_options=None) -> None:
    """Writes ``path/frozen_inference_graph.pb`` (a frozen graph with the current weights) and
    ``path/graph_meta.json``, each atomically. Plain TensorFlow can import the graph;
    :meth:`load` reads it back as an identical layer (a net with adapters as its :meth:`merged`
    net: checkpoints keep the adapters apart). ``path`` may be a URI fsspec understands
    (``s3://bucket/run/export``; ``pip install tfnet[s3]``), with its ``storage_options``.

    Args:
        path: The folder (created if missing).
        storage_options: fsspec's options for a URI (credentials, endpoint). Default: None.
    """
    write_export_folder(_served(net), path, storage_options)


def to_keras(state: NetState):
    """The Keras model the net came from (:meth:`from_keras`), with the net's current weights: what Keras's own
    ``save`` and ``save_weights`` write as files Keras loads (``.keras``, ``.weights.h5``).

    Raises:
        KerasSourceError: the net did not come from a Keras model Keras can serialize, or
            graph surgery (``cut``, ``add_head``, ``with_lora``) changed it since.
    """
    if not state.keras_source:
        raise KerasSourceError("This net has no Keras model behind it: only a net from TFNet.from_keras (of a model "
                               "Keras can serialize), before any cut, add_head or with_lora, converts back. Use "
                               "net.save(folder) instead (TFNet.load reads it).")
    return rebuild(state.keras_source, state.get_weights())


def save_onnx(net, path: PathLike) -> None:
    """Writes the net as ONNX with the current weights, atomically, checked by ``onnx.checker``
    (a net with adapters: its :meth:`merged` net).

    A net made by :meth:`from_onnx` is written as the whole ONNX graph it came from (even if
    ``outputs`` chose other values). After :meth:`cut` and :meth:`add_head` it is written as the
    part of that graph the outputs need, followed by the Keras head as ONNX nodes (Dense,
    activations, Dropout, Flatten, pooling, BatchNormalization). See ``docs/onnx.md``.

    Raises:
        tfnet.onnx.NotOnnxNetError: the net's body did not come from ``from_onnx`` (a frozen
            graph, SavedModel or Keras model: use :meth:`save`).
        tfnet.onnx.OnnxExportError: the head holds an op with no ONNX mapping.
    """
    write_onnx(_served(net), path)


def save_saved_model(net, path: PathLike) -> None:
    """Writes a SavedModel with a ``serving_default`` signature and the weights as variables (a net
    with adapters: its :meth:`merged` net)."""
    write_saved_model(_served(net), path)


def frozen_graph_def(state: NetState, phase: str | None = None) -> graph_pb2.GraphDef:
    """The graph with the current weights baked in as constants (adapters folded in).

    Args:
        phase: ``None`` keeps the :attr:`phase_values` tensors as they are (the saved graph
            can still train); ``"inference"`` or ``"training"`` also bakes in their inference
            or training values, for a graph that serves on its own. Default: None.

    Raises:
        ValueError: ``phase`` is none of those.
    """
    if phase not in (None, "inference", "training"):
        raise ValueError(f"`phase` must be None, 'inference' or 'training'. Received: phase={phase!r}")
    graph_def = with_init_all_tables(gu.placeholders_to_consts(state.graph.template, state.graph_weight_arrays()))
    if phase is None or not state.graph.phase_values:
        return graph_def
    index = 0 if phase == "training" else 1
    values = {name: np.asarray(pair[index], dtype=state.graph.phase_specs[name].dtype.as_numpy_dtype)
              for name, pair in state.graph.phase_values.items()}
    graph_def = gu.bake_tensors(graph_def, values)
    # in inference a Keras layer's switch (tfnet.keras_training) is its inference branch: plain ops for any runtime
    return inference_graph(graph_def) if phase == "inference" else graph_def
