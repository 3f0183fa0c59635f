"""``optim.rank``: the rank side of training over Spark, run in a Spark executor's Python worker (the stage's task,
the rank, its gang, watchdog and tally). Its modules are imported when first named (``optim.rank.<module>``)."""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
