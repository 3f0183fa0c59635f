"""``TFNet.from_onnx``: read, check, convert, wrap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfnet.inputs import as_name_list
from tfnet.onnx.convert import convert
from tfnet.onnx.export import OnnxSource
from tfnet.onnx.load import read_model
from tfnet.parts import NetParts


def require_onnx() -> None:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise ImportError("TFNet.from_onnx and save_onnx need the onnx package: pip install 'tfnet[onnx]'.") from None


def net_from_onnx(
    cls,
    source: Any,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    *,
    trainable=None,
    fold_batch_norm: bool = True,
    name: str = "tfnet",
    propagate_layout: bool = True,
    relax_batch: bool = True,
):
    """See :meth:`tfnet.TFNet.from_onnx`. ``propagate_layout=False`` transposes every NHWC result
    back to NCHW at once instead of keeping NHWC through element-wise ops (for comparison).

    ``cls`` is the class to build (``TFNet`` or a subclass), through its ``from_parts``."""
    require_onnx()
    model = read_model(source)
    converted = convert(
        model,
        None if inputs is None else as_name_list(inputs, "inputs"),
        None if outputs is None else as_name_list(outputs, "outputs"),
        propagate_layout=propagate_layout,
        relax_batch=relax_batch,
    )
    onnx_source = OnnxSource(model, converted.onnx_weight_names, converted.onnx_values, tuple(converted.outputs),
                             converted.statistic_copies)
    net = cls.from_parts(NetParts(
        converted.template, converted.inputs, converted.outputs, converted.values, converted.statistics, None,
        name=name, fold=fold_batch_norm, onnx_source=onnx_source,
    ))
    if trainable is not None:
        net.trainable = trainable
    return net
