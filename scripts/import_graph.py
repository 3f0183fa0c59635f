"""The import graph of ``tfnet/`` and ``optim/``, read from the source with ``ast`` (no third-party tool).

    python scripts/import_graph.py          # the layers and which rooms import which: docs/architecture.md's figure

Every import counts, an import inside a function as much as one at the top. tests/test_import_rules.py
checks the house rules with these functions: no cycle, imports one way down the :data:`LAYERS`, no private
name imported from another module and no private attribute of another module read, no module over
:data:`MAX_LINES` lines.
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



#: The layers, bottom first: ``(name, module prefixes)``. A module may import its own layer's modules and the
#: layers below; a layer of two sides (``|`` in the name) keeps them apart: neither imports the other.
LAYERS = [
    ("tfnet: the layer", ["tfnet"]),
    ("optim's core: rules, losses, metrics, errors, the run's config, the driver<->rank protocol",
     ["optim.errors", "optim.losses", "optim.metrics", "optim.methods", "optim.transforms", "optim.schedules",
      "optim.sync", "optim.arrow", "optim.logs", "optim._lazy", "optim.keras_compat", "optim.keras_losses",
      "optim.loss_base", "optim.output_metrics", "optim.protocol", "optim.carriers", "optim.config", "optim.shares",
      "optim.callbacks", "optim.mlflow_model",
      "optim.horovod_import"]),
    ("Spark plumbing: sessions, settings, cancellable jobs, slots, the warm-up, the workers' daemon",
     ["optim.spark.conf", "optim.spark.connect", "optim.spark.session", "optim.spark.jobs", "optim.spark.slots",
      "optim.spark.warm_up", "optim.spark.probe", "optim.spark.typed_errors", "optim.spark.decommission",
      "optim.spark.dynamic_allocation", "optim.spark.jvm_threads", "optim.spark.worker_daemon", "=optim.spark"]),
    ("data: the TFDataset protocol and one adapter per source", ["optim.data"]),
    ("the one-worker loop", ["optim.training"]),
    ("transport: the channels between the driver and the ranks", ["optim.transport"]),
    ("prediction: TFPredictor, TFNetTransformer", ["optim.predict"]),
    ("the rank side | the driver side", ["optim.rank", "|", "optim.launch"]),
    ("TFOptimizer, and KerasModel over it", ["optim.optimizer", "optim.keras_model"]),
    ("Spark ML: TFNetEstimator", ["optim.ml"]),
    ("optim's public names (lazy)", ["=optim"]),
]
#: The longest a module may be.
MAX_LINES = 500


def layer_of(module: str) -> tuple[int, int]:
    """``(layer, side)`` of a module: the layer whose longest prefix matches it (side 0, or 1 after ``|``); an entry
    ``=name`` is that module alone (a package's ``__init__``), so a new module in it must be given a layer."""
    best = (-1, -1, 0)
    for i, (_, prefixes) in enumerate(LAYERS):
        side = 0
        for p in prefixes:
            if p == "|":
                side = 1
                continue
            exact = p.startswith("=")
            p = p.lstrip("=")
            if (module == p or (not exact and module.startswith(p + "."))) and len(p) > best[0]:
                best = (len(p), i, side)
    if best[1] < 0:
        raise KeyError(f"{module} is in no layer of LAYERS")
    return best[1], best[2]


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that go up the layers, or across the two sides of a layer: ``(importer, imported)``."""
    out = []
    for mod, targets in sorted(edges.items()):
        here = layer_of(mod)
        for t in sorted(targets):
            there = layer_of(t)
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                out.append((mod, t))
    return out


def private_names(mods: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the private names (``_x``) it defines: module-level functions, classes and variables, methods and
    attributes (``self._x = ...``) of its classes."""
    out: dict[str, set[str]] = {}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for leaf in ast.walk(t):
                        if isinstance(leaf, ast.Name):
                            names.add(leaf.id)
                        elif isinstance(leaf, ast.Attribute):
                            names.add(leaf.attr)
        out[mod] = {n for n in names if n.startswith("_") and not n.startswith("__")}
    return out


def _class_members(cls: ast.ClassDef) -> set[str]:
    """The names a class defines: its methods and class attributes, and what its methods assign to ``self``."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def private_owners(mods: dict[str, str]) -> dict[str, list[str]]:
    """``{private name: the modules that define it}`` (:func:`private_names`, turned round)."""
    owners: dict[str, list[str]] = {}
    for mod, names in private_names(mods).items():
        for n in names:
            owners.setdefault(n, []).append(mod)
    return owners


def private_reads(mods: dict[str, str]) -> list[tuple[str, str, int, list[str]]]:
    """Reads of another module's private attribute: ``obj._x`` (``obj`` not ``self`` or ``cls``) where a tfnet or
    optim module defines ``_x``, unless the read is inside a class that defines ``_x`` itself (another instance of
    the same class), or ``_x`` is defined in this module and in no other. Each as ``(module, name, line, modules
    that define it)``. Third-party private members (``sc._jsc``) are no module's of ours, so not counted here."""
    owners = private_owners(mods)
    out = []
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        enclosing: dict[int, set[str]] = {}
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef):
                members = _class_members(cls)
                for node in ast.walk(cls):
                    enclosing.setdefault(id(node), set()).update(members)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            name = node.attr
            if name not in owners or name in enclosing.get(id(node), ()):
                continue
            if owners[name] == [mod]:
                continue
            out.append((mod, name, node.lineno, sorted(owners[name])))
    return out


def self_private_reads(mods: dict[str, str]) -> list[tuple[str, str, int, list[str]]]:
    """Reads of ``self._x`` (or ``cls._x``) where ``_x`` is defined in another tfnet or optim module and not in
    this one: a private member inherited across modules (a base class or mixin elsewhere), which
    :func:`private_reads` leaves to this check. Each as ``(module, name, line, modules that define it)``.
    Names no module of ours defines (a third-party base's) are not counted."""
    owners = private_owners(mods)
    out = []
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ("self", "cls")):
                continue
            name = node.attr
            if name.startswith("_") and not name.startswith("__") and name in owners and mod not in owners[name]:
                out.append((mod, name, node.lineno, sorted(owners[name])))
    return out


def long_modules(mods: dict[str, str]) -> dict[str, int]:
    """The modules over :data:`MAX_LINES` lines, with their lines."""
    out = {}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            out[mod] = n
    return out


#: Modules that sit on top of their package's others and are rooms of their own in the figure: the
#: user-facing entry points that reach across packages.
FACADES = {
    "tfnet": "tfnet (package: public names)",
    "tfnet.net": "tfnet.net (TFNet)",
    "tfnet.net_state": "tfnet.net (TFNet)",
    "tfnet.net_compute": "tfnet.net (TFNet)",
    "tfnet.net_loading": "tfnet.net (TFNet)",
    "tfnet.net_surgery": "tfnet.net (TFNet)",
    "tfnet.net_export": "tfnet.net (TFNet)",
    "optim": "optim (package: public names)",
    "optim.optimizer": "optim.optimizer (TFOptimizer)",
    "optim.keras_model": "optim.keras_model (KerasModel)",
}


def room(module: str, mods: dict[str, str] | None = None) -> str:
    """The room of a module in the figure: its package, or its own for a :data:`FACADES` module."""
    if module in FACADES:
        return FACADES[module]
    path = (mods or modules()).get(module, "")
    here = module if path.endswith("__init__.py") else module.rpartition(".")[0] or module
    if here == "optim":
        return "optim core"
    return "optim.launch" if here.startswith("optim.launch.") else here


def rooms() -> dict[str, set[str]]:
    """Room -> the other rooms its modules import."""
    mods = modules()
    edges, _ = imports(mods)
    out: dict[str, set[str]] = {}
    for mod, targets in edges.items():
        here = room(mod, mods)
        out.setdefault(here, set()).update(room(t, mods) for t in targets if room(t, mods) != here)
    return out


def entry_points(mods: dict[str, str]) -> list[tuple[str, str, str, bool]]:
    """Every entry point a module names as a string (``"optim.rank.task:run_task"``, what a Spark stage runs, imported
    where it runs): ``(module, named module, function, found)``, ``found`` True when the named module exists and
    defines that function at its top level. An edge the import checks cannot see, so it is checked on its own."""
    import re

    pattern = re.compile(r"^((?:tfnet|optim)(?:\.\w+)+):(\w+)$")
    out = []
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := pattern.match(node.value)):
                target, function = m.groups()
                found = False
                if target in mods:
                    with open(mods[target], encoding="utf-8") as f:
                        body = ast.parse(f.read(), mods[target]).body
                    found = any(isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == function
                                for d in body)
                out.append((mod, target, function, found))
    return out


def folder_edges(root: str = ROOT) -> dict[str, set[str]]:
    """Folder -> the other folders its modules import, for ``optim``'s folders (``optim/data``, ``optim/launch``, ...;
    a subfolder counts as its folder's); a module directly in ``optim`` (``optim/errors``, ``optim/optimizer``) is
    its own, as its layer is its own."""
    mods = modules(root)
    edges, _ = imports(mods)

    def folder(mod: str) -> str | None:
        parts = os.path.relpath(mods[mod], root).split(os.sep)
        if parts[0] != "optim":
            return None
        return "/".join(parts[:2]) if len(parts) > 2 else "/".join(parts)[: -len(".py")]

    out: dict[str, set[str]] = {}
    for mod, targets in edges.items():
        here = folder(mod)
        if here is not None:
            out.setdefault(here, set()).update(f for f in map(folder, targets) if f is not None and f != here)
    return out


def figure() -> str:
    """The layers, top first, each with its rooms and the rooms each imports (from the code)."""
    mods = modules()
    graph = rooms()
    by_layer: dict[int, set[str]] = {}
    for mod in mods:
        by_layer.setdefault(layer_of(mod)[0], set()).add(room(mod, mods))
    lines = []
    for i in range(len(LAYERS) - 1, -1, -1):
        name = LAYERS[i][0]
        lines.append(f"[{i}] {name}")
        for here in sorted(by_layer.get(i, ())):
            shown = ", ".join(sorted(graph.get(here, ()))) or "-"
            lines.append(f"      {here:34s} -> {shown}")
        if i:
            lines.append("       |  imports go down only")
    return "\n".join(lines)


def main() -> None:
    print(figure())


if __name__ == "__main__":
    sys.exit(main())
