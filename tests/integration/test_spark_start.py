"""A Spark master that accepts connections and never answers (issue 24): the job gives up after
``[spark] start_timeout_seconds``, in one line, and the process ends although Spark's start hangs.

The master is a TCP listener that never says a word, so the preflight connect succeeds and Spark
itself waits for a registration that never comes (a minute or more of retries). ``reclock start``
is a subprocess: it starts a real JVM, which must not keep it alive.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.integration.helpers import reclock_cli
from tests.waiting import PATIENCE_S

pytestmark = pytest.mark.spark  # the subprocess starts its own JVM


@pytest.mark.usefixtures("reclock_processes")
def test_a_master_that_never_answers_is_given_up_after_the_start_timeout_in_one_line(tmp_path):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        master = f"spark://127.0.0.1:{silent.getsockname()[1]}"
        path = tmp_path / "p.toml"
        path.write_text(
            f'[pipeline]\nname = "orders"\nlake = "{tmp_path / "lake"}"\nengine = "spark"\n\n'
            f'[spark]\nmaster = "{master}"\nbackground_start = false\nstart_timeout_seconds = 3\n\n'
            '[source]\nkind = "generator"\nlimit = 1000\n'
        )
        assert reclock_cli("create", str(path)).returncode == 0
        done = reclock_cli("--lake", str(tmp_path / "lake"), "start", "orders", timeout=PATIENCE_S)
    assert done.returncode == 1, done
    # Given up by start_timeout_seconds (its line says so), not by Spark's own minute of retries
    # (a Java failure, which the lines below refuse), however long a loaded machine takes.
    lines = [line for line in done.stderr.splitlines() if "WARNING: Using incubator modules" not in line]
    assert len(lines) == 1, done.stderr
    assert "start_timeout_seconds = 3 s" in lines[0] and master in lines[0] and 'engine = "local"' in lines[0]
    assert "Traceback" not in done.stderr and "java." not in done.stderr
    status = json.loads(reclock_cli("--lake", str(tmp_path / "lake"), "status", "orders", "--json").stdout)[0]
    assert status["health"] == "failed" and "start_timeout_seconds" in status["last_error"], status


@pytest.mark.usefixtures("reclock_processes")
def test_the_spark_ui_setting_serves_spark_s_own_ui(tmp_path):
    """``[spark] ui = true`` is what ``spark_session(ui=True)`` does: a real session serves its UI."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    code = (
        "import urllib.request\n"
        "from reclock.job.spark import spark_session\n"
        f"s = spark_session('local[1]', {{'spark.ui.port': '{port}', 'spark.driver.host': '127.0.0.1'}}, ui=True)\n"
        "url = s.sparkContext.uiWebUrl\n"
        f"page = urllib.request.urlopen('http://127.0.0.1:{port}/jobs/', timeout=30).read().decode()\n"
        "print(url, 'Spark Jobs' in page)\n"
        "s.stop()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr
    url, found = done.stdout.split()
    assert url.endswith(f":{port}") and found == "True", done.stdout
