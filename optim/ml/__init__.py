"""``optim.ml``: the Spark ML layer above :class:`~optim.optimizer.TFOptimizer`. Driver side (or a
Spark Connect client); needs PySpark.

* :mod:`~optim.ml.estimator`: :class:`TFNetEstimator`, fine-tuning as a Spark ML ``Estimator``;
* :mod:`~optim.ml.evaluators`: a tuning run's evaluator checked against the estimator's columns.

Its modules are imported when first named (``optim.ml.<module>``).
"""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
