"""tfnet: fine-tune and run frozen TensorFlow graphs over Apache Spark.

The layer, :class:`TFNet`, wraps a frozen graph (or a SavedModel or Keras model) as a pure function
of its inputs and explicit weights, with forward, backward and weight-update hooks. Optimisation and
distribution live in the sibling package ``optim``.
"""

# first: TensorFlow imported with its start-up banner kept out of stderr (TFNET_VERBOSE=1 keeps it)
from tfnet.quiet import tensorflow as _tensorflow  # noqa: F401, I001
from tfnet import fast_exit as _fast_exit  # noqa: I001
from tfnet.config import get_num_threads, set_num_threads
from tfnet.errors import (
    GradientUnavailableError,
    GraphExecutionError,
    GraphLoadError,
    InputSpecError,
    InputTypeError,
    KerasSourceError,
    KernelCheckError,
    NoWeightsError,
    RegularizerError,
    TensorNameError,
    TFNetError,
    WeightError,
    WeightTypeError,
)
from tfnet.hooks import HookHandle
from tfnet.net import TFNet
from tfnet.step import StepResult, TrainStep

__version__ = "0.1.0"

# the exit skips tearing down TensorFlow's objects one by one (TFNET_FAST_EXIT=0: as without tfnet)
_fast_exit.install()

__all__ = [
    "TFNet",
    "TrainStep",
    "StepResult",
    "HookHandle",
    "set_num_threads",
    "get_num_threads",
    "TFNetError",
    "GraphLoadError",
    "GraphExecutionError",
    "TensorNameError",
    "InputSpecError",
    "InputTypeError",
    "WeightError",
    "WeightTypeError",
    "NoWeightsError",
    "GradientUnavailableError",
    "KerasSourceError",
    "KernelCheckError",
    "RegularizerError",
]
