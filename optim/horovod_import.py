"""``horovod.tensorflow`` imported without loading Keras. Runs wherever tfnet imports Horovod: each rank's process, the
workers' import probe, the driver's check before a distributed run."""

from __future__ import annotations

import sys
import types

from tfnet.quiet import eager_keras

__all__ = ["import_horovod"]

#: The one module of ``horovod.tensorflow``'s ``__init__`` that loads Keras: it defines ``SyncBatchNormalization``, a
#: subclass of ``tf.keras.layers.BatchNormalization``.
_SYNC_BATCH_NORM = "horovod.tensorflow.sync_batch_norm"


def import_horovod():
    """``horovod.tensorflow``, imported without loading Keras. Horovod's ``__init__`` imports its
    ``SyncBatchNormalization``, whose class statement reaches ``tf.keras`` and so loads all of Keras, and with it
    scikit-learn, matplotlib and pandas: 1.4 of the 1.44 CPU-seconds of Horovod's import in a rank's process (2-core
    AMD EPYC Zen 5), in every process that runs a rank, though tfnet's ranks use Horovod's collective ops only.
    While Horovod is imported here, that module is a stand-in; afterwards ``hvd.SyncBatchNormalization`` (or
    ``import horovod.tensorflow.sync_batch_norm``) imports the real one, and Keras with it, on first use. Horovod is
    imported as it is wherever tfnet leaves Keras as TensorFlow loads it (:func:`tfnet.quiet.eager_keras`: Keras loaded
    already, ``TF_USE_LEGACY_KERAS``, ``TFNET_EAGER_KERAS``)."""
    if "horovod.tensorflow" in sys.modules or eager_keras():
        import horovod.tensorflow as hvd

        return hvd
    stand_in = types.ModuleType(_SYNC_BATCH_NORM)
    stand_in.SyncBatchNormalization = None
    sys.modules[_SYNC_BATCH_NORM] = stand_in
    try:
        import horovod.tensorflow as hvd
    finally:
        if sys.modules.get(_SYNC_BATCH_NORM) is stand_in:
            del sys.modules[_SYNC_BATCH_NORM]
    if vars(hvd).get("SyncBatchNormalization", 0) is None:
        del hvd.SyncBatchNormalization
        hvd.__getattr__ = _sync_batch_norm_on_first_use
    return hvd


def _sync_batch_norm_on_first_use(name: str):
    """``horovod.tensorflow``'s module ``__getattr__`` (PEP 562) after :func:`import_horovod`."""
    if name != "SyncBatchNormalization":
        raise AttributeError(f"module 'horovod.tensorflow' has no attribute {name!r}")
    from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization

    sys.modules["horovod.tensorflow"].SyncBatchNormalization = SyncBatchNormalization
    return SyncBatchNormalization
