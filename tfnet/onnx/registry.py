"""The operator handlers and the operator versions each converts.

A handler is registered for one or more ONNX operator names with ``since``: the oldest version of
the operator (its ``since_version`` in ONNX's changelog) whose meaning it implements. It converts
every version from ``since`` up to the operator's version at :data:`CHECKED_OPSET`, the newest
opset the handlers were checked against. A model's node is converted by its handler when the
operator's version at the model's opset lies in that range; otherwise, when ONNX defines the
operator as a function of other operators, the function is expanded
(:mod:`tfnet.onnx.functions`); otherwise the node is refused at load, by name and version.

Each handler takes ``(ctx, node, attrs)``, reads its inputs from ``ctx`` and stores its outputs
with ``ctx.set``; ``ctx.version`` is the operator version being converted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache

CHECKED_OPSET = 28  # onnx 1.23's newest opset: every handler's version range was checked against it
DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Handler:
    fn: Callable
    since: int  # the oldest operator version it converts


HANDLERS: dict[str, Handler] = {}


def register(*names: str, since: int = 1):
    """Registers the decorated function as the handler of ``names``, for operator versions
    ``since`` and up (to the version current at :data:`CHECKED_OPSET`)."""

    def deco(fn):
        for n in names:
            HANDLERS[n] = Handler(fn, since)
        return fn

    return deco


@cache
def op_version(op: str, opset: int, domain: str = "") -> int | None:
    """The version (``since_version``) of ``op`` in ``opset``, or None where ONNX has no such operator."""
    from onnx import defs

    try:
        return int(defs.get_schema(op, opset, domain).since_version)
    except defs.SchemaError:
        return None


@lru_cache(maxsize=1)
def _history() -> dict[str, tuple[int, ...]]:
    """Every default-domain operator's versions."""
    from onnx import defs

    history: dict[str, set[int]] = {}
    for s in defs.get_all_schemas_with_history():
        if s.domain == "":
            history.setdefault(s.name, set()).add(int(s.since_version))
    return {k: tuple(sorted(v)) for k, v in history.items()}


def versions_of(op: str) -> tuple[int, ...]:
    """Every version ONNX (the installed ``onnx``) defines of ``op``."""
    return _history().get(op, ())


def handled_versions(op: str) -> tuple[int, ...]:
    """The versions of ``op`` that its handler converts (empty when it has none)."""
    handler = HANDLERS.get(op)
    newest = op_version(op, CHECKED_OPSET)
    if handler is None or newest is None:
        return ()
    return tuple(v for v in versions_of(op) if handler.since <= v <= newest)


def handles(op: str, version: int | None) -> bool:
    return version is not None and version in handled_versions(op)
