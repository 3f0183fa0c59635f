"""No TensorFlow banner whatever the import order (issue 33, point 9): with tfnet installed (its
``tfnet-quiet.pth`` at the top of site-packages), ``import keras`` or ``import tensorflow`` before
``import tfnet`` prints nothing; ``TFNET_VERBOSE=1`` brings the banner back, which shows the test
would see it. Fresh interpreters, as a user's script starts."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BANNER = ("oneDNN custom operations", "absl::InitializeLog", "cpu_feature_guard", "To enable the following instructions")


def run(tmp_path, code: str, **env_extra) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose site-packages holds tfnet's .pth (``site.addsitedir``
    processes it as start-up does for site-packages)."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(os.path.join(ROOT, "tfnet-quiet.pth"), site_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TFNET_VERBOSE")}
    env.update(PYTHONPATH=ROOT, TF_ENABLE_ONEDNN_OPTS="1", **env_extra)
    prelude = f"import site; site.addsitedir({str(site_dir)!r}); "
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=300,
                          env=env, cwd=str(tmp_path))


@pytest.mark.parametrize("first", ["keras", "tensorflow"])
def test_no_banner_when_another_library_imports_tensorflow_first(tmp_path, first):
    proc = run(tmp_path, f"import {first}; import tfnet; import keras; print('ready', tfnet.TFNet.__name__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ready TFNet"
    assert not [line for line in proc.stderr.splitlines() if any(b in line for b in BANNER)], proc.stderr


def test_the_banner_comes_back_when_asked_for(tmp_path):
    proc = run(tmp_path, "import keras; import tfnet", TFNET_VERBOSE="1")
    assert proc.returncode == 0, proc.stderr
    assert any("oneDNN custom operations" in line for line in proc.stderr.splitlines()), proc.stderr


def test_only_the_known_start_up_lines_are_dropped(tmp_path):
    code = ("import os, _tfnet_quiet\n"
            "with _tfnet_quiet.filtered_stderr():\n"
            "    os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on.\\nkept: a real warning\\n')\n")
    proc = run(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["kept: a real warning"], proc.stderr
