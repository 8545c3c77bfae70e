"""Integration fixtures: one real local Spark session for the whole run, and on demand a Spark
standalone cluster and the Python environments of a plugin user and of a cluster node.

Starting Spark costs seconds, so the session is shared; each test gets its own lake in tmp_path.
Tests that need executors in separate JVMs start their own job in a subprocess instead, since a
process can hold only one SparkContext.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.envs import ROOT, bare_env, pip_install, reclock_script

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from reclock.job.spark import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def plugin_python(tmp_path_factory) -> Path:
    """A user's environment: reclock (this checkout) and the guide's plugin installed by pip."""
    python = bare_env(tmp_path_factory.mktemp("plugin-env") / "env", ROOT)
    pip_install(python, ROOT / "tests" / "plugins" / "sensorlog")
    reclock_script(python)
    return python


@pytest.fixture(scope="session")
def executor_python(tmp_path_factory) -> Path:
    """A cluster node's Python: reclock's dependencies, but neither reclock nor any plugin."""
    return bare_env(tmp_path_factory.mktemp("node-env") / "env")


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory) -> Iterator:
    """A Spark standalone master and two workers, separate processes (see tests/integration/cluster.py),
    started once the session's class-data archive is made, so that they and every executor map it."""
    from tests import spark_archive
    from tests.integration.cluster import StandaloneCluster

    spark_archive.wait()
    with StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's standalone S3 server, one process for the session, stopped by its PID."""
    from tests.integration.s3 import S3Server

    log = open(tmp_path_factory.mktemp("s3") / "moto.log", "wb")  # noqa: SIM115 - closed below
    server = S3Server(log)
    yield server
    server.stop()
    log.close()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL 15 server with ``wal_level = logical``, one process for the session, stopped by
    its PID (see tests/integration/postgres.py); each test makes its own database."""
    from tests.integration.postgres import PostgresServer

    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def mariadb():
    """A MariaDB 10.11 server logging row-based binlogs, one process for the session, stopped by
    its PID (see tests/integration/mariadb.py); each test makes its own database. Skipped, saying
    why, on a machine without the server package (``scripts/bootstrap`` installs it where it may
    use apt)."""
    from reclock.demo.mariadb_server import server_binary
    from tests.integration.mariadb import MariaDBServer

    if server_binary() is None:
        pytest.skip("needs Debian's mariadb-server (apt-get install mariadb-server)")
    server = MariaDBServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def browser() -> Iterator:
    """Headless Chromium from the distribution's packages, driven by Selenium through the
    distribution's chromedriver: nothing is downloaded at run time. Skipped, saying why, on a
    machine without them (``scripts/bootstrap`` installs them where it may use apt)."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,1000")
    session = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield session
    session.quit()
