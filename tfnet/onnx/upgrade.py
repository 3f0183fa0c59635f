"""Old operator versions upgraded with ONNX's own version converter before conversion.

Models of opsets 1 to 8 use operator versions older than some handlers convert (``Add``/``Mul``/``Sub``/``Div``
v6 with the ``broadcast`` attribute, ``Gemm v6``, ``PRelu v6``, ``AveragePool v1``, ``BatchNormalization v6``,
``Slice v1``, ``Pow v1``, ``Max``/``Min``/``Sum v6``). Where a model has such a node, it is upgraded with
``onnx.version_converter.convert_version`` to the oldest opset at which every such operator has a version tfnet
converts; a model whose operators all convert as they are is left unchanged, and so is one whose inputs or
outputs the upgrade would change (``Scan`` 8 to 9 drops their batch axis): its old nodes are refused by name.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def _nodes(graph):
    """Every node of ``graph`` and of its subgraphs (``If``, ``Loop``, ``Scan`` bodies)."""
    from onnx import AttributeProto

    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from _nodes(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _nodes(g)


def target_opset(model, opset: int) -> int | None:
    """The opset to upgrade ``model`` (of default-domain ``opset``) to, or None when no node needs it: the
    oldest opset at which every operator whose version at ``opset`` is older than its handler converts has
    a version the handler converts."""
    from tfnet.onnx import handlers  # noqa: F401  (registers the handlers)
    from tfnet.onnx.registry import DEFAULT_DOMAINS, handled_versions, op_version

    target = None
    for node in _nodes(model.graph):
        if node.domain not in DEFAULT_DOMAINS:
            continue
        version = op_version(node.op_type, opset)
        handled = handled_versions(node.op_type)
        if version is None or not handled or version >= handled[0]:
            continue
        target = max(target or 0, handled[0])  # an operator version is introduced at the opset of its number
    return target


def upgrade(model, opset: int):
    """``model`` upgraded to :func:`target_opset` with ``onnx.version_converter``, or ``model`` itself when
    nothing needs it or the converter cannot (the nodes are then refused by name and version, as before)."""
    from onnx import version_converter

    target = target_opset(model, opset)
    if target is None or target <= opset:
        return model
    try:
        upgraded = version_converter.convert_version(model, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError, ValueError or its own C++ errors
        logger.info("onnx.version_converter could not upgrade the model from opset %d to %d: %s", opset, target,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        return model
    if _signature(upgraded) != _signature(model):  # Scan 8 -> 9 drops the batch axis of the graph's inputs
        logger.info("onnx.version_converter changed the model's inputs or outputs upgrading it from opset %d to %d; "
                    "kept as it is.", opset, target)
        return model
    logger.debug("Upgraded the ONNX model from opset %d to %d with onnx.version_converter.", opset, target)
    return upgraded


def _signature(model) -> list[tuple]:
    """What the model takes and gives: each graph input's and output's name, element type and dimensions."""
    def dims(value) -> tuple | None:
        t = value.type.tensor_type
        return tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim) if t.HasField("shape") \
            else None

    inits = {t.name for t in model.graph.initializer}
    return [(v.name, v.type.tensor_type.elem_type, dims(v)) for v in model.graph.input if v.name not in inits] + \
           [(v.name, v.type.tensor_type.elem_type, dims(v)) for v in model.graph.output]
