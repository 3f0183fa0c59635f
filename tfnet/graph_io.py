"""Reading model files into ``GraphDef`` protos (and the atomic writer, from :mod:`tfnet.atomic`)."""

from __future__ import annotations

import json
import os
from typing import Union

from google.protobuf import message, text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import saved_model_pb2

from tfnet.atomic import STALE_TEMPORARY_S, sweep_stale_temporaries, write_bytes_atomic, write_json_atomic  # noqa: F401 (re-exported)
from tfnet.errors import GraphLoadError

PathLike = Union[str, "os.PathLike[str]"]

FROZEN_GRAPH_FILE = "frozen_inference_graph.pb"
META_FILE = "graph_meta.json"


def read_graph_def(source: PathLike | bytes | graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """Reads a frozen graph from a ``.pb`` (binary) or ``.pbtxt`` (text) file, bytes, or a GraphDef.

    Raises:
        FileNotFoundError: the path does not exist.
        GraphLoadError: the file is empty, truncated, corrupt, a SavedModel, or not a graph.
    """
    if isinstance(source, graph_pb2.GraphDef):
        graph_def = graph_pb2.GraphDef()
        graph_def.CopyFrom(source)
        what = "the given GraphDef"
    elif isinstance(source, (bytes, bytearray)):
        graph_def = _parse(bytes(source), "the given bytes")
        what = "the given bytes"
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise FileNotFoundError(f"Frozen graph file not found: {path!r}")
        if os.path.isdir(path):
            raise GraphLoadError(_directory_hint(path))
        with open(path, "rb") as f:
            data = f.read()
        graph_def = _parse(data, repr(path))
        what = repr(path)
    else:
        raise TypeError(
            "Expected a path, bytes or a tf.compat.v1.GraphDef for the frozen graph. "
            f"Received: {type(source).__name__}"
        )
    _check_graph(graph_def, what)
    return graph_def


def _directory_hint(path: str) -> str:
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return f"{path!r} is a SavedModel directory, not a frozen graph file. Use TFNet.from_saved_model({path!r})."
    if os.path.exists(os.path.join(path, FROZEN_GRAPH_FILE)):
        return f"{path!r} is an export folder, not a frozen graph file. Use TFNet.from_export_folder({path!r})."
    return f"{path!r} is a directory; expected a frozen graph file (.pb)."


def _parse(data: bytes, what: str) -> graph_pb2.GraphDef:
    if not data:
        raise GraphLoadError(f"{what} is empty; expected a serialized tf.GraphDef (a frozen graph .pb file).")
    graph_def = graph_pb2.GraphDef()
    try:
        graph_def.ParseFromString(data)
        if graph_def.node:
            return graph_def
    except (message.DecodeError, RuntimeError, ValueError) as exc:
        binary_error = str(exc) or type(exc).__name__
    else:
        binary_error = "it holds no nodes"
    # A SavedModel's saved_model.pb can parse as an empty GraphDef: say what it really is.
    if _looks_like_saved_model(data):
        raise GraphLoadError(
            f"{what} is a SavedModel proto (saved_model.pb), not a frozen GraphDef. "
            "Use TFNet.from_saved_model(<its directory>)."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        graph_def = graph_pb2.GraphDef()
        try:
            text_format.Parse(text, graph_def)
            if graph_def.node:
                return graph_def
        except text_format.ParseError:
            pass
    raise GraphLoadError(
        f"{what} ({len(data)} bytes) is not a frozen TensorFlow graph: it could not be parsed as a "
        f"binary or text GraphDef ({binary_error}). The file may be truncated or corrupt, or be "
        "some other kind of file."
    )


def _looks_like_saved_model(data: bytes) -> bool:
    sm = saved_model_pb2.SavedModel()
    try:
        sm.ParseFromString(data)
    except (message.DecodeError, RuntimeError, ValueError):
        return False
    return len(sm.meta_graphs) > 0 and sm.meta_graphs[0].HasField("graph_def")


def _check_graph(graph_def: graph_pb2.GraphDef, what: str) -> None:
    for i, node in enumerate(graph_def.node):
        if not node.name or not node.op:
            raise GraphLoadError(
                f"{what} is not a valid frozen graph: node {i} has no "
                f"{'name' if not node.name else 'op'}. The file may be corrupt."
            )


def read_meta(folder: str, storage_options=None) -> dict:
    """Reads ``graph_meta.json`` of an export folder (a path or a URI), checking the keys
    Analytics Zoo wrote."""
    from tfnet import storage

    path = storage.join(folder, META_FILE)
    if not storage.exists(path, storage_options):
        raise FileNotFoundError(
            f"{path!r} not found; an export folder holds {FROZEN_GRAPH_FILE} and {META_FILE}."
        )
    try:
        meta = json.loads(storage.read_bytes(path, storage_options).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GraphLoadError(f"{path!r} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise GraphLoadError(f"{path!r} must hold a JSON object. Received: {type(meta).__name__}")
    for key in ("input_names", "output_names"):
        value = meta.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
            raise GraphLoadError(
                f"{path!r} must have {key!r}: a non-empty list of tensor names. Received: {value!r}"
            )
    return meta
