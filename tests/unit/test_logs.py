"""The job's log, seen as an operator sees it: ``reclock`` run as a subprocess, stderr read back."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from importlib.metadata import version

import pytest

from reclock.cli.main import main

CONFIG = """\
[pipeline]
name = "orders"
lake = "lake"
engine = "local"
max_batch = 5000

[source]
kind = "generator"
partitions = 2
limit = 10000
"""
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z (DEBUG|INFO|WARNING|ERROR) (\S+)( \[[^]]*\])? ")


def reclock(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RECLOCK_")}
    return subprocess.run(
        [sys.executable, "-m", "reclock.cli", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, **env},
    )


@pytest.fixture
def created(tmp_path, reclock_processes):
    (tmp_path / "orders.toml").write_text(CONFIG)
    assert reclock(tmp_path, "create", "orders.toml").returncode == 0
    return tmp_path


def test_info_lines_carry_a_timestamp_the_pipeline_and_the_batch_and_stay_off_stdout(created):
    before = datetime.now(UTC) - timedelta(seconds=1)
    done = reclock(created, "--log-level", "INFO", "start", "orders")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(STAMP.match(line) for line in lines), done.stderr
    for line in lines:
        when = datetime.fromisoformat(STAMP.match(line).group(1)).replace(tzinfo=UTC)
        assert before <= when <= datetime.now(UTC)
    committed = [line for line in lines if " committed in " in line]
    assert len(committed) >= 2, done.stderr  # 10,000 offsets in batches of at most 5,000
    assert all(re.search(r" INFO reclock\.job \[orders batch \d{13}\] ", line) for line in committed)
    assert any("job ended: stopped, finished" in line for line in lines)
    # stdout holds the progress lines and nothing of the log
    assert done.stdout.strip() and all(line.startswith("orders ") for line in done.stdout.strip().splitlines())


def test_the_level_is_honoured_from_the_flag_or_the_environment(created):
    quiet = reclock(created, "start", "orders")  # default WARNING: a clean run logs nothing
    assert quiet.returncode == 0 and quiet.stderr == ""
    debug = reclock(created, "start", "orders", RECLOCK_LOG_LEVEL="debug")  # finished already: starts, stops
    assert debug.returncode == 0
    assert re.search(r" INFO reclock\.job \[orders\] job started: engine local", debug.stderr), debug.stderr
    errors_only = reclock(created, "--log-level", "ERROR", "start", "orders", RECLOCK_LOG_LEVEL="DEBUG")
    assert errors_only.returncode == 0 and errors_only.stderr == ""  # the flag wins over the variable


def test_json_lines_name_their_fields(created):
    done = reclock(created, "--log-level", "INFO", "--log-format", "json", "start", "orders")
    assert done.returncode == 0
    entries = [json.loads(line) for line in done.stderr.splitlines()]
    batch = next(e for e in entries if e["message"].startswith("committed in "))
    assert batch["pipeline"] == "orders" and batch["level"] == "INFO" and isinstance(batch["batch_id"], int)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["ts"]) for e in entries)


@pytest.mark.usefixtures("reclock_processes")
def test_a_bad_level_in_the_environment_is_one_line_naming_the_variable(tmp_path):
    done = reclock(tmp_path, "status", RECLOCK_LOG_LEVEL="loud")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "$RECLOCK_LOG_LEVEL" in done.stderr and "'loud'" in done.stderr


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"reclock {version('reclock')}\n"


@pytest.mark.parametrize("command", [[], ["start"], ["create"], ["status"], ["files"], ["optimize"]])
def test_help_shows_no_restructured_text_markup(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    shown = capsys.readouterr().out
    assert shown.startswith("usage: reclock") and not re.search(r"``|:(func|class|mod):", shown), shown


def test_main_called_in_a_process_leaves_its_logging_as_it_was(tmp_path, capsys):
    loggers = [logging.getLogger(name) for name in ("reclock", "kafka")]
    before = [(logger.level, list(logger.handlers), logger.propagate) for logger in loggers]
    (tmp_path / "lake").mkdir()  # an empty lake: one that does not exist is a mistake (exit 2)
    assert main(["--lake", str(tmp_path / "lake"), "--log-level", "DEBUG", "status"]) == 0
    assert [(logger.level, list(logger.handlers), logger.propagate) for logger in loggers] == before


@pytest.mark.parametrize(("level", "traceback"), [("WARNING", False), ("DEBUG", True)])
def test_a_logged_exception_is_one_line_unless_debugging(level, traceback):
    """A terminal sees one line for a fault the job handles; its traceback only at DEBUG."""
    import io

    from reclock.runtime import logs

    out = io.StringIO()
    with logs.configured(level, "text", out):
        try:
            raise ConnectionResetError("Connection reset by peer\nmore detail")
        except ConnectionResetError:
            logging.getLogger("reclock.test").warning("could not publish", exc_info=True)
    text = out.getvalue()
    assert "could not publish (ConnectionResetError: Connection reset by peer)" in text or traceback
    assert ("Traceback" in text) is traceback
    assert (len(text.strip().splitlines()) == 1) is not traceback


@pytest.mark.parametrize(("level", "shown"), [("WARNING", False), ("ERROR", False), ("INFO", True), ("DEBUG", True)])
def test_kafka_python_speaks_at_info_and_debug_only(level, shown):
    """Its dropped-connection errors repeat what the job says as a stall; at INFO it explains one."""
    import io

    from reclock.runtime import logs

    out = io.StringIO()
    with logs.configured(level, "text", out):
        logging.getLogger("kafka.net.connection").error("Connection lost: socket disconnected")
    assert ("Connection lost" in out.getvalue()) is shown


def test_the_spark_log_configuration_outlives_the_process_that_gave_it():
    """A JVM still starting when its job gave up (``start_timeout_seconds``) reads the file after
    the job exited: removed at exit, it fell back to Spark's default profile and printed warnings
    after reclock's one line (seen under load in test_spark_start)."""
    code = "from reclock.runtime.logs import spark_conf; print(spark_conf({})['spark.driver.extraJavaOptions'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    path = done.stdout.strip().removeprefix("-Dlog4j2.configurationFile=file:")
    with open(path) as kept:
        assert "rootLogger.level = " in kept.read()
