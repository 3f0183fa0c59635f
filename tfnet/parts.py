"""What a :class:`tfnet.TFNet` is built from, as one value: :class:`NetParts`.

``TFNet.from_parts`` takes it (internal interface). Graph surgery (:mod:`tfnet.net_surgery`),
:mod:`tfnet.serialize` and :mod:`tfnet.onnx.build` describe the nets they make with it, so none of them
builds a NetState itself; this module imports nothing of tfnet but :mod:`tfnet.lora`'s
``Adapter`` type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorflow.core.framework import graph_pb2

from tfnet.lora import Adapter

__all__ = ["NetParts"]


@dataclass
class NetParts:
    """What a net is built from: a weightless graph and the values of its weights.

    Args:
        template: The ``GraphDef`` with every weight a ``Placeholder`` named after it.
        input_names: Input tensor names (``"name:0"``), in the order inputs are passed.
        output_names: Output tensor names.
        values: ``{weight name: array}`` for the graph's weights and the adapters' (``adapters``).
        statistics: The weights that hold normalisation statistics: names, or ``{name: role}``.
        trainable: The weights that train (names not in the net are skipped). Default: None, every
            weight except the statistics.
        name: The module name. Default: ``"tfnet"``.
        fold: Fold inference-mode batch norm in the graph that runs. Default: True.
        phase_values: ``{tensor name: (training value, inference value)}``. Default: None (none).
        adapters: Low-rank adapters (:mod:`tfnet.lora`); their weights' values are in ``values``.
            Default: none.
        onnx_source: The ONNX model the net came from (:class:`tfnet.onnx.export.OnnxSource`), for
            ``save_onnx``. Default: None.
        regularizers: ``{weight name: Keras's serialized regularizer}`` (:mod:`tfnet.regularizers`); names the net
            lacks are skipped. Default: none.
        losses: Tensor names of the losses the training loss adds (a Keras model's ``add_loss`` and
            ``activity_regularizer`` terms; :attr:`tfnet.TFNet.loss_names`). Default: none.
        seed_inputs: int64 ``(2,)`` tensors fed ``[stream, step]`` in training: the seed offset of a Keras model's
            dropout and noise layers (:mod:`tfnet.keras_training`). Default: none.
        seed_step: The training steps the net has taken, for those seeds. Default: 0.
        updates: ``{tensor name: weight name}``: tensors computed beside the outputs in training that the training
            step assigns to those weights (a Keras model's batch-norm moving statistics; :attr:`tfnet.TFNet.updates`).
            Default: none.
    """

    template: graph_pb2.GraphDef
    input_names: Sequence[str]
    output_names: Sequence[str]
    values: Mapping[str, Any]
    statistics: Sequence[str] | Mapping[str, str]
    trainable: Sequence[str] | None = None
    name: str = "tfnet"
    fold: bool = True
    phase_values: Mapping[str, tuple] | None = None
    adapters: Sequence[Adapter] = ()
    onnx_source: Any = None
    regularizers: Mapping[str, Mapping] | None = None
    losses: Sequence[str] = ()
    seed_inputs: Sequence[str] = ()
    seed_step: int = 0
    updates: Mapping[str, str] | None = None
