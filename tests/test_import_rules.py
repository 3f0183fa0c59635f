"""The house rules of imports in ``tfnet/`` and ``optim/``, read from the source (``ast``; no third-party
tool): no import cycle (an import inside a function counts as much as one at the top), and no module
imports a private name (``_x``) from another module.

One edge back is allowed, documented in :mod:`optim.training.datasets`: ``TFDataset.from_dataframe``
imports :mod:`optim.spark.datasets` when it is called, because that module subclasses the classes the
factory lives beside.
"""

from __future__ import annotations

import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts.import_graph import cycles, imports, modules  # noqa: E402

#: (importer, imported): the one lazy edge back, and why (see the module's docstring)
ALLOWED = {("optim.training.datasets", "optim.spark.datasets")}

def test_the_checker_finds_a_cycle_and_a_private_import(tmp_path):
    """The rules' own check, on a small tree written here: it must see a cycle through an import inside a
    function, and a private name imported from another module."""
    pkg = tmp_path / "optim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from optim.b import helper\n")
    (pkg / "b.py").write_text("def helper():\n    from optim import a\n    return a\n")
    (pkg / "c.py").write_text("from optim.b import _hidden\n")
    (tmp_path / "tfnet").mkdir()
    (tmp_path / "tfnet" / "__init__.py").write_text("")
    mods = modules(str(tmp_path))
    edges, private = imports(mods)
    assert cycles(edges) == [["optim.a", "optim.b"]]
    assert private == [("optim.c", "optim.b", "_hidden", 1)]


def test_no_import_cycles_in_tfnet_and_optim():
    edges, _ = imports(modules())
    for importer, imported in ALLOWED:
        assert imported in edges[importer], f"the allowed edge {importer} -> {imported} is gone: drop it from ALLOWED"
        edges[importer].discard(imported)
    assert cycles(edges) == []


def test_the_one_edge_back_is_an_import_inside_a_function():
    """The allowed edge is lazy, so importing ``optim.training.datasets`` never imports ``optim.spark``."""
    for importer, imported in ALLOWED:
        path = modules()[importer]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        top = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)} | {
            a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        assert imported not in top and imported.rpartition(".")[0] not in top


def test_no_module_imports_a_private_name_from_another():
    _, private = imports(modules())
    assert private == []
