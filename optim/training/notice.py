"""A notice that the ranks must stop at the next step boundary (an executor holding a rank is being
decommissioned: a spot reclaim, a scale-down). Runs on every rank.

Rank 0 asks its ``check`` (the driver's control file, :mod:`optim.rank.rank`) about once every
``every_s`` seconds; every rank learns the answer at the same global step, so that all of them checkpoint and stop
at the same boundary. The question costs one small broadcast per check, not per step: rank 0 sends, with the
answer, the step of the next question, from the step time it measured.

>>> from optim.training.collective import LocalCollective
>>> notice = StepNotice(lambda: True, LocalCollective(), start_step=0)
>>> notice.due(1)
True
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["NOTICE_EVERY_S", "StepNotice"]

#: About how often rank 0 asks whether the ranks must stop (seconds of training between two questions).
NOTICE_EVERY_S = 1.0

#: The most steps between two questions, however fast the steps are.
MOST_STEPS_BETWEEN = 1000


class StepNotice:
    """``due(step)``, asked by every rank after each step: True (on every rank at once) when rank 0's ``check``
    said the ranks must stop. ``check`` None: never due, and no collective is ever run."""

    def __init__(self, check: Callable[[], bool] | None, collective, start_step: int,
                 every_s: float | None = None):
        self.check, self.collective = check, collective
        self.every_s = float(NOTICE_EVERY_S if every_s is None else every_s)
        self.next_step = int(start_step) + 1
        self.asked_at = (int(start_step), time.perf_counter())

    def due(self, step: int) -> bool:
        if self.check is None or step < self.next_step:
            return False
        mine = {}
        if self.collective.is_chief:
            last_step, last_t = self.asked_at
            now = time.perf_counter()
            per_step = (now - last_t) / max(step - last_step, 1)
            gap = int(min(MOST_STEPS_BETWEEN, max(1, self.every_s / max(per_step, 1e-9))))
            self.asked_at = (step, now)
            mine = {"stop": bool(self.check()), "next": step + gap}
        decided = self.collective.broadcast_json(mine)
        self.next_step = int(decided["next"])
        return bool(decided["stop"])
