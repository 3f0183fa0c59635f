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


def kill_rank_after_checkpoints(model_dir, checkpoints: int, rank: int = 1, deadline_s: float = 240.0) -> dict:
    """From a thread: kills ``rank``'s Python process (SIGKILL) once ``model_dir`` (a local folder)
    holds ``checkpoints`` checkpoints and the rank's ``rank-N.json``, that is mid-training. Returns a
    dict that gets ``pid``, ``after`` (the newest checkpoint then) and has ``thread``."""
    import glob
    import json
    import signal
    import threading
    import time

    killed: dict = {}

    def killer():
        deadline = time.time() + deadline_s
        while time.time() < deadline and "pid" not in killed:
            ckpts = glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz"))
            infos = glob.glob(os.path.join(model_dir, "ranks", "*", f"rank-{rank}.json"))
            if len(ckpts) >= checkpoints and infos:
                with open(infos[0]) as f:
                    pid = json.load(f)["pid"]
                os.kill(pid, signal.SIGKILL)
                killed["after"] = sorted(ckpts)[-1]
                killed["pid"] = pid
            time.sleep(0.05)

    killed["thread"] = threading.Thread(target=killer, daemon=True)
    killed["thread"].start()
    return killed
