"""Spark's own log (log4j) stays out of the terminal, or goes whole into ``$RECLOCK_SPARK_LOG``.

Each case starts its own driver JVM in a subprocess: log4j is configured once per JVM, at its
start, which is the moment under test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.envs import ROOT

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("reclock_processes")]  # a driver JVM each, in a subprocess

SESSION = """
from reclock.job.spark import spark_session
spark = spark_session("local[1]")
print("rows", spark.range(3).count())
"""


def start_session(**env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "RECLOCK_SPARK_LOG"}
    environment["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", SESSION],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, **env},
    )


def spark_lines(stderr: str) -> list[str]:
    """Lines of Spark's logging; the JVM's own module notice is printed before logging exists."""
    return [line for line in stderr.splitlines() if line.strip() and "incubator modules" not in line]


def test_a_session_starts_without_a_line_of_spark_logging_on_stderr():
    done = start_session()
    assert done.returncode == 0 and done.stdout == "rows 3\n", done.stderr[-3000:]
    assert spark_lines(done.stderr) == []


def test_with_reclock_spark_log_the_log_goes_into_that_file(tmp_path):
    target = tmp_path / "spark.log"
    done = start_session(RECLOCK_SPARK_LOG=str(target))
    assert done.returncode == 0 and done.stdout == "rows 3\n", done.stderr[-3000:]
    assert spark_lines(done.stderr) == []
    logged = target.read_text()
    assert " INFO SparkContext: Running Spark version" in logged
