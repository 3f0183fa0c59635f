"""``TFNet.from_onnx``: read, check, convert, wrap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfnet.inputs import as_name_list


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
    back to NCHW at once instead of keeping NHWC through element-wise ops (for comparison)."""
    require_onnx()
    from tfnet.onnx.convert import convert
    from tfnet.onnx.export import OnnxSource
    from tfnet.onnx.load import read_model

    model = read_model(source)
    converted = convert(
        model,
        None if inputs is None else as_name_list(inputs, "inputs"),
        None if outputs is None else as_name_list(outputs, "outputs"),
        propagate_layout=propagate_layout,
        relax_batch=relax_batch,
    )
    net = cls._from_template(
        converted.template, converted.inputs, converted.outputs, converted.values, converted.statistics, None,
        name=name, fold=fold_batch_norm,
    )
    if trainable is not None:
        net.trainable = trainable
    net._onnx_source = OnnxSource(model, converted.onnx_weight_names, converted.onnx_values, tuple(net.output_names),
                                  converted.statistic_copies)
    return net
