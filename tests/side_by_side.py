"""Fresh interpreters run side by side: a test module whose tests each need a new Python (each pays TensorFlow's
import, 3-5 s on 2 cores) starts all of them as it begins, as many at a time as the machine has cores, and each test
waits for its own. The module then takes about its interpreters' summed time divided by the cores, not the sum."""

import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor


class SideBySide:
    """Named ``subprocess.run`` calls (text, output captured), started at once on a pool of ``os.cpu_count()``
    threads; :meth:`result` waits for one.

    Each call gets its environment as a copy taken when it is started (``env=``, or ``os.environ`` then): a pool thread
    that spawned with the inherited one would run ``execve`` over the C ``environ`` array while this process's main
    thread changes it (pytest sets and unsets ``PYTEST_CURRENT_TEST`` around every phase, and glibc reallocates the
    array), and the child's ``execve`` then failed with ``OSError: [Errno 14] Bad address`` (once in a suite run)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
        self._runs: dict[str, Future] = {}

    def start(self, name: str, argv: list[str], **kwargs) -> None:
        env = kwargs.pop("env", None)
        env = dict(os.environ if env is None else env)
        self._runs[name] = self._pool.submit(subprocess.run, argv, capture_output=True, text=True, env=env, **kwargs)

    def done(self, name: str) -> bool:
        return self._runs[name].done()

    def result(self, name: str) -> subprocess.CompletedProcess:
        return self._runs[name].result()  # subprocess.run's own timeout (kwargs) bounds the wait

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
