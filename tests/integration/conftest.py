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
