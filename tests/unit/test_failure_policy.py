"""The failed-batch table of reclock.runtime.failures, row by row, and the loop it drives as a property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.errors import ErrorKind
from reclock.runtime.failures import Decision, Verdict, decide
from reclock.runtime.settings import Settings

T, D, DEF, INV = ErrorKind.TRANSIENT, ErrorKind.DATA, ErrorKind.DEFINITE, ErrorKind.INVARIANT
STOP, SKIP = True, False
NONE, HELD = (), ("events", "_errors")

# (kinds, attempts before, max_retries, stop_on_error, holders) -> decision; one row per table row,
# and the row's edges (mixed kinds, the last retry, the first spent attempt, max_retries = 0).
TABLE = [
    # invariant or definite: fail at once, whatever else failed, however the policy reads
    ({INV}, 0, 3, SKIP, NONE, Decision(Verdict.FAIL, 0)),
    ({DEF}, 0, 3, SKIP, NONE, Decision(Verdict.FAIL, 0)),
    ({INV, D}, 2, 3, SKIP, HELD, Decision(Verdict.FAIL, 2)),
    ({DEF, T}, 5, 3, STOP, NONE, Decision(Verdict.FAIL, 5)),
    # data, attempts spent, stop_on_error: fail with the batch's own error
    ({D}, 3, 3, STOP, NONE, Decision(Verdict.FAIL, 3)),
    ({D}, 0, 0, STOP, NONE, Decision(Verdict.FAIL, 0)),
    ({D, T}, 3, 3, STOP, HELD, Decision(Verdict.FAIL, 3)),
    # data, attempts spent, skipping allowed, but an output already holds the batch: fail
    ({D}, 3, 3, SKIP, HELD, Decision(Verdict.FAIL_HELD, 4, held_by="events")),
    ({D}, 0, 0, SKIP, ("_errors",), Decision(Verdict.FAIL_HELD, 1, held_by="_errors")),
    # data, attempts spent, skipping allowed, no output holds it: skip
    ({D}, 3, 3, SKIP, NONE, Decision(Verdict.SKIP, 4)),
    ({D}, 0, 0, SKIP, NONE, Decision(Verdict.SKIP, 1)),
    ({D, T}, 4, 3, SKIP, NONE, Decision(Verdict.SKIP, 5)),  # a skip the lake refused, failing again
    # data, attempts left: retry, counting the attempt (policy and holders do not matter yet)
    ({D}, 0, 3, STOP, NONE, Decision(Verdict.RETRY, 1)),
    ({D}, 2, 3, SKIP, HELD, Decision(Verdict.RETRY, 3)),
    ({D, T}, 1, 3, SKIP, NONE, Decision(Verdict.RETRY, 2)),
    # transient only: stall, never an attempt, never a skip, never a failure
    ({T}, 0, 3, STOP, NONE, Decision(Verdict.STALL, 0)),
    ({T}, 3, 3, SKIP, NONE, Decision(Verdict.STALL, 3)),
    ({T}, 7, 0, SKIP, HELD, Decision(Verdict.STALL, 7)),
]


@pytest.mark.parametrize(("kinds", "attempts", "max_retries", "stop_on_error", "holders", "expected"), TABLE)
def test_each_row_of_the_failed_batch_table(kinds, attempts, max_retries, stop_on_error, holders, expected):
    policy = Settings(max_retries=max_retries, stop_on_error=stop_on_error)
    assert decide(frozenset(kinds), attempts, policy, holders) == expected


def test_the_table_reaches_every_verdict():
    assert {row[-1].verdict for row in TABLE} == set(Verdict)


kind_sets = st.sets(st.sampled_from(list(ErrorKind)), min_size=1)


@given(kinds=kind_sets, attempts=st.integers(0, 10), max_retries=st.integers(0, 5), stop=st.booleans())
def test_only_spent_bad_data_with_skipping_allowed_and_no_holder_is_ever_skipped(kinds, attempts, max_retries, stop):
    decision = decide(kinds, attempts, Settings(max_retries=max_retries, stop_on_error=stop), ())
    spent = D in kinds and attempts >= max_retries
    fatal = bool(kinds & {INV, DEF})
    assert (decision.verdict is Verdict.SKIP) == (spent and not stop and not fatal)
    assert (decision.verdict is Verdict.STALL) == (kinds == {T})


@given(
    failures=st.lists(st.sampled_from([frozenset({T}), frozenset({D}), frozenset({D, T})]), max_size=30),
    max_retries=st.integers(0, 5),
    stop=st.booleans(),
)
def test_bad_data_runs_a_batch_max_retries_plus_one_times_whatever_stalls_come_between(failures, max_retries, stop):
    """The loop's use of the table: feed back ``attempts``, stop at the first terminal verdict."""
    policy = Settings(max_retries=max_retries, stop_on_error=stop)
    attempts = bad = 0
    for kinds in failures:
        decision = decide(kinds, attempts, policy, ())
        bad += D in kinds
        if decision.verdict in (Verdict.RETRY, Verdict.STALL):
            attempts = decision.attempts
            assert attempts == bad  # transient stalls never count
            continue
        assert bad == max_retries + 1
        assert decision.verdict is (Verdict.FAIL if stop else Verdict.SKIP)
        return
    assert bad <= max_retries  # no terminal verdict: the bad-data failures stayed within the retries
