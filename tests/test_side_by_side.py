"""The suite's own helper for fresh interpreters side by side (:mod:`tests.side_by_side`): its pool threads spawn
while the main thread changes the environment, as pytest does around every phase."""

import os
import sys

from tests.side_by_side import SideBySide


def test_runs_started_while_the_environment_changes_all_start():
    """pytest sets and unsets ``PYTEST_CURRENT_TEST`` around each phase while a module's interpreters are still being
    spawned; a spawn over the C ``environ`` array that is being reallocated failed with ``OSError: [Errno 14] Bad
    address`` (about one spawn in five under this churn when each inherited the environment)."""
    runs, current = SideBySide(), os.environ.get("PYTEST_CURRENT_TEST")
    try:
        os.environ["TFNET_SIDE_BY_SIDE"] = "seen"
        names = [f"run{i}" for i in range(40)]
        for name in names:
            runs.start(name, [sys.executable, "-S", "-c", "import os; print(os.environ['TFNET_SIDE_BY_SIDE'])"],
                       timeout=60)
        pending, churned = set(names), 0
        while pending:  # what pytest does to the environment, as fast as it can, until every run has ended
            os.environ["PYTEST_CURRENT_TEST"] = "x" * (churned % 300)
            del os.environ["PYTEST_CURRENT_TEST"]
            churned += 1
            if churned % 1000 == 0:
                pending = {name for name in pending if not runs.done(name)}
        outs = [runs.result(name) for name in names]  # raises the OSError of a run that could not start
        assert [(p.returncode, p.stdout) for p in outs] == [(0, "seen\n")] * len(names), outs
    finally:
        os.environ.pop("TFNET_SIDE_BY_SIDE", None)
        if current is not None:
            os.environ["PYTEST_CURRENT_TEST"] = current
        runs.close()
