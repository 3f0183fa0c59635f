"""Starting a real local[2] Spark for tests."""

from __future__ import annotations

import os
import sys
import tempfile


def local_spark(cores: int = 2):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="tfnet-spark-")
    return (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("tfnet-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.local.dir", tmp)
        .config("spark.sql.warehouse.dir", os.path.join(tmp, "warehouse"))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "3g")
        .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .config("spark.executorEnv.TF_ENABLE_ONEDNN_OPTS", os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"))
        .getOrCreate()
    )
