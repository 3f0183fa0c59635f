"""Whether a classic session runs with dynamic allocation, and what it can grow to. Driver side.

With dynamic allocation on (EMR's and Dataproc's default), Spark refuses a barrier stage (SPARK-24942) and a
cluster may have no executor at all until tasks are pending. tfnet's training stage then runs without barrier mode
(:mod:`optim.rank.gang`), and the slots it plans with are what the allocation may grow to, not what is
registered now.
"""

from __future__ import annotations

from dataclasses import dataclass

from optim.spark.conf import setting

__all__ = ["DynamicAllocation", "dynamic_allocation"]


@dataclass(frozen=True)
class DynamicAllocation:
    """The session's dynamic-allocation bounds: executors from ``min_executors`` to ``max_executors`` (None: no
    bound), ``cores`` task slots each."""

    min_executors: int
    max_executors: int | None
    cores: int

    def capacity(self) -> int | None:
        """The most tasks the allocation can run at once (None: no bound set)."""
        return None if self.max_executors is None else self.max_executors * self.cores

    def slots_for(self, n: int) -> int:
        """The slots a stage of ``n`` tasks plans with: its pending tasks bring the executors, up to the bound."""
        most = self.capacity()
        return n if most is None else min(n, most)

    def free_slots(self, wanted: int, running: int) -> int:
        """The slots the allocation may add beside ``running`` tasks, counted up to ``wanted``."""
        most = self.capacity()
        return wanted if most is None else max(0, min(wanted, most - running))


def _int(value: str | None, default: int) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def dynamic_allocation(sc) -> DynamicAllocation | None:
    """The bounds of ``sc``'s dynamic allocation, or None when it is off. As Spark's own
    ``Utils.isDynamicAllocationEnabled``: on when ``spark.dynamicAllocation.enabled`` is true, except on a local
    master (unless ``spark.dynamicAllocation.testing`` is set)."""
    if str(setting(sc, "spark.dynamicAllocation.enabled", "false")).strip().lower() != "true":
        return None
    master = str(setting(sc, "spark.master", "") or "")
    testing = str(setting(sc, "spark.dynamicAllocation.testing", "false")).strip().lower() == "true"
    if master.startswith("local") and not testing:
        return None
    most = _int(setting(sc, "spark.dynamicAllocation.maxExecutors"), 2 ** 31 - 1)
    task_cpus = max(1, _int(setting(sc, "spark.task.cpus"), 1))
    cores = max(1, _int(setting(sc, "spark.executor.cores"), 1) // task_cpus)
    return DynamicAllocation(min_executors=_int(setting(sc, "spark.dynamicAllocation.minExecutors"), 0),
                             max_executors=None if most >= 2 ** 31 - 1 else most, cores=cores)
