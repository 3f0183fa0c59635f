"""``optim.predict``: its modules are imported when first named (``optim.predict.<module>``)."""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
