"""Waiting in tests: for a condition, with a patience that a loaded machine cannot run out of.

A test that counts what happened in three seconds, or gives a command ten seconds to answer,
asserts the machine's speed: with the suite's lanes beside it on two cores (a load of 10 and
more) the count comes out short and the command late, and the test fails with nothing broken.
A test here waits until the condition it is about holds, then asserts what happened; the only
bound on time is the patience, generous enough that only a hang reaches it (a test that waits
that long has found a bug: something that never happens). Speed is measured in benchmarks/.

``PATIENCE_S`` is 120 s, times ``RECLOCK_TEST_PATIENCE`` when it is set (a slower machine, a
run under a debugger). tests/unit/test_no_time_bounds.py fails on a test that bounds time with
less than ``FLOOR_S``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["FLOOR_S", "PATIENCE_S", "returned", "run_until", "wait_until"]

T = TypeVar("T")

FLOOR_S = 60.0
"""The least time a test may give anything: below it, a loaded machine can miss the bound."""

PATIENCE_S = 120.0 * float(os.environ.get("RECLOCK_TEST_PATIENCE", "1"))
"""How long a test waits for something that should happen before it says it never did."""


def wait_until(condition: Callable[[], T], what: str, *, patience: float = PATIENCE_S, every: float = 0.05) -> T:
    """Poll ``condition`` until it returns a true value, and return that value.

    Fails the test, naming ``what`` it waited for and the last value seen, when ``patience``
    seconds pass first. ``condition`` is called at least once, so a condition that already
    holds costs no sleep.
    """
    deadline = time.monotonic() + patience
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {patience:.0f} s for {what}; it never happened (last seen: {value!r})")
        time.sleep(every)


def returned(call: Callable[[], T], what: str) -> T:
    """``call()``, run in a thread: its value, or what it raised; a failure naming ``what`` if it
    has not returned within the patience.

    A test that pins "this does not wait out that timeout" sets the timeout far past the patience
    and calls it here, instead of timing the call against a bound a loaded machine can miss.
    """
    outcome: list[tuple[bool, object]] = []

    def attempt() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the test's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=attempt, name=what, daemon=True)
    thread.start()
    thread.join(PATIENCE_S)
    assert outcome, f"{what} had not returned after {PATIENCE_S:.0f} s: it waits for something that never comes"
    ok, value = outcome[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


def run_until(lake: Any, name: str, condition: Callable[[], object], what: str, **run: Any) -> Any:
    """Run the stored pipeline ``name`` (``reclock.job.lifecycle.run``) until ``condition`` holds,
    then stop it as ``reclock stop`` does, and return the pipeline it ran.

    What a job does in N seconds is a rate; a test that runs one to see it work runs it until the
    work is there, then stops it. ``run`` goes to ``lifecycle.run``; its ``max_seconds`` is ten
    times the patience unless given, so that only the stop ends the job in time. An exception of
    the job is raised here.
    """
    from reclock.job import lifecycle

    ran: list[Any] = []
    failed: list[BaseException] = []

    def job() -> None:
        try:
            ran.append(lifecycle.run(lake, name, **{"max_seconds": 10 * PATIENCE_S, **run}))
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=job, name=f"job {name}", daemon=True)
    thread.start()
    try:
        # Polled every quarter second: the condition reads the lake in this process, beside the job.
        wait_until(lambda: condition() or failed or not thread.is_alive(), what, every=0.25)
    finally:
        lifecycle.request_stop(lake, name)
        thread.join(PATIENCE_S)
    assert not thread.is_alive(), f"pipeline {name!r} did not stop within {PATIENCE_S:.0f} s of the stop"
    if failed:
        raise failed[0]
    assert condition(), f"pipeline {name!r} ended before {what}"
    return ran[0]
