"""The standalone cluster the cluster tests share (``tests/optim/spark/test_cluster.py`` and ``test_elastic.py``), a
pytest plugin (``tests/conftest.py`` loads it): one master and two one-core workers with decommission on, started
once for the session (a start is a master and two worker JVMs: seconds of the suite's time) and stopped after the last
test that asks for it, whichever file and order run.

Each test asks for ``cluster``: the shared one, back to two live workers with their cores free and no application
running (:meth:`tests.cluster.StandaloneCluster.free_workers`); a test takes away only workers it added or the newest
(:meth:`~tests.cluster.StandaloneCluster.newest`), and the next one's ``cluster`` replaces them.
"""

from __future__ import annotations

import pytest

from tests.cluster import StandaloneCluster

_started: list[StandaloneCluster] = []


@pytest.fixture(scope="session")
def standalone_cluster():
    """The session's cluster, as it is (the test before may have left it with a worker fewer)."""
    with StandaloneCluster(workers=2, cores=1, decommission=True) as c:
        _started.append(c)
        yield c
        if c in _started:
            _started.remove(c)


@pytest.fixture
def cluster(standalone_cluster):
    """The session's cluster with two free workers (what each cluster test starts from)."""
    standalone_cluster.free_workers(2)
    return standalone_cluster


def pytest_runtest_teardown(item, nextitem):
    """After the last test that uses the cluster, it stops (not at the session's end: the suite's other files run
    without its JVMs)."""
    if not _started or nextitem is None:
        return  # none running, or the session's end stops it
    items = item.session.items
    after = items[items.index(nextitem):] if nextitem in items else []
    if not any("standalone_cluster" in getattr(i, "fixturenames", ()) for i in after):
        _started.pop().stop()
