"""Under CI=true no test skips silently (issue 53): tests/conftest.py turns a skip into a failure unless its reason is
a hardware feature this CPU lacks, and sums those up in one line with the CPU. Run on a throwaway suite in a fresh
pytest, with and without CI=true."""

import os
import subprocess
import sys
import textwrap

from tests.conftest import environ_without_the_lane

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The throwaway pytests start as make test does, without the one-core lane's thread settings (this module runs there)
ENVIRON = environ_without_the_lane()

SUITE = textwrap.dedent("""
    import pytest

    def test_needs_a_server():
        pytest.skip("the server is not installed")

    @pytest.mark.skipif(True, reason="this CPU has no native bfloat16")
    def test_needs_bf16():
        pass

    def test_plain(summary_line):
        summary_line("the plain test says this at the end")
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
    assert done.stdout.count("\nthe plain test says this at the end\n") == 1, done.stdout[-3000:]


def test_a_module_that_skips_fails_under_ci(tmp_path):
    done = _run(tmp_path, "true", "import pytest\npytest.importorskip('no_such_module_here')\n")
    assert done.returncode != 0 and "skipped under CI=true" in done.stdout, done.stdout[-3000:]


def test_skips_stay_skips_outside_ci(tmp_path):
    done = _run(tmp_path, "")
    assert done.returncode == 0 and "1 passed, 2 skipped" in done.stdout, done.stdout[-3000:]


def test_a_skip_fails_under_ci_in_two_workers_as_make_test_runs_them(tmp_path):
    """make test runs pytest-xdist's workers: the skip becomes a failure in the worker, and the controller, which
    writes the summary, still sees it as one, sums up the hardware skips and writes the tests' summary lines (a
    worker's own prints are not shown)."""
    done = _run(tmp_path, "true", SUITE, "-n", "2")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout[-3000:]
    assert "skipped under CI=true: the server is not installed" in done.stdout
    assert "hardware skips: 1 test(s) need a feature this CPU lacks (" in done.stdout
    assert done.stdout.count("\nthe plain test says this at the end\n") == 1, done.stdout[-3000:]


def _module(prefix: str, machine: bool = False) -> str:
    """A test module of four tests that each write their name, worker and TensorFlow's thread setting to ran.txt."""
    return textwrap.dedent(f"""
        import os, time
        import pytest
        {"pytestmark = pytest.mark.machine" if machine else ""}

        @pytest.mark.parametrize("i", range(4))
        def test_one(i):
            with open(os.path.join(os.path.dirname(__file__), "ran.txt"), "a") as f:
                threads = os.environ.get("TF_NUM_INTRAOP_THREADS", "-") + os.environ.get("TF_NUM_INTEROP_THREADS", "-")
                f.write(f"{prefix} {{os.environ.get('PYTEST_XDIST_WORKER', 'none')}} {{threads}}" + chr(10))
            time.sleep(0.3)
    """)


def _laned_suite(tmp_path, listed: tuple[str, ...], beside: tuple[str, ...] = ()) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\none_core_modules =\n" + "".join(f"    {m}\n" for m in listed)
                                         + "beside_modules =\n" + "".join(f"    {m}\n" for m in beside))
    for prefix, machine in (("a", False), ("b", False), ("c", False), ("m1", True), ("m2", True)):
        (tmp_path / f"test_{prefix}.py").write_text(_module(prefix, machine))


def _pytest(tmp_path, *args: str, ci: str = ""):
    """A fresh pytest on the throwaway suite in ``tmp_path`` (``CI`` set to ``ci``)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(tmp_path)],
                          env=dict(ENVIRON, PYTHONPATH=ROOT, CI=ci), cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=300)


def _ran(tmp_path) -> list[tuple[str, str, str]]:
    return [tuple(line.split()) for line in (tmp_path / "ran.txt").read_text().splitlines()]


def test_two_workers_are_two_lanes_the_one_core_modules_beside_the_rest_in_order(tmp_path):
    """make test's workers: the first runs every module but pytest.ini's one_core_modules, one test after another in
    collection order (the machine's modules among them, never side by side); the second runs the listed ones with
    TensorFlow at one thread. pytest-xdist's own scheduling spreads the tests over both workers, machine's included."""
    _laned_suite(tmp_path, ("test_a.py", "test_b.py"))
    done = _pytest(tmp_path, "-n", "2")
    assert done.returncode == 0 and "20 passed" in done.stdout, done.stdout[-3000:]
    ran = _ran(tmp_path)
    assert sorted(ran) == sorted([(p, "gw1", "11") for p in ("a", "b") for _ in range(4)]
                                 + [(p, "gw0", "--") for p in ("c", "m1", "m2") for _ in range(4)]), ran
    assert [p for p, gw, _ in ran if gw == "gw0"] == ["c"] * 4 + ["m1"] * 4 + ["m2"] * 4, ran


def test_the_second_worker_runs_the_beside_modules_after_the_one_core_ones(tmp_path):
    """pytest.ini's beside_modules go to the second worker, after its one_core_modules (TensorFlow still at one
    thread), every run the same; the first keeps the rest, the machine's modules among them."""
    _laned_suite(tmp_path, ("test_b.py",), beside=("test_a.py",))
    done = _pytest(tmp_path, "-n", "2")
    assert done.returncode == 0 and "20 passed" in done.stdout, done.stdout[-3000:]
    ran = _ran(tmp_path)
    assert [(p, t) for p, gw, t in ran if gw == "gw1"] == [("b", "11")] * 4 + [("a", "11")] * 4, ran
    assert [p for p, gw, _ in ran if gw == "gw0"] == ["c"] * 4 + ["m1"] * 4 + ["m2"] * 4, ran


def test_a_beside_module_must_not_use_the_machine(tmp_path):
    _laned_suite(tmp_path, ("test_a.py",), beside=("test_b.py", "test_m1.py"))
    done = _pytest(tmp_path, "--collect-only")
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]
    assert "test_m1.py: in pytest.ini's beside_modules, but uses what the whole machine shares" in done.stderr


def test_one_worker_runs_every_lane(tmp_path):
    """With one worker (or where the second worker is gone) its lanes wait for no one: the first takes them."""
    _laned_suite(tmp_path, ("test_a.py",), beside=("test_b.py",))
    done = _pytest(tmp_path, "-n", "1")
    assert done.returncode == 0 and "20 passed" in done.stdout, done.stdout[-3000:]
    assert {gw for _, gw, _ in _ran(tmp_path)} == {"gw0"}


def test_a_one_core_module_must_not_use_the_machine(tmp_path):
    _laned_suite(tmp_path, ("test_a.py", "test_m2.py"))
    done = _pytest(tmp_path, "--collect-only")
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]
    assert "test_m2.py: in pytest.ini's one_core_modules, but starts Spark" in done.stderr, done.stderr[-3000:]
