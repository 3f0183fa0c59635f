"""How often the driver and the ranks check on the cluster during a training stage: the Spark settings that change it,
and their defaults (docs/clusters.md, "How often the driver checks the cluster"). Driver side."""

from __future__ import annotations

from dataclasses import dataclass

from optim.spark.conf import seconds_setting
from optim.training.notice import NOTICE_EVERY_S

__all__ = ["GROW_CHECK_KEY", "GROW_CHECK_S", "NOTICE_CHECK_KEY", "SLOT_CHECK_KEY", "SLOT_CHECK_S", "Intervals"]

#: Seconds between the checks for returned slots while an elastic run has fewer ranks than it asked for (the Spark
#: setting :data:`GROW_CHECK_KEY` changes it).
GROW_CHECK_S = 5.0
GROW_CHECK_KEY = "spark.tfnet.elastic.growCheckInterval"
#: Seconds between the checks that the cluster still has the slots a running stage needs, and for decommission
#: notices (the Spark setting :data:`SLOT_CHECK_KEY` changes it).
SLOT_CHECK_S = 2.0
SLOT_CHECK_KEY = "spark.tfnet.slotCheckInterval"
#: About how often the ranks ask, at step boundaries, whether a decommission notice came (seconds of training between
#: two questions, :data:`~optim.training.notice.NOTICE_EVERY_S` by default; "1ms": about every step).
NOTICE_CHECK_KEY = "spark.tfnet.noticeCheckInterval"


@dataclass
class Intervals:
    """The seconds between checks: for returned slots (``grow_s``), for lost slots and notices on the driver
    (``slot_s``), and for a notice on the ranks (``notice_s``)."""

    grow_s: float = GROW_CHECK_S
    slot_s: float = SLOT_CHECK_S
    notice_s: float = NOTICE_EVERY_S

    @classmethod
    def of(cls, spark) -> Intervals:
        """The session's settings (each a Spark time setting; unset: the default).

        Raises:
            ValueError: a setting that is not a positive time.
        """
        return cls(seconds_setting(spark, GROW_CHECK_KEY, GROW_CHECK_S),
                   seconds_setting(spark, SLOT_CHECK_KEY, SLOT_CHECK_S),
                   seconds_setting(spark, NOTICE_CHECK_KEY, NOTICE_EVERY_S))
