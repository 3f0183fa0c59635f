"""A real S3 server for tests: moto in server mode, a separate process on loopback, its port chosen by the OS
and read back from its banner, stopped on every way out."""

from __future__ import annotations

import os
import sys

from tests.local_server import LocalServer, in_log

__all__ = ["MotoS3"]


class MotoS3(LocalServer):
    """``with MotoS3(tmp_dir, bucket="tfnet") as s3:`` a moto S3 server with ``bucket`` made; ``s3.endpoint`` is its
    URL and ``s3.options`` fsspec's ``storage_options`` for it (dummy keys)."""

    name = "moto_server"

    def __init__(self, folder, bucket: str = "tfnet", start_s: float = 60.0):
        super().__init__(folder, start_s)
        self.bucket = bucket

    @property
    def options(self) -> dict:
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    def __enter__(self) -> MotoS3:
        self.launch([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", "0"],
                    "moto.log")
        try:
            self.wait_for_endpoint(in_log(r"Running on (http://127\.0\.0\.1:\d+)"))
            import boto3

            boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                         region_name="us-east-1").create_bucket(Bucket=self.bucket)
        except BaseException:
            self.__exit__()
            raise
        return self
