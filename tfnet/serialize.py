"""A TFNet as bytes: its weightless graph, names, weights, trainable selection and low-rank
adapters (:mod:`tfnet.lora`), in one checksummed container (:mod:`tfnet.container`, no pickle). Used to ship a net to Spark workers.

Hooks are code, so they are not in that container (loading a net from a file never runs code): they
travel beside it, pickled with cloudpickle (:func:`hooks_to_bytes`, :func:`register_hooks`), wherever
a net is shipped to run (training ranks, evaluation tasks)."""

from __future__ import annotations

import numpy as np
from tensorflow.core.framework import graph_pb2

from tfnet.container import pack, unpack
from tfnet.lora import Adapter
from tfnet.net import TFNet
from tfnet.parts import NetParts

FORMAT = "tfnet-net-2"


def net_to_bytes(net) -> bytes:
    arrays = {f"w{i:05d}": v for i, v in enumerate(net.get_weights().values())}
    header = {
        "inputs": net.input_names,
        "outputs": net.output_names,
        "weights": net.weight_names,
        "trainable": net.trainable,
        "statistics": net.statistics,
        "phase_values": {k: [_jsonable(v) for v in pair] for k, pair in net.phase_values.items()},
        "fold": net.graph.fold,
        "name": net.name,
        "lora": [ad.to_json() for ad in net.adapters.values()],
        "keras_source": net.keras_source,
        "regularizers": net.regularizers,
        "losses": net.loss_names,
        "updates": net.updates,
        "seed_inputs": list(net.graph.seed_inputs),
        "seed_step": net.state.seed_steps(),
    }
    arrays["template"] = np.frombuffer(net.template.SerializeToString(), np.uint8)
    return pack(FORMAT, header, arrays)


def net_from_bytes(data: bytes):
    """The TFNet from :func:`net_to_bytes`' output.

    Raises:
        tfnet.container.ContainerError: not a serialized TFNet, or corrupt.
    """
    meta, arrays = unpack(data, FORMAT, what="serialized TFNet")
    template = graph_pb2.GraphDef()
    template.ParseFromString(bytes(arrays["template"]))
    values = {name: arrays[f"w{i:05d}"] for i, name in enumerate(meta["weights"])}
    net = TFNet.from_parts(NetParts(template, meta["inputs"], meta["outputs"], values, meta["statistics"],
                                    meta["trainable"], name=meta["name"], fold=meta["fold"],
                                    phase_values={k: tuple(v) for k, v in meta.get("phase_values", {}).items()},
                                    adapters=[Adapter.from_json(item) for item in meta.get("lora", [])],
                                    regularizers=meta.get("regularizers"), losses=meta.get("losses", ()),
                                    seed_inputs=meta.get("seed_inputs", ()), seed_step=meta.get("seed_step", 0),
                                    updates=meta.get("updates")))
    net.keras_source = meta.get("keras_source")
    return net


def _jsonable(value):
    value = value.tolist() if hasattr(value, "tolist") else value
    return value.decode() if isinstance(value, bytes) else value


HOOK_KINDS = ("forward", "gradient", "update")


def hooks_to_bytes(net) -> bytes | None:
    """The net's hooks (``net.hooks``) pickled with cloudpickle, or None when it has none.

    Raises:
        Whatever cloudpickle raises for a hook it cannot pickle.
    """
    hooks = net.hooks
    if not any(hooks.values()):
        return None
    import cloudpickle

    return cloudpickle.dumps({kind: list(hooks[kind]) for kind in HOOK_KINDS})


def register_hooks(net, data: bytes | None):
    """Registers the hooks :func:`hooks_to_bytes` made on ``net`` (in their order); returns ``net``."""
    if not data:
        return net
    import cloudpickle

    hooks = cloudpickle.loads(data)
    register = {"forward": net.register_forward_hook, "gradient": net.register_gradient_hook,
                "update": net.register_update_hook}
    for kind in HOOK_KINDS:
        for fn in hooks.get(kind, ()):
            register[kind](fn)
    return net
