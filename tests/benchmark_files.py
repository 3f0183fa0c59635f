"""A benchmark script loaded as a plain module, for the tests that drive a benchmark's own code (its folder first on
``sys.path``, as the script puts it: a test restores ``sys.path`` after, with monkeypatch)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def load(name: str):
    """``benchmarks/<name>.py``, executed as a fresh module (never one another test left in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
