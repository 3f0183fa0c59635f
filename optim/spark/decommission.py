"""Whether executors that run the training stage's tasks are being decommissioned. Driver side (a classic
session).

With ``spark.decommission.enabled`` (a spot reclaim, a scale-down, ``kill -PWR`` of a standalone worker, a
Kubernetes pod deleted through Spark's decommission script), the driver's scheduler learns that an executor is
going before it goes: it stops giving it tasks and lets the running ones go on until the executor is killed. tfnet
asks the scheduler about the executors that run tasks now (:func:`decommissioning_tasks`), and the launcher turns a
notice into a planned shrink: the ranks checkpoint at the next step and the run goes on without that executor.
A local master has no executors to lose, and a Spark Connect client no scheduler to ask: there a decommissioned
executor is a lost one (a retry from the newest checkpoint).
"""

from __future__ import annotations

import logging

from optim.spark.conf import setting

__all__ = ["decommission_enabled", "decommissioning_tasks"]

log = logging.getLogger("tfnet.spark")


def decommission_enabled(sc) -> bool:
    """Whether ``sc``'s application takes decommission notices (``spark.decommission.enabled``, not on a local
    master)."""
    if sc.master.startswith("local"):
        return False
    return str(setting(sc, "spark.decommission.enabled", "false")).strip().lower() == "true"


def decommissioning_tasks(sc) -> int:
    """The running tasks on executors that the scheduler knows are being decommissioned (0 when none, or when
    the scheduler cannot be asked). Asks the driver's JVM through Py4J: the task scheduler's running tasks by
    executor, and each executor's decommission state."""
    try:
        scheduler = sc._jsc.sc().taskScheduler()
        running = scheduler.runningTasksByExecutors()
        found = 0
        entries = running.iterator()
        while entries.hasNext():
            entry = entries.next()
            if scheduler.getExecutorDecommissionState(entry._1()).isDefined():
                found += int(entry._2())
        return found
    except Exception as exc:  # noqa: BLE001 - a JVM without these methods, or one shutting down
        log.debug("Cannot ask the scheduler about decommissioned executors: %s", exc)
        return 0
