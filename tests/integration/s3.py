"""A real S3-compatible server for the object-storage tests: moto's standalone server, its own process.

The server listens on 127.0.0.1 on a free port and is stopped by its own PID; tests reach it only
over HTTP, as any S3 client would (no client is patched). :func:`mirror` copies a lake prefix to a
local folder with boto3, so the tests' independent Delta log reader (``tests.faults.reader``) checks
what the server holds without any of the code under test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import IO

from tests.waiting import PATIENCE_S

__all__ = ["S3Server", "mirror"]

REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: ``python -m moto.server``, with one of its lookups done once: moto finds the backend a request
#: is for by listing its own package folder and stat'ing each entry, on every request (10 % of its
#: samples under py-spy), and that folder does not change while it runs. The server's CPU per
#: request (a PUT, a GET and a LIST of a Delta log in turn, 1,200 of them) went from 3.8-4.7 ms
#: to 2.7-3.2 ms; the four servers of a suite run had taken about 100 CPU-s.
_SERVE = """
import sys
from moto import backends
from moto.server import main
modules = tuple(backends.list_of_moto_modules())
backends.list_of_moto_modules = lambda: modules
main(sys.argv[1:])
"""


class S3Server:
    """``moto.server`` on 127.0.0.1:<free port>; :meth:`stop` ends it by its PID."""

    def __init__(self, log: IO[bytes] | None = None) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.access_key_id = "reclock-test"
        self.secret_access_key = f"secret-{uuid.uuid4().hex}"
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=log if log is not None else subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + PATIENCE_S
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start on port {self.port}") from None
                time.sleep(0.1)

    @property
    def storage_options(self) -> dict[str, str]:
        """What a lake on this server needs, as reclock and delta-rs name the options."""
        return {
            "endpoint": self.endpoint,
            "region": REGION,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "allow_http": "true",
        }

    @property
    def environ(self) -> dict[str, str]:
        """The same, as the standard AWS environment variables (for CLI subprocesses)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def bucket(self) -> str:
        """A new, empty bucket of its own."""
        name = f"lake-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=PATIENCE_S)


def mirror(server: S3Server, bucket: str, prefix: str, into: Path) -> Path:
    """Copy every object under ``bucket/prefix`` into ``into`` (replacing it); returns ``into``."""
    client = server.client()
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for item in page.get("Contents", []):
            target = into / item["Key"][len(prefix.rstrip("/")) + 1 :]
            if item["Key"].endswith("/"):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item["Key"], str(target))
    return into
