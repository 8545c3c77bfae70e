"""Project-wide test settings: deterministic hypothesis runs, the lanes, and ``--long``.

Hypothesis runs without wall-clock deadlines: these machines are noisy (first calls into Arrow
compute or Delta take hundreds of ms), so a deadline would make property tests flaky without
pinning any behaviour. CI runs the same number of examples as a developer.

**Lanes.** Every test is marked by the real parts it uses, derived from its fixtures (the closure:
a fixture that needs ``broker`` makes its tests ``kafka``), so the markers cannot drift from what
a test really starts: ``spark``, ``kafka``, ``s3``, ``postgres``, ``browser``, and ``process`` for a
test that starts ``reclock`` (or a Python that imports it) as a subprocess, which such a test
declares by using the ``reclock_processes`` fixture. A test with none of these is ``unit``; every
other one is also ``integration``. ``scripts/test`` runs two pytest sessions side by side (``spark``
with the tests marked ``beside_spark`` by hand, and the others in a pool of workers), so each part
is up once per session, or once per worker.
A part a test reaches without a fixture (a ``reclock start`` subprocess of a Spark pipeline starts
its own JVM) is marked by hand with the same name, and the hook counts it.

**Long campaigns.** ``--long`` (``scripts/test --long``) runs the fault campaigns with their long
counts of kills and iterations; by default each runs a short version with the same assertions.
Tests read the lane from the ``long_lane`` fixture.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = [
    "pytester",  # tests/unit/test_lanes.py runs the lane machinery in a throwaway session
    "tests.cpu_report",  # RECLOCK_TEST_CPU=<file>: CPU seconds per test (docs/reliability.md)
    "tests.spark_archive",  # the driver JVMs' class-data archive, removed at the session's end
]

#: The JVMs the tests start (the Spark session, each ``reclock start`` on Spark, the standalone
#: cluster's master and workers) compile with C1 only. Most of a JVM's CPU in these short runs is
#: C2 compiling code it will not run long enough to gain from: one Spark session's start took
#: 21.4 CPU-s with C2 and 12.3 without on the 2-core development machine, and the suite starts
#: dozens, uncounted by ``time`` (an exiting driver leaves its JVM to init). A Spark plan runs the
#: same either way; only its speed differs. Inherited by every subprocess; a caller's own wins.
JIT = "-XX:TieredStopAtLevel=1"
os.environ.setdefault("SPARK_SUBMIT_OPTS", JIT)  # a driver JVM, by spark-submit (pyspark's too)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", JIT)  # a standalone master or worker, by spark-class

settings.register_profile("reclock", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("reclock")

#: Each part's marker, and the fixtures that bring the part up (or, for ``process``, declare it).
PARTS: dict[str, frozenset[str]] = {
    "spark": frozenset({"spark", "spark_cluster"}),
    "kafka": frozenset({"broker"}),
    "s3": frozenset({"s3_server"}),
    "postgres": frozenset({"postgres"}),
    "mysql": frozenset({"mariadb"}),
    "browser": frozenset({"browser"}),
    "process": frozenset({"reclock_processes", "plugin_python", "executor_python"}),
}


#: The fixtures of the Spark parts a session starts once and shares: a test using one runs in the
#: session that holds them (``spark_shared``); a test whose Spark job starts its own JVM (marked
#: ``spark`` by hand) runs in the pool with the rest (scripts/test).
SHARED_SPARK = PARTS["spark"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the long fault campaigns (more kills and iterations; see docs/reliability.md)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test marked by the parts its fixtures bring up; the tests marked ``waits`` first.

    A test that mostly waits (116 s of an idle source for 22 CPU-s) started where the collection
    order put it, late in a worker's share, and then ended the pool's session alone: first, its
    waiting overlaps the others' work (pytest-xdist hands a worker its tests in this order)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        parts = {part for part, fixtures in PARTS.items() if used & fixtures}
        parts |= {mark.name for mark in item.iter_markers() if mark.name in PARTS}
        for part in sorted(parts):
            item.add_marker(part)
        if used & SHARED_SPARK:
            item.add_marker("spark_shared")
        item.add_marker("integration" if parts else "unit")
    items.sort(key=lambda item: item.get_closest_marker("waits") is None)  # stable: the rest keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    """A session that selected a Spark test (after ``-m``) gives its drivers, and the test cluster's
    JVMs, a class-data archive (tests/spark_archive.py), unless the caller set their options: then
    they stay the caller's."""
    if os.environ.get("SPARK_SUBMIT_OPTS") == JIT and any(item.get_closest_marker("spark") for item in session.items):
        from tests import spark_archive  # a plugin of this conftest (pytest_plugins), imported by pytest first

        daemons = JIT if os.environ.get("SPARK_DAEMON_JAVA_OPTS") == JIT else None
        spark_archive.make(JIT, daemons)


@pytest.fixture(scope="session")
def long_lane(request: pytest.FixtureRequest) -> bool:
    """Whether this run is the long lane (``--long``): campaigns pick their counts by it."""
    return bool(request.config.getoption("--long"))


@pytest.fixture
def reclock_processes() -> Iterator[None]:
    """Declares that the test starts ``reclock`` processes (the ``process`` lane), and kills what
    of them still runs when it ends, failed or not: a job left running would hold its lake's lease
    and the machine's cores through every later test.

    Function-scoped, so it sets up after every session and module fixture: the processes those
    start (the broker, Spark, moto) are already children when it looks, and are left alone. The
    commands :mod:`tests.zygote` forked for the test (for this process, or for a shell's
    ``reclock``, :mod:`tests.zygote_shim`) are the zygote's children that were not there before.
    """
    from tests import zygote

    before = set(_children())
    server = zygote.server_pid()
    forked_before = set(_children(server)) if server is not None else set()
    yield
    left = {pid: argv for pid, argv in _children().items() if pid not in before and pid != zygote.server_pid()}
    server = zygote.server_pid()
    if server is not None:  # commands the zygote forked for this test (its children, not this process's)
        left |= {pid: ["reclock"] for pid in _children(server) if pid not in forked_before}
    for pid, argv in left.items():
        if not any("reclock" in arg for arg in argv):
            continue
        try:
            if os.getpgid(pid) == pid:  # its own session (a job and its Spark JVM): the whole group
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _children(parent: int | None = None) -> dict[int, list[str]]:
    """The live children of ``parent`` (this process) and their command lines, from /proc."""
    me = os.getpid() if parent is None else parent
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) "
            if int(fields[1]) == me and fields[0] != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
    return found
