"""Integration fixtures: one real local Spark session for the whole run.

Starting Spark costs seconds, so the session is shared; each test gets its own lake in tmp_path.
Tests that need executors in separate JVMs start their own job in a subprocess instead, since a
process can hold only one SparkContext.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from reclock.spark import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's standalone S3 server, one process for the session, stopped by its PID."""
    from tests.integration.s3 import S3Server

    log = open(tmp_path_factory.mktemp("s3") / "moto.log", "wb")  # noqa: SIM115 - closed below
    server = S3Server(log)
    yield server
    server.stop()
    log.close()
