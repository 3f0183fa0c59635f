"""Every operator handler tfnet has, registered in :mod:`tfnet.onnx.registry` by importing the modules that
define them. The converter imports this module; the handler modules import only :mod:`tfnet.onnx.ops`
(the shared helpers) and the registry, never the converter."""

from __future__ import annotations

from tfnet.onnx import (  # noqa: F401  (importing them registers their handlers)
    ops,
    ops_cast,
    ops_col2im,
    ops_control,
    ops_conv_nd,
    ops_deform,
    ops_grid,
    ops_image,
    ops_index,
    ops_loop,
    ops_nn,
    ops_pool,
    ops_resize,
    ops_rnn,
    ops_sequence,
    ops_shape,
    ops_signal,
    ops_string,
    ops_tensor,
    ops_text,
)
from tfnet.onnx.registry import HANDLERS

__all__ = ["load_handlers", "supported_operators"]


def supported_operators() -> list[str]:
    """Every operator that some version of converts (docs/onnx.md has the versions)."""
    return sorted(HANDLERS)


def load_handlers() -> None:
    """The handlers are registered when this module is imported; kept for callers that ask explicitly."""
