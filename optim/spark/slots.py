"""How many tasks the cluster can run at once: a barrier stage needs one slot per rank. Driver side.

A classic session asks its SparkContext. A Spark Connect client cannot count slots; it reads a
``local[N]`` master, else it knows nothing (None) and the caller needs ``num_workers``.
"""

from __future__ import annotations

import time

from optim.spark.conf import setting
from optim.spark.connect import is_connect

__all__ = ["connect_slots", "task_slots", "wait_for_slots"]


def task_slots(sc) -> int:
    """Tasks a classic session's cluster can run at once (``sc``: a SparkContext)."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - py4j surface differs across versions
        return int(sc.defaultParallelism)


def connect_slots(spark) -> int | None:
    """The slots of a Connect session's ``local[N]`` master, else None (the client cannot count them)."""
    master = setting(spark, "spark.master", "") or ""
    if master.startswith("local["):
        inner = master[len("local["):].split(",")[0].rstrip("]")
        if inner.isdigit():
            return int(inner)
    return None


def wait_for_slots(sc, needed: int, wait_s: float) -> int:
    """The slots of ``sc``'s cluster, waiting up to ``wait_s`` seconds for ``needed`` of them
    (executors still registering). A Connect session answers at once (:func:`connect_slots`, or
    ``needed`` when it cannot tell)."""
    if is_connect(sc):
        known = connect_slots(sc)
        return needed if known is None else known
    deadline = time.monotonic() + wait_s
    slots = task_slots(sc)
    while slots < needed and time.monotonic() < deadline:
        time.sleep(1.0)
        slots = task_slots(sc)
    return slots
