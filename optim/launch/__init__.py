"""``optim.launch``: the driver side of training over Spark (the launcher, its backends, the retry and elastic
policies, the run's states). Its modules are imported when first named (``optim.launch.<module>``)."""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
