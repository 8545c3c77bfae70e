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
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["FLOOR_S", "PATIENCE_S", "wait_until"]

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
