"""``optim.spark.driver``: its modules are imported when first named (``optim.spark.driver.<module>``)."""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
