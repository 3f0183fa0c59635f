"""The house rules of ``tfnet/`` and ``optim/``, read from the source (``ast``; no third-party tool), with no
whitelist: no import cycle (an import inside a function counts as much as one at the top); imports run one
way, down the layers of ``scripts/import_graph.py`` (``LAYERS``, written down in docs/architecture.md), and the
rank side and the driver side never import each other; no module imports a private name (``_x``) from another
module, nor reads another module's private attribute (through ``self`` too: a class does not reach into a base
class's privates in another module, as mixins did); no module is over ``MAX_LINES`` lines."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts.import_graph import (  # noqa: E402
    MAX_LINES,
    ROOT,
    cycles,
    entry_points,
    figure,
    folder_edges,
    imports,
    layer_of,
    long_modules,
    modules,
    private_reads,
    self_private_reads,
    upward,
)


def small_tree(tmp_path, files: dict[str, str]) -> dict[str, str]:
    for name, text in {"optim/__init__.py": "", "tfnet/__init__.py": "", **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(str(tmp_path))


def test_the_checks_find_what_they_look_for(tmp_path):
    """The rules' own checks, on a small tree written here: a cycle through an import inside a function, a private
    name imported from another module, another module's private attribute read (directly, through a held state,
    and through ``self`` from a base class in another module), an import up the layers and across the two sides,
    and a long module."""
    mods = small_tree(tmp_path, {
        "optim/training/a.py": "from optim.training.b import helper\n",
        "optim/training/b.py": "def helper():\n    from optim.training import a\n    return a\n",
        "optim/training/c.py": "from optim.training.b import _hidden\n",
        "optim/training/d.py": "class D:\n    def __init__(self):\n        self._state = 1\n",
        "optim/training/e.py": "def peek(d):\n    return d._state\n",
        "optim/training/f.py": "from optim.training.d import D\n\nclass F(D):\n    def peek(self):\n        return self._state\n",
        "optim/training/g.py": "class G:\n    def __init__(self, d):\n        self.state = d\n    def peek(self):\n"
                      "        return self.state._state\n",
        "optim/training/h.py": "class H:\n    def __init__(self):\n        self._own = 1\n    def peek(self):\n"
                      "        return self._own, self._tracker\n",
        "optim/data/__init__.py": "from optim.training import loop\n",
        "optim/training/__init__.py": "", "optim/training/loop.py": "",
        "optim/spark/__init__.py": "", "optim/launch/__init__.py": "",
        "optim/launch/x.py": "import optim.rank.y\n",
        "optim/rank/__init__.py": "", "optim/rank/y.py": "x = 1\n" * (MAX_LINES + 1),
    })
    edges, private = imports(mods)
    assert cycles(edges) == [["optim.training.a", "optim.training.b"]]
    assert private == [("optim.training.c", "optim.training.b", "_hidden", 1)]
    assert sorted((m, n) for m, n, _, _ in private_reads(mods)) == [("optim.training.e", "_state"), ("optim.training.g", "_state")]
    assert [(m, n) for m, n, _, _ in self_private_reads(mods)] == [("optim.training.f", "_state")]
    assert ("optim.data", "optim.training.loop") in upward(edges)
    assert ("optim.launch.x", "optim.rank.y") in upward(edges)
    assert long_modules(mods) == {"optim.rank.y": MAX_LINES + 1}


def test_every_module_is_in_a_layer():
    for mod in modules():
        layer_of(mod)  # raises KeyError for a module no layer names
    for new in ("optim.nowhere", "optim.spark.nowhere"):  # a new module outside a layer's package is named, not taken in
        with pytest.raises(KeyError, match=f"{new} is in no layer"):
            layer_of(new)


def test_no_import_cycles_in_tfnet_and_optim():
    edges, _ = imports(modules())
    assert cycles(edges) == []


def test_string_entry_points_name_rank_side_functions_that_exist():
    """A Spark stage reaches the rank through a string (``TRAIN_ENTRY``), an edge no import shows: each such string
    names a function that exists, on the rank side (what the driver runs on the executors, never imports)."""
    mods = modules()
    found = entry_points(mods)
    assert ("optim.protocol", "optim.rank.task", "run_task", True) in found, found
    assert [e for e in found if not e[3]] == []
    rank_side = layer_of("optim.rank.task")
    assert [e for e in found if layer_of(e[1]) != rank_side] == []


def test_the_entry_point_check_finds_a_name_that_does_not_resolve(tmp_path):
    mods = small_tree(tmp_path, {"optim/rank/__init__.py": "", "optim/rank/task.py": "def run_task():\n    pass\n",
                                 "optim/protocol.py": 'A = "optim.rank.task:run_task"\nB = "optim.rank.gone:run"\n'
                                                      'C = "optim.rank.task:missing"\n'})
    assert sorted(entry_points(mods)) == [("optim.protocol", "optim.rank.gone", "run", False),
                                          ("optim.protocol", "optim.rank.task", "missing", False),
                                          ("optim.protocol", "optim.rank.task", "run_task", True)]


def test_optims_folders_form_no_cycle():
    """Folders say their layer: grouped by folder, optim's modules import one way (Spark plumbing in ``optim/spark``
    below ``optim/data``; the driver side in ``optim/launch`` and the rank side in ``optim/rank`` above it). With the
    driver and rank sides inside ``optim/spark``, as before, data, predict, spark, training and transport formed one."""
    assert cycles(folder_edges()) == []


def test_the_folder_check_finds_a_cycle_of_folders(tmp_path):
    small_tree(tmp_path, {"optim/data/__init__.py": "", "optim/data/a.py": "from optim.spark import b\n",
                          "optim/spark/__init__.py": "", "optim/spark/b.py": "",
                          "optim/spark/driver/__init__.py": "", "optim/spark/driver/c.py": "import optim.data.a\n"})
    assert cycles(folder_edges(str(tmp_path))) == [["optim/data", "optim/spark"]]


def test_imports_run_down_the_layers_and_the_two_sides_stay_apart():
    edges, _ = imports(modules())
    assert upward(edges) == []


def test_no_module_imports_a_private_name_from_another():
    _, private = imports(modules())
    assert private == []


def test_no_module_reads_another_modules_private_attributes():
    assert private_reads(modules()) == []


def test_no_module_reads_another_modules_private_members_through_self():
    """TFNet holds one state object with public attributes and its parts are functions of it, not mixins that
    reach into a base class's privates in another module."""
    assert self_private_reads(modules()) == []


def test_no_module_is_over_the_limit():
    assert long_modules(modules()) == {}


def test_the_layer_figure_in_the_architecture_doc_is_the_codes():
    """docs/architecture.md shows the figure ``python scripts/import_graph.py`` draws from the code, as it is now."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        doc = f.read()
    assert f"```\n{figure()}\n```" in doc, "docs/architecture.md's layer figure is stale: paste python scripts/import_graph.py's"
