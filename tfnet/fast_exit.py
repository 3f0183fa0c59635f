"""A process that imported tfnet exits without tearing down TensorFlow's objects one by one. Pure standard library.

At exit, CPython clears every module and collects the cycles left (functions and their module's globals, classes and
their methods): for the 260,000 objects that TensorFlow, Keras and tfnet's imports hold, 0.6-0.8 CPU-s in a process
that imported ``tfnet, optim`` and 1.3 in a Keras program (2-core AMD EPYC Zen 4), paid by drivers, rank processes and
users' programs for memory the OS takes back a moment later anyway (Spark's forked Python workers end with
``os._exit``, and tfnet's worker daemon froze its imports before forking: neither paid it). :func:`install` registers
an ``atexit`` handler that collects what is garbage by then (its finalizers run, as they would at exit), then freezes
what is still alive out of the collector's reach (``gc.freeze()``): the teardown skips it. ``benchmarks/bench_exit.py``
measures both ways side by side (docs/benchmarks.md).

What changes: an object still reachable when the interpreter exits and held in a reference cycle is not deallocated,
so its ``__del__`` does not run; Python does not promise that it does ("It is not guaranteed that ``__del__()``
methods are called for objects that still exist when the interpreter exits", the data model's ``object.__del__``).
Everything else happens as before: ``atexit`` handlers (the handler runs in their order, after those registered
after ``import tfnet``), ``weakref.finalize`` callbacks, the flush of ``sys.stdout`` and ``sys.stderr``, the exit
status; objects freed by reference counting when their module is cleared (a buffered file held by a global) are
closed as before. ``TFNET_FAST_EXIT=0`` turns it off (before ``import tfnet``), for a program that counts on the
finalizers of live objects in cycles.
"""

from __future__ import annotations

import atexit
import gc
import os

__all__ = ["FAST_EXIT_ENV", "enabled", "install"]

#: ``0`` (or empty): the interpreter's exit tears everything down, as without tfnet.
FAST_EXIT_ENV = "TFNET_FAST_EXIT"

_installed = False


def enabled() -> bool:
    """Whether :func:`install` registers its handler (``TFNET_FAST_EXIT`` unset, or set to something but ``0``/``""``)."""
    return os.environ.get(FAST_EXIT_ENV, "1") not in ("", "0")


def _collect_then_freeze() -> None:
    gc.collect()  # what is garbage now is finalized, as the exit's own collection would
    gc.freeze()  # what is alive stays out of the exit's collections: not torn down object by object


def install() -> bool:
    """Registers the exit handler once per process (``tfnet/__init__`` calls it); False where ``TFNET_FAST_EXIT=0``."""
    global _installed
    if _installed or not enabled():
        return _installed
    atexit.register(_collect_then_freeze)
    _installed = True
    return True
