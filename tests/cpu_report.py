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
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Records the test's wall time and CPU around its whole protocol (setup, call, teardown)."""
    report = os.environ.get(ENV)
    if not report:
        yield
        return
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
        f"{item.nodeid}\t{worker}\t{wall:.2f}\t{self_after - self_before:.2f}"
        f"\t{reaped_after - reaped_before:.2f}\t{tree:.2f}\n"
    )
    with open(report, "a", encoding="utf-8") as out:  # one short append a line: workers do not interleave
        out.write(line)
