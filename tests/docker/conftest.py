"""The Docker tier's set-up: a working engine (scripts/docker_env.sh starts one, and installs it when
missing), the image built from a clean clone, and one compose cluster shared by the cluster tests.

In CI (``CI=true``) nothing here skips: an engine that cannot be started fails the tier. Elsewhere the
tier skips, with the reason, only when Docker truly cannot run (no root to install or start it, or no
engine that answers).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.docker.compose import ROOT, Compose, build_image, clean_clone, in_ci

IMAGE = os.environ.get("TFNET_TEST_IMAGE", "tfnet:latest")


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine that answers, with Compose and the base image (scripts/docker_env.sh)."""
    try:
        proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "docker_env.sh")], capture_output=True,
                              text=True, timeout=900, check=False)
        reason = None if proc.returncode == 0 else f"scripts/docker_env.sh exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
    except subprocess.TimeoutExpired:
        reason = "scripts/docker_env.sh did not finish within 900 s"
    if reason:
        if in_ci():
            pytest.fail(f"Docker tier: no working Docker engine in CI. {reason}")
        pytest.skip(f"DOCKER TIER SKIPPED: Docker cannot run on this machine. {reason}")


@pytest.fixture(scope="session")
def image_build(docker_engine, tmp_path_factory) -> dict:
    """The image, built by scripts/docker_build.sh from a clean clone of this repository (the base
    image, the wheelhouse and Docker's layer cache are reused from earlier runs on this machine)."""
    clone = clean_clone(str(tmp_path_factory.mktemp("clone") / "tfnet"))
    log = str(tmp_path_factory.mktemp("build") / "docker_build.log")
    seconds = build_image(clone, IMAGE, log)
    return {"image": IMAGE, "seconds": seconds, "log": log}


@pytest.fixture(scope="module")
def cluster(image_build):
    """A master and 2 workers (1 core, 3 GB each) of the image, up and healthy; removed with
    ``down -v`` at the end of the module."""
    compose = Compose(image_build["image"], worker_cores=1, worker_memory="3g")
    try:
        compose.up()
        yield compose
    finally:
        compose.down()
