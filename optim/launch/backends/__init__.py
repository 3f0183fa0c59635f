"""``optim.launch.backends``: how each kind of session runs the training stage (classic, Connect).
Its modules are imported when first named (``optim.launch.backends.<module>``)."""

from optim._lazy import submodules

__getattr__ = submodules(__name__)
