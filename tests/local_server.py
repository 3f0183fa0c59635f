"""What the tests' local servers (moto's S3, gcp-storage-emulator, Azurite) share: a separate process on loopback,
its output in a log in the test's folder, its endpoint found once it listens (within ``start_s``), and stopped on
every way out."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable

__all__ = ["LocalServer", "in_log"]


def in_log(pattern: str) -> Callable[[LocalServer], str | None]:
    """An endpoint finder: the first group of ``pattern`` in the server's log, once it is there."""

    def find(server: LocalServer) -> str | None:
        with open(server.log, errors="replace") as f:
            found = re.search(pattern, f.read())
        return found.group(1) if found else None

    return find


class LocalServer:
    """A server process of a test: :meth:`launch` starts it, :meth:`wait_for_endpoint` polls ``find(self)`` until it
    gives the endpoint (the process ended, or ``start_s`` passed: a RuntimeError with the log's tail), and leaving
    the ``with`` block (or :meth:`__exit__`) stops it."""

    #: the server's name in errors
    name = "server"

    def __init__(self, folder, start_s: float = 60.0):
        self.folder, self.start_s = str(folder), start_s
        self.proc = None
        self._out = None
        self.endpoint = ""
        self.log = ""

    def launch(self, cmd: list[str], log_name: str) -> None:
        self.log = os.path.join(self.folder, log_name)
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT)

    def wait_for_endpoint(self, find: Callable[[LocalServer], str | None]) -> None:
        deadline = time.monotonic() + self.start_s
        while not self.endpoint:
            found = find(self)
            if found:
                self.endpoint = found
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {open(self.log, errors='replace').read()[-2000:]}")
            else:
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._out is not None:
            self._out.close()
