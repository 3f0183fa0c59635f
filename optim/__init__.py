"""optim: optimisation and distribution for tfnet.

* update rules as pure, composable transformations (``optim.transforms``), packaged as methods:
  :class:`SGD`, :class:`Adam`, :class:`AdamW`, :class:`RMSprop`, :class:`Adagrad`, :class:`LARS`;
* learning-rate schedules (``optim.schedules``), losses (``optim.losses``), metrics
  (``optim.metrics``);
* :class:`TFOptimizer`, which trains a TFNet on one worker or over Spark, and :class:`TFDataset`.
"""

from optim import losses, metrics, schedules, transforms
from optim.checkpoint import CheckpointError, CheckpointWarning
from optim.data import TFDataset
from optim.loop import NonFiniteLossError
from optim.losses import LabelShapeError
from optim.methods import LARS, SGD, Adagrad, Adam, AdamW, Method, RMSprop
from optim.optimizer import TFOptimizer
from optim.predictor import TFPredictor
from optim.predictor_transformer import TFNetTransformer
from optim.spark_launcher import warm_up_workers
from optim.transforms import chain, partition

__all__ = [
    "TFOptimizer",
    "TFDataset",
    "TFPredictor",
    "TFNetTransformer",
    "warm_up_workers",
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Adagrad",
    "LARS",
    "Method",
    "chain",
    "partition",
    "losses",
    "metrics",
    "schedules",
    "transforms",
    "NonFiniteLossError",
    "LabelShapeError",
    "CheckpointError",
    "CheckpointWarning",
]
