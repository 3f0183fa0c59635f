"""optim: optimisation and distribution for tfnet.

* update rules as pure, composable transformations (``optim.transforms``), packaged as methods:
  :class:`SGD`, :class:`Adam`, :class:`AdamW`, :class:`RMSprop`, :class:`Adagrad`, :class:`Adamax`, :class:`Nadam`,
  :class:`Lion`, :class:`Adadelta`, :class:`Lamb`, :class:`Adafactor`, :class:`Ftrl`,
  :class:`ScheduleFreeAdamW`, :class:`Muon`, :class:`LARS`;
* learning-rate schedules (``optim.schedules``), losses (``optim.losses``), metrics
  (``optim.metrics``), every error (``optim.errors``);
* :class:`TFOptimizer`, which trains a TFNet on one worker (``optim.training``) or over Spark
  (``optim.spark``), and :class:`TFDataset`;
* :class:`KerasModel`, a compiled Keras model's ``fit``, ``evaluate`` and ``predict`` with Keras's arguments and
  results, through a TFOptimizer (``optim.keras_model``);
* :class:`TFPredictor` and :class:`TFNetTransformer` (``optim.predict``);
* :class:`TFNetEstimator`, fine-tuning as a Spark ML ``Estimator``, and :class:`TFNetModel`, what it
  fits (``optim.ml``).

Names are imported when first used, so ``import optim.methods`` (or ``optim.transforms``, ...)
pulls in neither PySpark nor Horovod; TensorFlow comes in first through tfnet, without its start-up
banner. See docs/architecture.md for the layout.
"""

from __future__ import annotations

import importlib
from typing import Any

# TensorFlow through tfnet's own import, which keeps its start-up banner out of stderr (tfnet.quiet):
# optim's modules import TensorFlow, and a program may import optim before tfnet
import tfnet.quiet  # noqa: F401

# public name -> module that defines it
_EXPORTS = {
    "TFOptimizer": "optim.optimizer",
    "KerasModel": "optim.keras_model",
    "TFDataset": "optim.data",
    "History": "optim.training.history",
    "TFPredictor": "optim.predict.predictor",
    "TFNetTransformer": "optim.predict.transformer",
    "TFNetEstimator": "optim.ml.estimator",
    "TFNetModel": "optim.ml.model",
    "warm_up_workers": "optim.spark.warm_up",
    "SGD": "optim.methods",
    "Adam": "optim.methods",
    "AdamW": "optim.methods",
    "RMSprop": "optim.methods",
    "Adagrad": "optim.methods",
    "Adamax": "optim.methods",
    "Nadam": "optim.methods",
    "Lion": "optim.methods",
    "Adadelta": "optim.methods",
    "Lamb": "optim.methods",
    "Adafactor": "optim.methods",
    "Ftrl": "optim.methods",
    "ScheduleFreeAdamW": "optim.methods",
    "Muon": "optim.methods",
    "LARS": "optim.methods",
    "Method": "optim.methods",
    "EveryStep": "optim.sync",
    "LocalSGD": "optim.sync",
    "Asynchronous": "optim.sync",
    "chain": "optim.transforms",
    "partition": "optim.transforms",
    "NonFiniteLossError": "optim.errors",
    "NonFiniteInputError": "optim.errors",
    "LabelShapeError": "optim.errors",
    "CheckpointError": "optim.errors",
    "OptimizerStateError": "optim.errors",
    "CheckpointWarning": "optim.errors",
    "DistributedTrainingError": "optim.errors",
    "SparkSetupError": "optim.errors",
    "BadRowError": "optim.errors",
    "ColumnError": "optim.errors",
    "DataError": "optim.errors",
    "CorruptFileError": "optim.errors",
    "StorageError": "optim.errors",
    "WorkerError": "optim.errors",
    "from_spark_error": "optim.errors",
    "raise_tfnet_errors": "optim.errors",
}
_SUBMODULES = ("losses", "metrics", "schedules", "transforms", "methods", "sync", "errors", "logs", "arrow", "keras_compat",
               "keras_losses", "loss_base",
               "callbacks",
               "optimizer", "data", "training", "spark", "predict", "transport", "ml")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"optim.{name}")
    else:
        raise AttributeError(f"module 'optim' has no attribute {name!r}. Public names: {', '.join(__all__)}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
