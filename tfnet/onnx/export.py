"""Writing an ONNX-born TFNet back to ONNX: the original graph with the current weights."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from tfnet.graph_io import PathLike, write_bytes_atomic
from tfnet.onnx.errors import NotOnnxNetError


def updated_model(model, weights: Mapping[str, np.ndarray], onnx_names: Mapping[str, str]):
    """A copy of ``model`` whose initializers hold ``weights`` (TF weight name -> value)."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_onnx = {onnx_names[k]: v for k, v in weights.items() if k in onnx_names}
    for i, t in enumerate(out.graph.initializer):
        if t.name in by_onnx:
            value = np.asarray(by_onnx[t.name]).astype(numpy_helper.to_array(t).dtype, copy=False)
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, t.name))
    return out


def write_onnx(net, path: PathLike) -> None:
    """Writes ``net``'s ONNX model with its current weights to ``path`` (atomically) and checks it.

    Raises:
        NotOnnxNetError: ``net`` was not made by ``TFNet.from_onnx`` (cut and add_head make new nets
            with no ONNX graph behind them).
    """
    import onnx

    source = getattr(net, "_onnx_source", None)
    if source is None:
        raise NotOnnxNetError(
            "save_onnx writes nets made by TFNet.from_onnx, with the ONNX graph they came from; this net has no "
            "ONNX graph (it was built from TensorFlow, or by cut()/add_head()). Use net.save(folder) for a frozen "
            "TensorFlow graph."
        )
    model, onnx_names = source
    out = updated_model(model, net.get_weights(), onnx_names)
    onnx.checker.check_model(out)
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a folder; save_onnx writes one .onnx file.")
    write_bytes_atomic(path, out.SerializeToString())
