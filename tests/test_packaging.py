"""tfnet installs its packages and nothing else (issue 41): no ``.pth`` file and no top-level module,
so installing it changes no other program's start-up. The wheel is built from a copy of the working
tree (as ``pip wheel .`` builds it, without touching the tree), then looked at and unpacked."""

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"tfnet", "optim", "tfnet_examples"}
# what the build does not need: version control, environments, build outputs
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    "runs", "out", "spark-warehouse", "metastore_db")
# which of a fresh interpreter's modules are tfnet's (setuptools' own finder of an editable install,
# ``__editable___tfnet_*_finder``, is not)
TFNET_MODULES = ("import sys, json; print(json.dumps(sorted(m for m in sys.modules if 'tfnet' in m "
                 "and not m.startswith('__editable__')) + [m for m in ('optim', 'tensorflow') if m in sys.modules]))")


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP", "TFNET_VERBOSE")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    """The wheel ``pip wheel`` builds from the working tree (about 1 s; without build isolation, as
    the virtual environment has setuptools and wheel; with it where that fails)."""
    base = tmp_path_factory.mktemp("wheel")
    src, out = base / "src", base / "out"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(out)]
    proc = subprocess.run(cmd + ["--no-build-isolation"], capture_output=True, text=True, timeout=300, cwd=str(base))
    if proc.returncode != 0:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(base))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = glob.glob(str(out / "tfnet-*.whl"))
    return path


def test_the_wheel_holds_the_packages_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".pth")], names
    assert not [n for n in names if "/" not in n], "no top-level module or file"
    tops = {n.split("/")[0] for n in names}
    (dist_info,) = [t for t in tops if t.endswith(".dist-info")]
    assert tops - {dist_info} == PACKAGES, sorted(tops)
    assert not [n for n in names if "_tfnet_quiet" in n], names
    top_level = zipfile.ZipFile(wheel).read(f"{dist_info}/top_level.txt").decode().split()
    assert set(top_level) == PACKAGES, top_level


def test_installing_the_wheel_changes_no_start_up(wheel, tmp_path):
    """The wheel unpacked as a site directory, processed as start-up processes site-packages
    (``site.addsitedir`` runs a ``.pth`` file's import lines): nothing of tfnet, nor TensorFlow,
    is imported, and no import hook is added."""
    site_dir = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site_dir)
    code = (f"import site, sys; hooks = list(sys.meta_path); site.addsitedir({str(site_dir)!r}); "
            "assert sys.meta_path == hooks, sys.meta_path; " + TFNET_MODULES)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], proc.stdout


def test_a_fresh_interpreter_of_the_environment_imports_nothing_of_tfnet(tmp_path):
    """This environment's own start-up (``make``'s editable install): no tfnet module and no
    TensorFlow, and no ``tfnet-quiet.pth`` left in its site-packages (scripts/install.sh removes the
    one that older versions put there)."""
    import site

    stale = [os.path.join(d, "tfnet-quiet.pth") for d in site.getsitepackages()
             if os.path.exists(os.path.join(d, "tfnet-quiet.pth"))]
    assert stale == [], "a start-up hook of an older tfnet; `make` (scripts/install.sh) removes it"
    proc = subprocess.run([sys.executable, "-c", TFNET_MODULES], capture_output=True, text=True, timeout=120,
                          env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], proc.stdout


def test_the_environment_holds_what_the_wheel_requires(wheel):
    """Every requirement of the wheel and its ``all`` extra (what ``make`` installs) is met by this environment's
    installed versions: an environment made before a requirement moved (``ml_dtypes<0.7``, whose 0.7.0 costs every
    process that imports TensorFlow 1.2 s of CPU) fails here instead of running slower unseen."""
    from email.parser import Parser
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist")
    wanted = [r for r in map(Requirement, requires) if r.marker is None or r.marker.evaluate({"extra": "all"})]
    assert "ml-dtypes" in {r.name.replace("_", "-") for r in wanted}, requires
    unmet = []
    for req in wanted:
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (installed: {have})")
    assert not unmet, "run `make install` again (scripts/install.sh): " + "; ".join(unmet)
