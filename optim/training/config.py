"""Where :class:`~optim.config.TrainConfig` was: it lives in the core layer (:mod:`optim.config`), beside the protocol
that carries it; this name stays importable for code that imports it from here."""

from optim.config import TrainConfig

__all__ = ["TrainConfig"]
