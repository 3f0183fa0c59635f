"""A TFNet as bytes: its weightless graph, names, weights and trainable selection, in one
``.npz`` (no pickle). Used to ship a net to Spark workers; hooks are not included."""

from __future__ import annotations

import io
import json

import numpy as np
from tensorflow.core.framework import graph_pb2

FORMAT = "tfnet-net-1"


def net_to_bytes(net) -> bytes:
    arrays = {f"w{i:05d}": v for i, v in enumerate(net.get_weights().values())}
    meta = {
        "format": FORMAT,
        "inputs": net.input_names,
        "outputs": net.output_names,
        "weights": net.weight_names,
        "trainable": net.trainable,
        "statistics": net.statistics,
        "phase_values": {k: [_jsonable(v) for v in pair] for k, pair in net.phase_values.items()},
        "fold": net._graph.fold,
        "name": net.name,
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    arrays["template"] = np.frombuffer(net._template.SerializeToString(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def net_from_bytes(data: bytes):
    from tfnet.net import TFNet

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        meta = json.loads(bytes(npz["meta"]).decode())
        if meta.get("format") != FORMAT:
            raise ValueError(f"Not a serialized TFNet (format {meta.get('format')!r}).")
        template = graph_pb2.GraphDef()
        template.ParseFromString(bytes(npz["template"]))
        values = {name: npz[f"w{i:05d}"] for i, name in enumerate(meta["weights"])}
    return TFNet._from_template(template, meta["inputs"], meta["outputs"], values, meta["statistics"],
                                meta["trainable"], name=meta["name"], fold=meta["fold"],
                                phase_values={k: tuple(v) for k, v in meta.get("phase_values", {}).items()})


def _jsonable(value):
    value = value.tolist() if hasattr(value, "tolist") else value
    return value.decode() if isinstance(value, bytes) else value
