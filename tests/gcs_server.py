"""A real GCS server for tests: gcp-storage-emulator (PyPI), a separate process on loopback, listening on port 0
(the OS picks it; the emulator does not print it, so it is read from the process's listening socket), its data in
the test's folder, stopped on every way out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

__all__ = ["GCSEmulator", "missing"]


def missing() -> str | None:
    """Why the emulator or the client cannot run here, or None. `make` installs both (the ``test`` extra)."""
    for module, package in (("gcp_storage_emulator", "gcp-storage-emulator"), ("gcsfs", "gcsfs")):
        try:
            __import__(module)
        except ImportError:
            return f"{package} is not installed: run `make install` (it installs tfnet[test])"
    return None


class GCSEmulator:
    """``with GCSEmulator(tmp_dir, bucket="tfnet") as gcs:`` a GCS server with ``bucket`` made; ``gcs.endpoint`` is
    its URL and ``gcs.options`` fsspec's (gcsfs's) ``storage_options`` for it (anonymous)."""

    def __init__(self, folder, bucket: str = "tfnet", start_s: float = 60.0):
        self.folder, self.bucket, self.start_s = str(folder), bucket, start_s
        self.proc = None
        self._out = None
        self.endpoint = ""

    @property
    def options(self) -> dict:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "tfnet"}

    def __enter__(self) -> GCSEmulator:
        import psutil

        log = os.path.join(self.folder, "gcs-emulator.log")
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "--data-dir", os.path.join(self.folder, "gcs-data"),
             "start", "--host", "127.0.0.1", "--port", "0", "--default-bucket", self.bucket, "--quiet"],
            stdout=self._out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + self.start_s
            while not self.endpoint:
                try:
                    ports = [c.laddr.port for c in psutil.Process(self.proc.pid).net_connections("tcp")
                             if c.status == psutil.CONN_LISTEN]
                except psutil.Error:
                    ports = []
                if ports:
                    self.endpoint = f"http://127.0.0.1:{ports[0]}"
                elif self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gcp-storage-emulator did not start: {open(log, errors='replace').read()[-2000:]}")
                else:
                    time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise
        return self

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
