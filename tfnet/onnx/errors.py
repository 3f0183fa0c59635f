"""Typed errors of the ONNX import. Each is a :class:`tfnet.GraphLoadError` (a ``ValueError``),
except a missing external-data file, which is also a ``FileNotFoundError``."""

from __future__ import annotations

from tfnet.errors import GraphLoadError

__all__ = [
    "OnnxLoadError",
    "UnsupportedOperatorError",
    "OpsetError",
    "ExternalDataError",
    "OnnxConversionError",
    "NotOnnxNetError",
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
    """``save_onnx`` was called on a net that was not made by ``from_onnx`` (or was cut or extended)."""
