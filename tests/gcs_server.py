"""A real GCS server for tests: gcp-storage-emulator (PyPI), a separate process on loopback, listening on port 0
(the OS picks it; the emulator does not print it, so it is read from the process's listening socket), its data in
the test's folder, stopped on every way out. It runs through tests/gcs_emulator_exact.py, which keeps the last byte of
an upload that ends in ``\\r`` (the emulator's own parser drops it)."""

from __future__ import annotations

import os
import sys

from tests.local_server import LocalServer

__all__ = ["GCSEmulator", "missing"]


def missing() -> str | None:
    """Why the emulator or the client cannot run here, or None. `make` installs both (the ``test`` extra)."""
    for module, package in (("gcp_storage_emulator", "gcp-storage-emulator"), ("gcsfs", "gcsfs")):
        try:
            __import__(module)
        except ImportError:
            return f"{package} is not installed: run `make install` (it installs tfnet[test])"
    return None


def _listening_port(server: LocalServer) -> str | None:
    """The emulator's endpoint, once its process listens (it prints no port)."""
    import psutil

    try:
        ports = [c.laddr.port for c in psutil.Process(server.proc.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        ports = []
    return f"http://127.0.0.1:{ports[0]}" if ports else None


class GCSEmulator(LocalServer):
    """``with GCSEmulator(tmp_dir, bucket="tfnet") as gcs:`` a GCS server with ``bucket`` made; ``gcs.endpoint`` is
    its URL and ``gcs.options`` fsspec's (gcsfs's) ``storage_options`` for it (anonymous)."""

    name = "gcp-storage-emulator"

    def __init__(self, folder, bucket: str = "tfnet", start_s: float = 60.0):
        super().__init__(folder, start_s)
        self.bucket = bucket

    @property
    def options(self) -> dict:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "tfnet"}

    def __enter__(self) -> GCSEmulator:
        exact = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gcs_emulator_exact.py")
        self.launch([sys.executable, "-P", exact, "--data-dir", os.path.join(self.folder, "gcs-data"),
                     "start", "--host", "127.0.0.1", "--port", "0", "--default-bucket", self.bucket, "--quiet"],
                    "gcs-emulator.log")
        try:
            self.wait_for_endpoint(_listening_port)
        except BaseException:
            self.__exit__()
            raise
        return self
