"""The import graph of ``tfnet/`` and ``optim/``, read from the source with ``ast`` (no third-party tool).

    python scripts/import_graph.py          # which rooms (packages) import which: docs/architecture.md's figure

Every import counts, an import inside a function as much as one at the top. tests/test_import_rules.py
checks the house rules with these functions: no cycle (but one documented edge), no private name
imported from another module.
"""

from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tfnet", "optim")


def modules(root: str = ROOT) -> dict[str, str]:
    """Module name -> path, for every ``.py`` file of the packages."""
    out = {}
    for pkg in PACKAGES:
        for folder, _, files in os.walk(os.path.join(root, pkg)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    mod = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    out[mod[: -len(".__init__")] if mod.endswith(".__init__") else mod] = path
    return out


def imports(mods: dict[str, str]) -> tuple[dict[str, set[str]], list[tuple[str, str, str, int]]]:
    """``(edges, private)``: every module's imports of the packages' modules (at any depth of its
    code), and each import of a private name from another module as ``(importer, module, name, line)``."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges[mod].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                if base.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    if f"{base}.{alias.name}" in mods:
                        edges[mod].add(f"{base}.{alias.name}")
                    elif base in mods:
                        edges[mod].add(base)
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            private.append((mod, base, alias.name, node.lineno))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v] - {v}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found



#: Modules that sit on top of their package's others and are rooms of their own in the figure: the
#: user-facing entry points that reach across packages.
FACADES = {
    "tfnet.net": "tfnet.net (TFNet)",
    "tfnet": "tfnet (package: public names)",
    "optim": "optim (package: public names)",
    "optim.optimizer": "optim.optimizer (TFOptimizer)",
    "optim.keras_compat": "optim.optimizer (TFOptimizer)",
    "optim.spark.driver.evaluate": "optim.spark.driver.evaluate",
}


def room(module: str, mods: dict[str, str] | None = None) -> str:
    """The room of a module in the figure: its package, or its own for a :data:`FACADES` module."""
    if module in FACADES:
        return FACADES[module]
    path = (mods or modules()).get(module, "")
    here = module if path.endswith("__init__.py") else module.rpartition(".")[0] or module
    return "optim.spark.driver" if here.startswith("optim.spark.driver.") else here


def rooms() -> dict[str, set[str]]:
    """Room -> the other rooms its modules import."""
    mods = modules()
    edges, _ = imports(mods)
    out: dict[str, set[str]] = {}
    for mod, targets in edges.items():
        here = room(mod, mods)
        out.setdefault(here, set()).update(room(t, mods) for t in targets if room(t, mods) != here)
    return out


def main() -> None:
    for here, targets in sorted(rooms().items()):
        shown = ", ".join(sorted(targets)) or "-"
        print(f"{here:32s} -> {shown}")


if __name__ == "__main__":
    sys.exit(main())
