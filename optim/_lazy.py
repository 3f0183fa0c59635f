"""Packages whose modules are imported when first named, so importing a package pulls in nothing."""

from __future__ import annotations

import importlib


def submodules(package: str):
    """A module ``__getattr__`` for ``package``: ``package.<name>`` imports ``package.name``."""

    def __getattr__(name: str):  # noqa: N807 (the module hook's name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
