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
    env = dict(os.environ, PYTHONPATH=ROOT, CI=ci)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args, str(tmp_path)],
                          env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)


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
    """make test runs pytest-xdist's workers: the skip becomes a failure in the worker, and the controller, which
    writes the summary, still sees it as one, and still sums up the hardware skips."""
    done = _run(tmp_path, "true", SUITE, "-n", "2", "--dist", "loadgroup")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout[-3000:]
    assert "skipped under CI=true: the server is not installed" in done.stdout
    assert "hardware skips: 1 test(s) need a feature this CPU lacks (" in done.stdout
