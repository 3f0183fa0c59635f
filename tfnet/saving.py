"""Saving a TFNet as a frozen graph export folder or a SavedModel, and reading both back."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfnet import storage
from tfnet.errors import GraphLoadError, TensorNameError, unknown_name_message
from tfnet.freeze import freeze_signature
from tfnet.graph_io import FROZEN_GRAPH_FILE, META_FILE, PathLike, read_graph_def, read_meta

FORMAT_VERSION = 1


def write_export_folder(net, path: PathLike, storage_options=None) -> None:
    """Writes ``net`` as an export folder (see :func:`write_export_files`); ``path`` may be a URI."""
    folder = os.fspath(path)
    if storage.exists(folder, storage_options) and not storage.isdir(folder, storage_options):
        raise FileExistsError(f"{folder!r} is a file; TFNet.save writes a folder.")
    data = net.frozen_graph_def().SerializeToString(deterministic=True)
    write_export_files(folder, data, net.input_names, net.output_names, storage_options=storage_options, tfnet_meta={
        "format_version": FORMAT_VERSION,
        "weight_names": net.weight_names,
        "trainable": net.trainable,
        "statistics": net.statistic_names,
        "phase_values": {k: [_jsonable(v) for v in pair] for k, pair in net.phase_values.items()},
        **({"keras_source": net.keras_source} if net.keras_source else {}),
        **({"regularizers": net.regularizers} if net.regularizers else {}),
        **({"loss_names": net.loss_names} if net.loss_names else {}),
        **({"updates": net.updates} if net.updates else {}),
        **({"seed_inputs": list(net.graph.seed_inputs), "seed_step": net.state.seed_steps()}
           if net.graph.seed_inputs else {}),
    })


def write_export_files(folder: PathLike, graph: bytes, input_names, output_names, *, tfnet_meta: dict | None = None,
                       extra: dict | None = None, storage_options=None) -> None:
    """The one export-folder writer (``TFNet.save`` and TFPredictor's model snapshots use it):
    ``frozen_inference_graph.pb`` then ``graph_meta.json`` with the graph's SHA-256 under
    ``"tfnet"``, each atomically. A reader that finds a checksum mismatch knows the pair is
    inconsistent.

    Args:
        folder: The export folder (created if needed).
        graph: The serialized frozen GraphDef.
        input_names: Input tensor names, as Analytics Zoo's ``graph_meta.json`` holds them.
        output_names: Output tensor names.
        tfnet_meta: More entries for the ``"tfnet"`` section. Default: none.
        extra: More top-level entries. Default: none.
        storage_options: fsspec's options when ``folder`` is a URI. Default: none.
    """
    folder = os.fspath(folder)
    storage.makedirs(folder, storage_options)
    storage.write_bytes_atomic(storage.join(folder, FROZEN_GRAPH_FILE), graph, storage_options)
    meta = {"input_names": list(input_names), "output_names": list(output_names),
            "tfnet": {**(tfnet_meta or {}), "graph_sha256": hashlib.sha256(graph).hexdigest()}}
    meta.update(extra or {})
    storage.write_bytes_atomic(storage.join(folder, META_FILE), json.dumps(meta, indent=2).encode("utf-8"),
                               storage_options)


def read_export_folder(folder: PathLike, storage_options=None) -> tuple[graph_pb2.GraphDef, dict]:
    """The frozen graph and ``graph_meta.json`` of an export folder (a path or a URI), checked
    against the checksum the writer recorded."""
    folder = os.fspath(folder)
    if not storage.exists(folder, storage_options):
        raise FileNotFoundError(f"Export folder not found: {folder!r}")
    if not storage.isdir(folder, storage_options):
        raise GraphLoadError(
            f"{folder!r} is a file; an export folder holds {FROZEN_GRAPH_FILE} and {META_FILE}. "
            "For a single .pb file use TFNet.from_frozen_graph."
        )
    meta = read_meta(folder, storage_options)
    pb = storage.join(folder, FROZEN_GRAPH_FILE)
    if not storage.exists(pb, storage_options):
        raise FileNotFoundError(f"{pb!r} not found in the export folder.")
    data = storage.read_bytes(pb, storage_options)
    want = meta.get("tfnet", {}).get("graph_sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise GraphLoadError(
            f"{pb!r} does not match the checksum in {META_FILE}: the file is truncated, corrupt, or "
            "was replaced after saving."
        )
    return read_graph_def(data), meta


def write_saved_model(net, path: PathLike) -> None:
    """Writes a SavedModel whose ``serving_default`` signature runs the graph on the current
    weights, stored as variables. Written to a temporary folder first, then renamed into place."""
    path = os.fspath(path)
    module = tf.Module()
    module.weights = [tf.Variable(v.value(), name=v.name.split(":")[0]) for v in net.weight_variables.values()]
    module.tables = net.tables  # lookup tables the graph reads (tfnet.tables)
    weights = module.weights
    arg_names = _unique([_identifier(n) for n in net.input_names])
    out_keys = _unique([_identifier(n) for n in net.output_names])
    specs = [tf.TensorSpec(s.shape, s.dtype, name=a) for s, a in zip(net.input_specs, arg_names)]

    @tf.function(input_signature=specs)
    def serve(*xs):
        outs = net.run_graph(list(xs), [w.value() for w in weights])
        return dict(zip(out_keys, outs))

    module.serve = serve
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-savedmodel-", dir=parent)
    try:
        tf.saved_model.save(module, tmp, signatures={"serving_default": serve.get_concrete_function()})
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=".old-savedmodel-", dir=parent)
            os.replace(path, os.path.join(old, "m"))
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def load_saved_model_signature(path: PathLike, signature: str):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"SavedModel directory not found: {path!r}")
    if not os.path.isdir(path) or not (
        os.path.exists(os.path.join(path, "saved_model.pb")) or os.path.exists(os.path.join(path, "saved_model.pbtxt"))
    ):
        raise GraphLoadError(
            f"{path!r} is not a SavedModel directory (no saved_model.pb inside). For a frozen graph "
            "file use TFNet.from_frozen_graph."
        )
    try:
        loaded = tf.saved_model.load(path)
    except (ValueError, OSError, tf.errors.OpError) as exc:
        raise GraphLoadError(f"Could not load the SavedModel at {path!r}: {str(exc).strip().splitlines()[0]}") from None
    signatures = list(getattr(loaded, "signatures", {}) or {})
    if signature not in signatures:
        raise TensorNameError(
            unknown_name_message("signature", signature, signatures)
            if signatures
            else f"The SavedModel at {path!r} has no signatures; re-export it with one."
        )
    return freeze_signature(loaded, signature)


def _jsonable(value):
    value = value.tolist() if hasattr(value, "tolist") else value
    return value.decode() if isinstance(value, bytes) else value


def _identifier(tensor: str) -> str:
    name = tensor[:-2] if tensor.endswith(":0") else tensor.replace(":", "_")
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return name if name and not name[0].isdigit() else "t_" + name


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            n = f"{n}_{seen[n]}"
        else:
            seen[n] = 0
        out.append(n)
    return out
