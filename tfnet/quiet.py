"""Importing TensorFlow without its start-up banner. Pure standard library.

TensorFlow writes its oneDNN notice (and absl's preamble) to stderr before ``TF_CPP_MIN_LOG_LEVEL``
applies, once per process: eight times in a 2-rank Spark job. :func:`import_tensorflow` captures
stderr during the import and writes back every line that is not that known noise.
``TFNET_VERBOSE=1`` turns the filtering off. Importing this module imports TensorFlow that way
(``tfnet/__init__`` does it first).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

__all__ = ["VERBOSE_ENV", "import_tensorflow", "noisy"]

VERBOSE_ENV = "TFNET_VERBOSE"
# What TensorFlow writes to stderr on import that is not a real problem.
_TF_NOISE = re.compile(
    r"All log messages before absl::InitializeLog|port\.cc:\d+\] oneDNN custom operations|cpu_feature_guard|"
    r"^To enable the following instructions|rebuild TensorFlow with the appropriate compiler flags"
)


def noisy() -> bool:
    """True when the user asked for other libraries' output (``TFNET_VERBOSE`` set, not ``0``)."""
    return os.environ.get(VERBOSE_ENV, "0") not in ("", "0")


def import_tensorflow():
    """Imports TensorFlow, keeping its start-up banner out of stderr (unless :func:`noisy`).
    Returns the module."""
    if "tensorflow" in sys.modules or noisy():
        import tensorflow

        return tensorflow
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real stderr (embedded interpreters)
        import tensorflow

        return tensorflow
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines() if line.strip() and not _TF_NOISE.search(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
    return tensorflow


tensorflow = import_tensorflow()
