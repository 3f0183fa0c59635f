"""Initializers that serve as a batch norm's running statistics and as something else.

``torch.onnx.export`` stores parameters and buffers of equal value as one initializer (the others become
``Identity`` nodes of it). At PyTorch's initial values a batch norm's bias and running mean are both
zeros, and its weight and running variance both ones, so one initializer can be a trainable bias in one
place and a frozen running mean in another. Trained as one weight, its gradient would mix the two (and
nearly cancel). tfnet unties them: the statistic uses read a separate, frozen copy (``<name>_statistic``),
and ``save_onnx`` writes that copy as its own initializer for the batch norms' mean and variance inputs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tfnet import graph_utils as gu

_STAT_INPUTS = (3, 4)  # BatchNormalization's input_mean and input_var


def initializer_aliases(graph) -> dict[str, str]:
    """Value name -> the initializer it is (itself, or through ``Identity`` nodes)."""
    alias = {t.name: t.name for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Identity" and n.input and n.input[0] in alias:
            alias[n.output[0]] = alias[n.input[0]]
    return alias


def shared_statistics(graph) -> set[str]:
    """Initializers used as a batch norm's mean or variance and also in any other way."""
    alias = initializer_aliases(graph)
    stats, other = set(), set()
    for n in graph.node:
        if n.op_type == "Identity" and n.input and n.input[0] in alias:
            continue
        for i, name in enumerate(n.input):
            if name in alias:
                (stats if n.op_type == "BatchNormalization" and i in _STAT_INPUTS else other).add(alias[name])
    other |= {alias[o.name] for o in graph.output if o.name in alias}
    return stats & other


def split_statistics(model, weights: Mapping[str, np.ndarray], copies: Mapping[str, str]) -> None:
    """Writes each statistic copy (TF weight name -> ONNX initializer) into ``model`` as a new
    initializer and points the batch norms' mean and variance inputs that used the shared one at it."""
    from onnx import numpy_helper

    if not copies:
        return
    graph = model.graph
    alias = initializer_aliases(graph)
    taken = set(alias) | {o for n in graph.node for o in n.output}
    dtypes = {t.name: numpy_helper.to_array(t).dtype for t in graph.initializer}
    for tf_name, onnx_name in copies.items():
        if tf_name not in weights or onnx_name not in dtypes:
            continue
        new = gu.unique_name(onnx_name + "_statistic", taken)
        taken.add(new)
        value = np.asarray(weights[tf_name]).astype(dtypes[onnx_name], copy=False)
        graph.initializer.append(numpy_helper.from_array(value, new))
        for n in graph.node:
            if n.op_type == "BatchNormalization":
                for i in _STAT_INPUTS:
                    if i < len(n.input) and alias.get(n.input[i]) == onnx_name:
                        n.input[i] = new
