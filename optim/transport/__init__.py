"""``optim.transport``: the channels between the process that launches a training stage (the driver,
or rank 0 under Spark Connect) and the ranks. Runs on both sides; imports no PySpark and nothing from
``optim.spark``.

* :mod:`~optim.transport.auth`: the job's per-channel keys and request signatures;
* :mod:`~optim.transport.store`: the secured rendezvous store (step counts, failure reports,
  heartbeats, Gloo's keys) and :func:`~optim.transport.store.stuck_rank`;
* :mod:`~optim.transport.client`: a rank's signed calls to the store, and the proxy for Gloo's own;
* :mod:`~optim.transport.store_address`: how a Connect stage's ranks find rank 0's store;
* :mod:`~optim.transport.progress` and :mod:`~optim.transport.progress_store`: rank 0's progress to
  the driver, over a connection or through ``model_dir``;
* :mod:`~optim.transport.failures`: a rank's error as data, and as a span of error text;
* :mod:`~optim.transport.chunks`: rank 0's result in pieces (Spark Connect's ``collect()``).

Its modules are imported when first named (``optim.transport.<module>``).
"""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
