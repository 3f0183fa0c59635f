"""Typed errors of the ONNX import. Each is a :class:`tfnet.GraphLoadError` (a ``ValueError``),
except a missing external-data file, which is also a ``FileNotFoundError``."""

from __future__ import annotations

from tfnet.errors import GraphLoadError, TFNetError

__all__ = [
    "OnnxLoadError",
    "UnsupportedOperatorError",
    "OpsetError",
    "ExternalDataError",
    "OnnxConversionError",
    "NotOnnxNetError",
    "OnnxExportError",
]


class OnnxLoadError(GraphLoadError):
    """The bytes or file could not be read as an ONNX model."""


class UnsupportedOperatorError(GraphLoadError):
    """The model uses operators that tfnet cannot convert; the message lists every one and its count."""


class OpsetError(GraphLoadError):
    """The model's opset is outside the range tfnet converts."""


class ExternalDataError(GraphLoadError, FileNotFoundError):
    """A tensor stored outside the ``.onnx`` file (external data) could not be found."""


class OnnxConversionError(GraphLoadError):
    """A supported operator is used in a way tfnet does not convert (an attribute value, a dynamic
    sequence length for a recurrent op)."""


class NotOnnxNetError(GraphLoadError):
    """``save_onnx`` was called on a net with no ONNX model behind it (one made from a frozen graph, a
    SavedModel or Keras, or loaded from an export folder)."""


class OnnxExportError(TFNetError, ValueError):
    """``save_onnx`` met a part of the net it cannot write as ONNX (a head op with no ONNX mapping, a
    cut at a tensor that is no ONNX value)."""
