"""``optim.training``: its modules are imported when first named (``optim.training.<module>``)."""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
