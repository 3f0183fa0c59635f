"""A real S3 server for tests: moto in server mode, a separate process on loopback, its port chosen by the OS
and read back from its banner, stopped on every way out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

__all__ = ["MotoS3"]


class MotoS3:
    """``with MotoS3(tmp_dir, bucket="tfnet") as s3:`` a moto S3 server with ``bucket`` made; ``s3.endpoint`` is its
    URL and ``s3.options`` fsspec's ``storage_options`` for it (dummy keys)."""

    def __init__(self, folder, bucket: str = "tfnet", start_s: float = 60.0):
        self.folder, self.bucket, self.start_s = str(folder), bucket, start_s
        self.proc = None
        self.endpoint = ""

    @property
    def options(self) -> dict:
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    def __enter__(self) -> MotoS3:
        moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
        log = os.path.join(self.folder, "moto.log")
        self._out = open(log, "wb")
        self.proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", "0"], stdout=self._out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + self.start_s
            while not self.endpoint:
                with open(log, errors="replace") as f:
                    found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", f.read())
                if found:
                    self.endpoint = found.group(1)
                elif self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {open(log, errors='replace').read()[-2000:]}")
                else:
                    time.sleep(0.1)
            import boto3

            boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                         region_name="us-east-1").create_bucket(Bucket=self.bucket)
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
        self._out.close()
