"""Getting a Spark session, with clear errors when Java or Spark is missing. Driver side."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tfnet.errors import TFNetError


class SparkSetupError(TFNetError, RuntimeError):
    """Spark cannot start here (no Java, or a Java older than 17), or its workers cannot run tfnet."""


def java_version() -> int | None:
    """The major version of the ``java`` Spark would use (JAVA_HOME first), or None if none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stderr + out.stdout
    import re

    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def require_java() -> None:
    version = java_version()
    if version is None:
        raise SparkSetupError(
            "Spark needs Java 17 or newer, and no `java` was found (JAVA_HOME is "
            f"{os.environ.get('JAVA_HOME')!r}). Install it, e.g. `sudo apt-get install -y "
            "openjdk-17-jre-headless`, or set JAVA_HOME."
        )
    if version < 17:
        raise SparkSetupError(f"Spark 4 needs Java 17 or newer; found Java {version}. Install Java 17 or set JAVA_HOME.")


def get_spark(create: bool = True):
    """The active SparkSession, or a new local one (``local[*]``) when ``create`` is True.

    Raises:
        SparkSetupError: no session is active and Java is missing or too old.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None or not create:
        return active
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.appName("tfnet")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.TF_ENABLE_ONEDNN_OPTS", os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"))
        .getOrCreate()
    )
