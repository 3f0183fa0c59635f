"""Keeping TensorFlow's start-up banner out of stderr, whatever imports TensorFlow first. Standard
library only: this module is imported at interpreter start-up by ``tfnet-quiet.pth``, which tfnet's
install puts in ``site-packages`` (as setuptools does with ``_distutils_hack``).

TensorFlow writes its oneDNN notice, the CPU-feature notice and absl's preamble to file descriptor 2
while it is imported, before ``TF_CPP_MIN_LOG_LEVEL`` applies: 4 lines, twice, in every process that
imports it (the driver, and each Spark Python worker). ``import keras`` imports it too, so importing
keras before tfnet used to print them. :func:`install` adds an import hook that, on the first import
of ``tensorflow`` by anyone, captures descriptor 2 for the duration of that import and writes back
every line that is not that known noise (real warnings and errors still show). The hook then
removes itself; it looks at no other module. ``TFNET_VERBOSE=1`` turns it off.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile

__all__ = ["VERBOSE_ENV", "filtered_stderr", "install", "noisy"]

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


class _QuietLoader(importlib.abc.Loader):
    """Runs ``tensorflow``'s own loader inside :func:`filtered_stderr`; the module keeps that loader."""

    def __init__(self, spec):
        self.spec, self.loader = spec, spec.loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.spec.loader = module.__loader__ = self.loader
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with filtered_stderr():
            self.loader.exec_module(module)


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the other finders do, with a loader that keeps its banner quiet."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        uninstall()
        if noisy():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _QuietLoader(spec)
        return spec


_FINDER = _TensorFlowFinder()


def install() -> None:
    """Adds the hook (once), unless TensorFlow is imported already."""
    if "tensorflow" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
