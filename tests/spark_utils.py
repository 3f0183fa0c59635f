"""Starting a real local[2] Spark for tests."""

from __future__ import annotations

import os
import sys
import tempfile


def local_spark(cores: int = 2):

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="tfnet-spark-")
    from optim.spark.session import build_session

    return build_session("tfnet-tests", f"local[{cores}]", {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.local.dir": tmp,
        "spark.sql.warehouse.dir": os.path.join(tmp, "warehouse"),
        "spark.driver.host": "127.0.0.1",
        "spark.python.worker.reuse": "true",
        "spark.driver.memory": "3g",
    })
