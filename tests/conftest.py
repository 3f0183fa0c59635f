"""Shared test set-up. Tiers, selected with -m:

* unit: no Spark (TensorFlow only);
* spark: a real Spark (local[2], or a standalone master and workers);
* parallel: real Horovod ranks over Gloo;
* docker: the cluster image and a compose cluster on a real Docker engine (tests/docker/; set up by
  scripts/docker_env.sh, never skipped in CI).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# gcsfs 2026.3 and later ask the Storage Control API (gRPC over TLS) what kind each bucket is, before every
# operation, and retry for 60 s where it is not there: the GCS emulator of the tests (tests/gcs_server.py) has no
# such API. gcsfs reads this at import, so it is set before anything imports it; Spark's Python workers,
# started later, inherit it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: TensorFlow only, no Spark")
    config.addinivalue_line("markers", "spark: needs a real Spark (local[2] or standalone)")
    config.addinivalue_line("markers", "parallel: starts several Horovod ranks over Gloo")
    config.addinivalue_line("markers", "slow: takes more than about 20 seconds")
    config.addinivalue_line("markers", "docker: builds the cluster image and runs a compose cluster (Docker Engine)")


def pytest_collection_modifyitems(items):
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("spark", "parallel", "docker")):
            item.add_marker(pytest.mark.unit)


@pytest.fixture
def tmp_dir(tmp_path):
    return str(tmp_path)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs mounted for the test (a real full disk), unmounted after; skipped where this process
    may not mount one (it needs root, as CI has)."""
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="session")
def spark():
    """A real local[2] Spark, shared by the whole session (starting one takes seconds)."""
    from tests.spark_utils import local_spark

    session = local_spark(2)
    yield session
    session.stop()
