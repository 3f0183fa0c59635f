"""ONNX models (and PyTorch models through ``torch.onnx.export``) as trainable TFNets.

``TFNet.from_onnx(path)`` converts the ONNX graph operator by operator into a TensorFlow graph with
the initializers as weights; ``net.save_onnx(path)`` writes the ONNX model back with the current
weights, also after ``cut`` and ``add_head`` (the Keras head as ONNX nodes). Needs the ``onnx``
package (``pip install tfnet[onnx]``). docs/onnx.md lists what converts and what comes back out.
"""

from tfnet.onnx.errors import (
    ExternalDataError,
    NotOnnxNetError,
    OnnxConversionError,
    OnnxExportError,
    OnnxLoadError,
    OpsetError,
    UnsupportedOperatorError,
)
from tfnet.onnx.load import MAX_OPSET, MIN_OPSET

__all__ = [
    "ExternalDataError",
    "NotOnnxNetError",
    "OnnxConversionError",
    "OnnxExportError",
    "OnnxLoadError",
    "OpsetError",
    "UnsupportedOperatorError",
    "MIN_OPSET",
    "MAX_OPSET",
]
