"""Opt-in per-test CPU accounting: where the suite's CPU seconds go.

``scripts/test`` runs on two cores, so its wall time is about its CPU seconds over two; a wall
time per test (``--durations``) says which tests wait, not which ones cost. With
``RECLOCK_TEST_CPU=<file>`` in the environment, every pytest process of the run (the Spark session
and each xdist worker) appends one tab-separated line per test to that file:

    nodeid  worker  wall_s  self_cpu_s  reaped_cpu_s  tree_cpu_s

- ``self_cpu_s``: the pytest process's own user+sys CPU (all its threads) during the test;
- ``reaped_cpu_s``: the CPU of children it waited for during the test (``RUSAGE_CHILDREN``), such
  as ``reclock`` subprocesses;
- ``tree_cpu_s``: the CPU that live descendants (session servers: the broker, moto, Postgres, a
  Spark JVM, and children still running) used during the test, from ``/proc``, with what their
  own reaped children used.

Each test's span covers its setup, call and teardown, so a session fixture's start-up is charged
to the first test that needs it, and the session's teardown to the last. A process whose parent
ended first (the JVM of a ``reclock start`` on Spark) is reparented to init and counted nowhere:
``/proc/stat`` around the run shows that part. ``sort -t$'\\t' -k4,4nr`` ranks by CPU. Off by
default: the ``/proc`` walk costs a few ms a test. See docs/reliability.md, "How long it takes".

A session or module fixture's set-up (a broker, an S3 server, a Postgres server, the Spark session,
the standalone cluster, a module's shared lake) gets a line of its own besides, its ``nodeid``
``fixture:NAME``, with the same columns over the set-up alone (it is also inside the span of the
test that first needed it). ``python -m tests.cpu_report FILE`` sums a report: per lane (the Spark
session, each pool worker), per fixture, the tests that cost most, and how much of each test's wall
time its processes spent not running (waiting for a server, a sleep, or a core).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path

import pytest

#: The environment variable that names the report file; unset, the plugin records nothing.
ENV = "RECLOCK_TEST_CPU"

_TICK = os.sysconf("SC_CLK_TCK")


def _descendants_cpu() -> dict[int, float]:
    """CPU seconds (user+sys, plus their reaped children's) of each live descendant, by PID."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) "
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(f) for f in fields[11:15]) / _TICK  # utime stime cutime cstime
    me = os.getpid()
    found: dict[int, float] = {}
    for pid in cpu:
        ancestor = parents.get(pid, 0)
        while ancestor > 1 and ancestor != me:
            ancestor = parents.get(ancestor, 0)
        if ancestor == me:
            found[pid] = cpu[pid]
    return found


def _own() -> tuple[float, float]:
    """This process's CPU seconds, and those of the children it has waited for."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def _recorded(report: str, nodeid: str) -> Iterator[None]:
    """Appends ``nodeid``'s line (wall, self, reaped and tree CPU) for the span of the block."""
    tree_before = _descendants_cpu()
    self_before, reaped_before = _own()
    wall_before = time.monotonic()
    yield
    wall = time.monotonic() - wall_before
    self_after, reaped_after = _own()
    tree_after = _descendants_cpu()
    # A descendant that ended meanwhile is in ``reaped`` (or its reaper's own children's CPU) whole.
    tree = sum(tree_after.values()) - sum(tree_before.values())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = (
        f"{nodeid}\t{worker}\t{wall:.2f}\t{self_after - self_before:.2f}"
        f"\t{reaped_after - reaped_before:.2f}\t{tree:.2f}\n"
    )
    with open(report, "a", encoding="utf-8") as out:  # one short append a line: workers do not interleave
        out.write(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Records the test's wall time and CPU around its whole protocol (setup, call, teardown)."""
    report = os.environ.get(ENV)
    if not report:
        yield
        return
    with _recorded(report, item.nodeid):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """Records a session or module fixture's set-up: what starting a server or a JVM costs."""
    report = os.environ.get(ENV)
    if not report or fixturedef.scope not in ("session", "package", "module"):
        yield
        return
    with _recorded(report, f"{FIXTURE}{fixturedef.argname}"):
        yield


#: The ``nodeid`` prefix of a fixture's line.
FIXTURE = "fixture:"


def summary(lines: Iterable[str], top: int = 20) -> str:
    """A report's sums, as markdown tables: per lane, per fixture, and the ``top`` tests by CPU.

    A test's CPU is its self, reaped and tree CPU, at least 0: a descendant that ends during a test
    (a server stopped, a zygote) adds its whole life's CPU to ``reaped`` and takes its CPU before
    the test out of ``tree``, so only their sum is the test's. Its *waiting* is its wall time less
    its CPU (on one core), at least 0: the time none of its processes ran."""
    tests: list[tuple[str, str, float, float]] = []
    fixtures: dict[str, list[float]] = {}
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 6:
            continue
        nodeid, worker = fields[0], fields[1]
        wall, own, reaped, tree = (float(f) for f in fields[2:])
        cpu = max(own + reaped + tree, 0.0)
        if nodeid.startswith(FIXTURE):
            seen = fixtures.setdefault(nodeid.removeprefix(FIXTURE), [0, 0.0, 0.0])
            seen[0] += 1
            seen[1] += wall
            seen[2] += cpu
        else:
            tests.append((nodeid, worker, wall, cpu))
    lanes: dict[str, list[float]] = {}
    for _, worker, wall, cpu in tests:
        lane = lanes.setdefault("Spark session" if worker == "main" else f"pool {worker}", [0, 0.0, 0.0, 0.0])
        lane[0] += 1
        lane[1] += wall
        lane[2] += cpu
        lane[3] += max(wall - cpu, 0.0)
    out = ["| lane | tests | wall s | CPU s | waiting s |", "|---|---|---|---|---|"]
    for name, (n, wall, cpu, waiting) in sorted(lanes.items()):
        out.append(f"| {name} | {n:.0f} | {wall:.0f} | {cpu:.0f} | {waiting:.0f} |")
    total = sum(cpu for *_, cpu in tests)
    out.append(f"| all | {len(tests)} | | {total:.0f} | |")
    out += ["", "| fixture (set-ups) | count | wall s | CPU s |", "|---|---|---|---|"]
    for name, (n, wall, cpu) in sorted(fixtures.items(), key=lambda kv: -kv[1][2]):
        out.append(f"| {name} | {n:.0f} | {wall:.1f} | {cpu:.1f} |")
    out += ["", "| test | lane | wall s | CPU s |", "|---|---|---|---|"]
    for nodeid, worker, wall, cpu in sorted(tests, key=lambda t: -t[3])[:top]:
        out.append(f"| `{nodeid}` | {worker} | {wall:.0f} | {cpu:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    with open(sys.argv[1], encoding="utf-8") as report_file:
        print(summary(report_file, top=int(sys.argv[2]) if len(sys.argv) > 2 else 20))
