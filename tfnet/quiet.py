"""Importing TensorFlow without its start-up banner. Pure standard library.

TensorFlow writes absl's preamble, its oneDNN notice and the CPU-feature notice to file descriptor 2
while it is imported, before ``TF_CPP_MIN_LOG_LEVEL`` applies to the first two: up to 6 lines per
process (the driver, and each Spark Python worker). :func:`import_tensorflow` captures descriptor 2
for the duration of the import and writes back every line that is not that known noise (real
warnings and errors still show). ``TFNET_VERBOSE=1`` turns the filtering off. Importing this module
imports TensorFlow that way (``tfnet/__init__`` does it first), so ``import tfnet`` before anything
else imports TensorFlow (``import keras``, ``import tensorflow``) keeps the banner out of a program.

It also leaves Keras unloaded (:func:`without_eager_keras`): TensorFlow's own import loads all of Keras, which
most of tfnet's processes never use.

Nothing here runs unless tfnet is imported: tfnet installs no start-up hook (no ``.pth`` file), so it
cannot filter an import of TensorFlow that came before its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

__all__ = ["EAGER_KERAS_ENV", "VERBOSE_ENV", "eager_keras", "filtered_stderr", "import_tensorflow", "noisy",
           "without_eager_keras"]

VERBOSE_ENV = "TFNET_VERBOSE"
#: Set (not ``0``): TensorFlow's import loads Keras, as TensorFlow does alone (:func:`without_eager_keras`).
EAGER_KERAS_ENV = "TFNET_EAGER_KERAS"
# What TensorFlow writes to stderr on import that is not a real problem.
_TF_NOISE = re.compile(
    r"All log messages before absl::InitializeLog|port\.cc:\d+\] oneDNN custom operations|cpu_feature_guard|"
    r"^To enable the following instructions|rebuild TensorFlow with the appropriate compiler flags"
)


def _switched_on(name: str) -> bool:
    """Whether the environment variable ``name`` is set to something other than ``""`` or ``0``."""
    return os.environ.get(name, "0") not in ("", "0")


def noisy() -> bool:
    """True when the user asked for other libraries' output (``TFNET_VERBOSE`` set, not ``0``)."""
    return _switched_on(VERBOSE_ENV)


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


#: What TensorFlow's ``__init__`` imports last, "so that any function/method that needs to happen at load time will
#: trigger, eg registration of optimizers in the SavedModel registry": for tf_keras. Keras 3 registers nothing there
#: (no global TensorFlow state either), but importing it loads all of Keras, scikit-learn and matplotlib with it.
_EAGER_KERAS = "keras.src.optimizers"


def eager_keras() -> bool:
    """Whether Keras is to load as TensorFlow loads it, so that tfnet leaves nothing out of an import: Keras is loaded
    already, ``TF_USE_LEGACY_KERAS`` is on (tf_keras's registrations are real), or ``TFNET_EAGER_KERAS`` is set. Read by
    :func:`without_eager_keras` and by ``optim.horovod_import`` (Horovod's import, which loads Keras too)."""
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "") in ("true", "True", "1")
    return legacy or _switched_on(EAGER_KERAS_ENV) or "keras" in sys.modules


@contextlib.contextmanager
def without_eager_keras():
    """TensorFlow imported inside leaves Keras unloaded: its eager ``import_module`` of :data:`_EAGER_KERAS` raises
    ``ImportError``, which TensorFlow catches and passes over. That was 1.5 s of a 3.5 s ``import tensorflow`` in every
    Spark Python worker and rank process (2-core AMD EPYC; docs/benchmarks.md), most of which never use Keras; Keras
    loads as usual when something imports it (``import keras``, ``tf.keras``, :meth:`TFNet.from_keras`). Does nothing
    where Keras is loaded already, with ``TF_USE_LEGACY_KERAS`` (tf_keras's registrations are real), or with
    ``TFNET_EAGER_KERAS=1`` (TensorFlow's own behaviour: ``spark.executorEnv.TFNET_EAGER_KERAS`` for the workers)."""
    if eager_keras() or _EAGER_KERAS in sys.modules:
        yield
        return
    sys.modules[_EAGER_KERAS] = None  # an import of it raises ModuleNotFoundError
    try:
        yield
    finally:
        if sys.modules.get(_EAGER_KERAS, False) is None:
            del sys.modules[_EAGER_KERAS]


def import_tensorflow():
    """Imports TensorFlow, keeping its start-up banner out of stderr (unless :func:`noisy`) and Keras unloaded
    (:func:`without_eager_keras`). Returns the module. Where TensorFlow is imported already, its banner (if any) was
    printed then, and Keras loaded with it."""
    if "tensorflow" in sys.modules:
        import tensorflow

        return tensorflow
    if not noisy():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with filtered_stderr(), without_eager_keras():
        import tensorflow
    return tensorflow


tensorflow = import_tensorflow()
