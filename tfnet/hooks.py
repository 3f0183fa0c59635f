"""Removable hooks, as in ``torch.utils.hooks.RemovableHandle``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

_ids = itertools.count()


class HookHandle:
    """Returned by ``TFNet.register_*_hook``. Call :meth:`remove` (or use ``with``) to unregister."""

    def __init__(self, registry: HookList, key: int):
        self._registry = registry
        self._key = key

    def remove(self) -> None:
        self._registry.remove(self._key)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class HookList:
    """An ordered set of hooks. ``version`` changes on each add or remove, so compiled functions
    that traced the hooks know when to retrace."""

    def __init__(self, on_change: Callable[[], None] | None = None):
        self._hooks: dict[int, Callable] = {}
        self._on_change = on_change

    def add(self, fn: Callable) -> HookHandle:
        if not callable(fn):
            raise TypeError(f"A hook must be callable. Received: {fn!r}")
        key = next(_ids)
        self._hooks[key] = fn
        if self._on_change:
            self._on_change()
        return HookHandle(self, key)

    def remove(self, key: int) -> None:
        if self._hooks.pop(key, None) is not None and self._on_change:
            self._on_change()

    def __iter__(self) -> Iterator[Callable]:
        return iter(list(self._hooks.values()))

    def __len__(self) -> int:
        return len(self._hooks)

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def run(self, value):
        """Passes ``value`` through each hook in order; a hook returning ``None`` keeps the value."""
        for fn in self:
            result = fn(value)
            if result is not None:
                value = result
        return value
