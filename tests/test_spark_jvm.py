"""The suite's driver JVMs start as :mod:`tests.spark_jvm` sets them up: with the suite's Spark settings
(``tests/spark-conf/spark-defaults.conf``) and with the class-data archive of Spark's classes mapped."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests import spark_jvm
from tests.console_checks import user_env

pytestmark = [pytest.mark.spark]

# A user's plain program: its driver JVM reports its own process's mappings, command line and settings.
PROGRAM = textwrap.dedent("""
    import json
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[1]").getOrCreate()
    assert spark.range(10).count() == 10
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    with open(f"/proc/{pid}/maps") as f:
        maps = [line.split()[-1] for line in f if len(line.split()) > 5]
    with open(f"/proc/{pid}/cmdline") as f:
        cmdline = f.read().split("\\0")
    daemon = spark.conf.get("spark.python.daemon.module", None)
    print(json.dumps({"maps": maps, "cmdline": cmdline, "daemon": daemon}))
    spark.stop()
""")


def test_a_driver_jvm_of_the_suite_maps_the_archive_with_the_suites_settings():
    path = spark_jvm.archive_path()
    assert path, "no Java for Spark"
    deadline = time.monotonic() + spark_jvm.DUMP_TIMEOUT_S
    while not os.path.exists(path) and time.monotonic() < deadline:  # this run's dump may still be running
        time.sleep(1)
    log = os.path.join(spark_jvm.ARCHIVE_DIR, "dump.log")
    if not os.path.exists(path):
        with open(log) if os.path.exists(log) else open(os.devnull) as f:
            pytest.fail(f"no class-data archive after {spark_jvm.DUMP_TIMEOUT_S:.0f} s; dump.log: {f.read()[-2000:]}")
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=user_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert path in found["maps"], f"{path} is not mapped: {sorted(set(m for m in found['maps'] if '.jsa' in m))}"
    assert "-XX:TieredStopAtLevel=1" in found["cmdline"], found["cmdline"]  # the suite's settings are in force
    assert found["daemon"] == "optim.spark.worker_daemon"
    assert "[cds" not in done.stderr and ",cds" not in done.stderr, done.stderr[-3000:]  # the JVM said nothing of it
