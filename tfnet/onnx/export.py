"""Writing an ONNX-born TFNet back to ONNX with its current weights.

A net straight from ``from_onnx`` is written as the whole ONNX graph it came from. A net made from
one by ``cut`` and ``add_head`` is written as the part of the ONNX graph its outputs need (the body,
found through :attr:`OnnxSource.values`, which ties TensorFlow tensors to ONNX values) followed by
the head's TensorFlow ops written as ONNX nodes (:mod:`tfnet.onnx.export_tf`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfnet import graph_utils as gu
from tfnet.atomic import write_bytes_atomic
from tfnet.graph_io import PathLike
from tfnet.keras_training import inference_graph
from tfnet.onnx.errors import NotOnnxNetError
from tfnet.onnx.export_tf import HeadWriter
from tfnet.onnx.load import opset_of
from tfnet.onnx.shared_stats import split_statistics


@dataclass(frozen=True)
class OnnxSource:
    """What ``save_onnx`` needs of the ONNX model a net came from; ``cut`` and ``add_head`` pass it on."""

    model: Any  # onnx.ModelProto
    weight_names: Mapping[str, str]  # TF weight name -> ONNX initializer name
    values: Mapping[str, tuple[str, bool]]  # TF tensor name -> (ONNX value name, held in NHWC?)
    outputs: tuple[str, ...]  # the outputs of the net from_onnx made
    statistic_copies: Mapping[str, str]  # TF weight -> shared ONNX initializer (tfnet.onnx.shared_stats)


def updated_model(model, weights: Mapping[str, np.ndarray], onnx_names: Mapping[str, str]):
    """A copy of ``model`` whose initializers hold ``weights`` (TF weight name -> value)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    _update_initializers(out.graph.initializer, weights, onnx_names)
    return out


def _update_initializers(initializers, weights, onnx_names) -> None:
    from onnx import numpy_helper

    by_onnx = {onnx_names[k]: v for k, v in weights.items() if k in onnx_names}
    for i, t in enumerate(initializers):
        if t.name in by_onnx:
            value = np.asarray(by_onnx[t.name]).astype(numpy_helper.to_array(t).dtype, copy=False)
            initializers[i].CopyFrom(numpy_helper.from_array(value, t.name))


def write_onnx(net, path: PathLike) -> None:
    """Writes ``net`` as ONNX with its current weights to ``path`` (atomically) and checks it.

    Raises:
        NotOnnxNetError: ``net`` has no ONNX model behind it (made from TensorFlow or Keras).
        OnnxExportError: ``net``'s head holds an op with no ONNX mapping.
    """
    import onnx

    source = net.onnx_source
    if source is None:
        raise NotOnnxNetError(
            "save_onnx writes nets whose body came from TFNet.from_onnx (cut and add_head on such a net are "
            "fine); this net was built from a TensorFlow graph, a SavedModel or Keras, and tfnet does not convert "
            "TensorFlow graphs to ONNX. Use net.save(folder) for a frozen TensorFlow graph (TensorFlow, OpenVINO "
            "and TensorFlow Serving read it) and convert that with tf2onnx: python -m tf2onnx.convert --graphdef "
            "folder/frozen_inference_graph.pb --inputs <net.input_names> --outputs <net.output_names> --output "
            "model.onnx (see docs/onnx.md)."
        )
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a folder; save_onnx writes one .onnx file.")
    if tuple(net.output_names) == source.outputs:
        out = updated_model(source.model, net.get_weights(), source.weight_names)
    else:
        out = extended_model(net, source)
    split_statistics(out, net.get_weights(), source.statistic_copies)
    onnx.checker.check_model(out, full_check=True)
    write_bytes_atomic(path, out.SerializeToString())


def extended_model(net, source: OnnxSource):
    """The ONNX body that ``net``'s outputs need, then its head, with the current weights."""
    import onnx
    from onnx import helper

    model = source.model
    weights = net.get_weights()
    body_values = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input} | \
        {t.name for t in model.graph.initializer}
    taken = set(body_values)
    needed: list[str] = []
    transposes: list = []

    def boundary(tensor: str) -> str | None:
        hit = source.values.get(tensor)
        if hit is None:
            return None
        name, nhwc = hit
        needed.append(name)
        if not nhwc:
            return name
        out = gu.unique_name(name + "_nhwc", taken)
        taken.add(out)
        transposes.append(helper.make_node("Transpose", [name], [out], name=out, perm=[0, 2, 3, 1]))
        return out

    # a Keras head's dropout and noise layers switch on the training phase (tfnet.keras_training): inference here
    writer = HeadWriter(inference_graph(net.template), weights, boundary, opset_of(model), taken)
    outputs, renames = [], []
    for tensor, spec in zip(net.output_names, net.output_specs):
        value = writer.value(tensor)
        want = value if tensor in source.values and not source.values[tensor][1] else gu.unique_name(
            gu.node_name(tensor), taken)
        if want != value:
            taken.add(want)
            renames.append(helper.make_node("Identity", [value], [want], name=want))
        outputs.append(_value_info(want, spec))
    inputs = [source.values[t][0] for t in net.input_names]
    body = _body(model.graph, needed + inputs, set(inputs))
    by_input = {i.name: i for i in model.graph.input}
    graph = helper.make_graph(
        body + transposes + writer.nodes + renames, model.graph.name or "tfnet",
        [by_input[i] for i in inputs], outputs, initializer=_initializers(model.graph, body, needed) + writer.initializers,
    )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.CopyFrom(graph)
    _update_initializers(out.graph.initializer, weights, source.weight_names)
    return out


def _value_info(name: str, spec):
    from onnx import helper

    dims = [d if d is not None else ("batch" if i == 0 else f"d{i}") for i, d in enumerate(spec.shape.as_list())]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype.as_numpy_dtype))
    return helper.make_tensor_value_info(name, elem, dims)


def _used_names(node) -> set[str]:
    """Every value ``node`` reads, including those its subgraphs (If, Loop) read from outside."""
    from onnx import AttributeProto

    names = {i for i in node.input if i}
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for n in g.node:
                names |= _used_names(n)
    return names


def _body(graph, wanted: list[str], stops: set[str]) -> list:
    """The nodes of ``graph`` that ``wanted`` needs, in graph order; ``stops`` are given as inputs."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    keep: set[int] = set()
    stack = [v for v in wanted if v not in stops]
    seen = set(stack)
    while stack:
        i = producer.get(stack.pop())
        if i is None or i in keep:
            continue
        keep.add(i)
        for name in _used_names(graph.node[i]) - seen - stops:
            seen.add(name)
            stack.append(name)
    return [graph.node[i] for i in sorted(keep)]


def _initializers(graph, body: list, needed: list[str]) -> list:
    used = set(needed).union(*(_used_names(n) for n in body))
    return [t for t in graph.initializer if t.name in used]
