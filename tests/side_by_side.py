"""Fresh interpreters run side by side: a test module whose tests each need a new Python (each pays TensorFlow's
import, 3-5 s on 2 cores) starts all of them as it begins, as many at a time as the machine has cores, and each test
waits for its own. The module then takes about its interpreters' summed time divided by the cores, not the sum."""

import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor


class SideBySide:
    """Named ``subprocess.run`` calls (text, output captured), started at once on a pool of ``os.cpu_count()``
    threads; :meth:`result` waits for one."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
        self._runs: dict[str, Future] = {}

    def start(self, name: str, argv: list[str], **kwargs) -> None:
        self._runs[name] = self._pool.submit(subprocess.run, argv, capture_output=True, text=True, **kwargs)

    def result(self, name: str) -> subprocess.CompletedProcess:
        return self._runs[name].result()  # subprocess.run's own timeout (kwargs) bounds the wait

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
