"""Errors and warnings raised by TFPredictor and TFNetTransformer (driver and worker side).

Each error derives from :class:`tfnet.TFNetError` and from the builtin a caller would expect, so
both ``except ValueError`` and ``except tfnet.TFNetError`` catch it.
"""

from __future__ import annotations

from tfnet.errors import TFNetError

__all__ = [
    "BadRowError",
    "ColumnError",
    "BackendError",
    "BackendUnavailableError",
    "BackendFallbackWarning",
]


class BadRowError(TFNetError, ValueError):
    """A row cannot be fed to the model: a null, an array of the wrong length, an undecodable image.

    Raised inside a Spark worker when ``on_error="raise"``; the message names the column, the row
    (its position in its partition) and what was expected. Spark shows it inside the
    ``PythonException`` that fails the job.
    """


class ColumnError(TFNetError, ValueError):
    """The feature or output columns do not fit the model or the DataFrame (a missing column, a
    column type the input cannot take, an output column that already exists)."""


class BackendError(TFNetError, ValueError):
    """An unknown backend name, or a backend that cannot run this model at all."""


class BackendUnavailableError(TFNetError, ImportError):
    """The requested backend's package is not installed (``pip install tfnet[openvino]``)."""


class BackendFallbackWarning(UserWarning):
    """OpenVINO could not convert or compile the graph; TensorFlow runs it instead. The message
    names the operations OpenVINO could not convert."""
