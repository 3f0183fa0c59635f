"""Importing TensorFlow without its start-up banner. Pure standard library.

TensorFlow writes its oneDNN notice (and absl's preamble) to stderr before ``TF_CPP_MIN_LOG_LEVEL``
applies, once per process: eight times in a 2-rank Spark job. :func:`import_tensorflow` captures
stderr during the import and writes back every line that is not that known noise.
``TFNET_VERBOSE=1`` turns the filtering off. Importing this module imports TensorFlow that way
(``tfnet/__init__`` does it first).

The capture lives in the top-level module ``_tfnet_quiet``, which ``tfnet-quiet.pth`` also imports at
interpreter start-up to do the same for whatever imports TensorFlow first (``import keras`` before
``import tfnet``); see that module.
"""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["VERBOSE_ENV", "import_tensorflow", "noisy"]


def _startup_module():
    """``_tfnet_quiet``: installed beside the ``tfnet`` package, or read from there by path (an
    editable install made before it existed)."""
    try:
        import _tfnet_quiet
    except ImportError:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_tfnet_quiet.py")
        spec = importlib.util.spec_from_file_location("_tfnet_quiet", path)
        _tfnet_quiet = importlib.util.module_from_spec(spec)
        sys.modules["_tfnet_quiet"] = _tfnet_quiet
        spec.loader.exec_module(_tfnet_quiet)
    return _tfnet_quiet


_quiet = _startup_module()
VERBOSE_ENV = _quiet.VERBOSE_ENV
noisy = _quiet.noisy


def import_tensorflow():
    """Imports TensorFlow, keeping its start-up banner out of stderr (unless :func:`noisy`).
    Returns the module."""
    if "tensorflow" in sys.modules or noisy():
        import tensorflow

        return tensorflow
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _quiet.uninstall()  # this import filters itself
    with _quiet.filtered_stderr():
        import tensorflow
    return tensorflow


tensorflow = import_tensorflow()
