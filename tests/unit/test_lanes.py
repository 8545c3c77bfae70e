"""The suite's own machinery: markers derived from fixtures, ``--long``, the in-process CLI, and the
fixture that kills the ``reclock`` processes a test leaves behind.

The marker hook and the fixtures run inside a throwaway pytest session (``pytester``) over test
files written here, with stand-in fixtures named like the real parts: what is checked is which
lane each test lands in, as ``-m`` selects it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli import reclock_in_process
from tests.waiting import PATIENCE_S

CONFTEST = """
import pytest
from tests.conftest import long_lane, pytest_addoption, pytest_collection_modifyitems, reclock_processes

@pytest.fixture(scope="session")
def broker():
    return "broker"

@pytest.fixture
def topic(broker):
    return "topic"

@pytest.fixture(scope="session")
def spark():
    return "spark"

@pytest.fixture(scope="session")
def s3_server():
    return "s3"
"""

TESTS = """
import pytest

def test_pure():
    pass

def test_through_topic(topic):
    pass

def test_spark_and_s3(spark, s3_server):
    pass

@pytest.mark.usefixtures("reclock_processes")
def test_starts_processes():
    pass

@pytest.mark.spark
def test_spark_in_a_subprocess():
    pass

def test_lane(long_lane):
    print("LANE", long_lane)

@pytest.mark.waits
def test_waiting():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.syspathinsert(Path(__file__).resolve().parents[2])  # `tests.conftest`, as the real suite has it
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_lanes_sample=TESTS)
    return pytester


def selected(suite: pytest.Pytester, expression: str) -> list[str]:
    result = suite.runpytest("-m", expression, "--collect-only", "-q", "-p", "no:cacheprovider")
    return sorted(line.split("::")[1] for line in result.outlines if "::" in line)


def test_each_test_is_marked_by_the_parts_its_fixtures_bring_up(suite):
    assert selected(suite, "unit") == ["test_lane", "test_pure", "test_waiting"]
    assert selected(suite, "kafka") == ["test_through_topic"]  # through topic's own need of broker
    assert selected(suite, "spark") == ["test_spark_and_s3", "test_spark_in_a_subprocess"]
    assert selected(suite, "s3") == ["test_spark_and_s3"]
    assert selected(suite, "process") == ["test_starts_processes"]
    assert selected(suite, "integration") == [
        "test_spark_and_s3",
        "test_spark_in_a_subprocess",
        "test_starts_processes",
        "test_through_topic",
    ]


def test_the_tests_that_mostly_wait_are_collected_first_and_the_rest_keep_their_order(suite):
    result = suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    order = [line.split("::")[1] for line in result.outlines if "::" in line]
    assert order == [
        "test_waiting",
        "test_pure",
        "test_through_topic",
        "test_spark_and_s3",
        "test_starts_processes",
        "test_spark_in_a_subprocess",
        "test_lane",
    ]


def test_long_selects_the_long_lane(suite):
    for args, lane in (((), "False"), (("--long",), "True")):
        result = suite.runpytest("-s", "test_lanes_sample.py::test_lane", "-p", "no:cacheprovider", *args)
        result.assert_outcomes(passed=1)
        assert f"LANE {lane}" in result.stdout.str()


def test_reclock_processes_kills_what_a_test_left_running(suite, tmp_path):
    """A ``reclock`` process in a session of its own (a job and its Spark JVM), and one that is
    not: both gone when the test ends, failed or not; a child that is not reclock is left alone."""
    pids = tmp_path / "pids"
    suite.makepyfile(
        test_leaves=f"""
import subprocess, sys

def test_leaves_them(reclock_processes):
    code = "import time; time.sleep(3600)  # reclock"
    own = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    shared = subprocess.Popen([sys.executable, "-c", code])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    open({str(pids)!r}, "w").write(f"{{own.pid}} {{shared.pid}} {{other.pid}}")
    assert False, "fails, and still they go"
"""
    )
    suite.runpytest("test_leaves.py", "-p", "no:cacheprovider").assert_outcomes(failed=1)
    own, shared, other = (int(pid) for pid in pids.read_text().split())
    try:
        deadline = time.monotonic() + PATIENCE_S
        while (_alive(own) or _alive(shared)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(own) and not _alive(shared)
        assert _alive(other)
    finally:
        for pid in (own, shared, other):
            if _alive(pid):
                os.kill(pid, 9)
            _reap(pid)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


@pytest.mark.usefixtures("reclock_processes")  # the command itself, to compare with
def test_reclock_in_process_answers_as_the_command_does(tmp_path):
    lake = str(tmp_path / "lake")
    (tmp_path / "lake").mkdir()  # an empty lake: one that does not exist is a mistake (exit 2)
    here = reclock_in_process("--lake", lake, "status")
    there = subprocess.run(
        [sys.executable, "-m", "reclock.cli", "--lake", lake, "status"], capture_output=True, text=True, timeout=120
    )
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)
    assert here.returncode == 0 and here.stdout == f"no pipelines in {lake}\n"
    mistake = reclock_in_process("--lake", lake, "status", "--no-such-flag")  # argparse's own exit
    assert mistake.returncode == 2 and "--no-such-flag" in mistake.stderr and mistake.stdout == ""


def test_reclock_in_process_runs_in_the_given_environment_and_puts_this_one_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RECLOCK_LOG_LEVEL", "WARNING")
    before = dict(os.environ)
    loud = reclock_in_process("--lake", str(tmp_path), "status", env={**os.environ, "RECLOCK_LOG_LEVEL": "loud"})
    assert loud.returncode == 2 and "RECLOCK_LOG_LEVEL" in loud.stderr
    assert dict(os.environ) == before
