"""``optim.spark``: its modules are imported when first named (``optim.spark.<module>``)."""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
