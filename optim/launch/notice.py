"""A decommission notice as the driver sees it while the training stage runs. Driver side.

When an executor that runs a rank is being decommissioned (:mod:`optim.spark.decommission`), Spark stops counting
its slots at once, though its task goes on until the executor is killed. The launcher's watch of lost slots would
end the stage then, and the run would retry from its newest checkpoint, doing again every step since. Instead,
:meth:`DecommissionNotice.watch` writes the notice file that asks the ranks to checkpoint and stop at the next step
(:mod:`optim.training.notice`), and the launcher goes on from that checkpoint with the ranks that stay: a planned
shrink, not a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tfnet import storage

__all__ = ["DecommissionNotice"]


class DecommissionNotice:
    """The notice file ``path`` of one run (``options``: its storage options) and what the watch has seen:
    ``leaving``, the ranks on executors being decommissioned (0 until a notice). ``tell`` says it to the user."""

    def __init__(self, backend, path: str, options=None, tell: Callable[[str], None] = print):
        self.backend, self.path, self.options, self.tell = backend, path, options, tell
        self.leaving = 0

    def watch(self, ranks: int, lost: Callable[[], str | None] | None, sink, every_s: float):
        """``lost`` (the check for lost slots), after a check for decommissioning executors, every ``every_s``
        seconds and whenever slots are lost (a decommissioning executor's are no longer counted). The first
        notice writes the file and is never a reason to end the stage: the ranks end it themselves. ``sink``: the
        progress events (the step the notice came at is said)."""
        last = [time.monotonic()]

        def check() -> str | None:
            if self.leaving:
                return None
            why = lost() if lost is not None else None
            if why is None and time.monotonic() - last[0] < every_s:
                return None
            last[0] = time.monotonic()
            leaving = self.backend.decommissioning_tasks()
            if not leaving:
                return why
            self.leaving = min(leaving, ranks)
            steps = [e["step"] for e in sink.events if e.get("event") == "step"]
            self.tell(f"An executor running {self.leaving} of the {ranks} rank(s) is being decommissioned (at step "
                      f"{steps[-1] if steps else 0}): the ranks checkpoint at the next step and the run goes on "
                      "without it.")
            storage.write_bytes_atomic(self.path, b"decommission", self.options)
            return None

        return check

    def withdraw(self) -> None:
        """After the ranks stopped (and at the end of the run): no notice pending."""
        self.leaving = 0
        if storage.exists(self.path, self.options):
            storage.remove(self.path, self.options)
