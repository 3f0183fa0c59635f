"""Under CI=true no test skips silently (issue 53): tests/conftest.py turns a skip into a failure unless its reason is
a hardware feature this CPU lacks, and sums those up in one line with the CPU. Run on a throwaway suite in a fresh
pytest, with and without CI=true."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUITE = textwrap.dedent("""
    import pytest

    def test_needs_a_server():
        pytest.skip("the server is not installed")

    @pytest.mark.skipif(True, reason="this CPU has no native bfloat16")
    def test_needs_bf16():
        pass

    def test_plain():
        pass
""")


def _run(tmp_path, ci: str, suite: str = SUITE, *args: str):
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "test_throwaway.py").write_text(suite)
    return _pytest(tmp_path, "-rA", *args, ci=ci)


def test_a_skip_fails_under_ci_unless_it_is_hardware(tmp_path):
    done = _run(tmp_path, "true")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout[-3000:]
    assert "skipped under CI=true: the server is not installed" in done.stdout
    assert "hardware skips: 1 test(s) need a feature this CPU lacks (" in done.stdout


def test_a_module_that_skips_fails_under_ci(tmp_path):
    done = _run(tmp_path, "true", "import pytest\npytest.importorskip('no_such_module_here')\n")
    assert done.returncode != 0 and "skipped under CI=true" in done.stdout, done.stdout[-3000:]


def test_skips_stay_skips_outside_ci(tmp_path):
    done = _run(tmp_path, "")
    assert done.returncode == 0 and "1 passed, 2 skipped" in done.stdout, done.stdout[-3000:]


def test_a_skip_fails_under_ci_in_two_workers_as_make_test_runs_them(tmp_path):
    """make test TEST_WORKERS=2 runs pytest-xdist's workers: the skip becomes a failure in the worker, and the controller, which
    writes the summary, still sees it as one, and still sums up the hardware skips."""
    done = _run(tmp_path, "true", SUITE, "-n", "2")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout[-3000:]
    assert "skipped under CI=true: the server is not installed" in done.stdout
    assert "hardware skips: 1 test(s) need a feature this CPU lacks (" in done.stdout



def _module(prefix: str, machine: bool = False) -> str:
    """A test module of four tests that each write their name and worker to ran.txt."""
    return textwrap.dedent(f"""
        import os, time
        import pytest
        {"pytestmark = pytest.mark.machine" if machine else ""}

        @pytest.mark.parametrize("i", range(4))
        def test_one(i):
            with open(os.path.join(os.path.dirname(__file__), "ran.txt"), "a") as f:
                f.write(f"{prefix} {{os.environ['PYTEST_XDIST_WORKER']}}" + chr(10))
            time.sleep(0.3)
    """)


def _grouped_suite(tmp_path, listed: tuple[str, ...]) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmachine_modules =\n" + "".join(f"    {m}\n" for m in listed))
    for prefix, machine in (("a", False), ("b", False), ("c", False), ("m1", True), ("m2", True)):
        (tmp_path / f"test_{prefix}.py").write_text(_module(prefix, machine))


def _pytest(tmp_path, *args: str, ci: str = ""):
    """A fresh pytest on the throwaway suite in ``tmp_path`` (``CI`` set to ``ci``)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(tmp_path)],
                          env=dict(os.environ, PYTHONPATH=ROOT, CI=ci), cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=300)


def test_two_workers_keep_a_module_and_the_machine_group_together(tmp_path):
    """make test TEST_WORKERS=2's workers: every test of a module runs in one worker (its module fixtures are made once), and the
    modules that use the whole machine (pytest.ini's machine_modules) in one worker. Without the grouping,
    pytest-xdist spreads each module's tests over both workers (and its own --dist loadgroup does on pytest 9.2)."""
    _grouped_suite(tmp_path, ("test_m1.py", "test_m2.py"))
    done = _pytest(tmp_path, "-n", "2")
    assert done.returncode == 0 and "20 passed" in done.stdout, done.stdout[-3000:]
    ran = [line.split() for line in (tmp_path / "ran.txt").read_text().splitlines()]
    worker: dict[str, set[str]] = {}
    for prefix, gw in ran:
        worker.setdefault(prefix, set()).add(gw)
    assert len(ran) == 20 and all(len(gws) == 1 for gws in worker.values()), worker
    assert worker["m1"] == worker["m2"], worker
    assert {gw for gws in worker.values() for gw in gws} == {"gw0", "gw1"}, worker  # both workers had work


def test_a_module_that_uses_the_machine_must_be_listed(tmp_path):
    _grouped_suite(tmp_path, ("test_m1.py",))
    done = _pytest(tmp_path, "--collect-only")
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]
    assert "test_m2.py: uses what the whole machine shares" in done.stderr, done.stderr[-3000:]
