"""Importing TensorFlow without its start-up banner. Pure standard library.

TensorFlow writes absl's preamble, its oneDNN notice and the CPU-feature notice to file descriptor 2
while it is imported, before ``TF_CPP_MIN_LOG_LEVEL`` applies to the first two: up to 6 lines per
process (the driver, and each Spark Python worker). :func:`import_tensorflow` captures descriptor 2
for the duration of the import and writes back every line that is not that known noise (real
warnings and errors still show). ``TFNET_VERBOSE=1`` turns the filtering off. Importing this module
imports TensorFlow that way (``tfnet/__init__`` does it first), so ``import tfnet`` before anything
else imports TensorFlow (``import keras``, ``import tensorflow``) keeps the banner out of a program.

Nothing here runs unless tfnet is imported: tfnet installs no start-up hook (no ``.pth`` file), so it
cannot filter an import of TensorFlow that came before its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

__all__ = ["VERBOSE_ENV", "filtered_stderr", "import_tensorflow", "noisy"]

VERBOSE_ENV = "TFNET_VERBOSE"
# What TensorFlow writes to stderr on import that is not a real problem.
_TF_NOISE = re.compile(
    r"All log messages before absl::InitializeLog|port\.cc:\d+\] oneDNN custom operations|cpu_feature_guard|"
    r"^To enable the following instructions|rebuild TensorFlow with the appropriate compiler flags"
)


def noisy() -> bool:
    """True when the user asked for other libraries' output (``TFNET_VERBOSE`` set, not ``0``)."""
    return os.environ.get(VERBOSE_ENV, "0") not in ("", "0")


@contextlib.contextmanager
def filtered_stderr():
    """Captures file descriptor 2 (what C++ code writes too) for the duration, then writes back the
    lines that are not TensorFlow's start-up noise. Does nothing without a real stderr, or when
    :func:`noisy`."""
    if noisy():
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real stderr (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines() if line.strip() and not _TF_NOISE.search(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")


def import_tensorflow():
    """Imports TensorFlow, keeping its start-up banner out of stderr (unless :func:`noisy`).
    Returns the module. Where TensorFlow is imported already, its banner (if any) was printed then."""
    if "tensorflow" in sys.modules or noisy():
        import tensorflow

        return tensorflow
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with filtered_stderr():
        import tensorflow
    return tensorflow


tensorflow = import_tensorflow()
