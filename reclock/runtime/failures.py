"""What the batch loop does with a failed batch: the retry, skip and fail rules as one table.

A batch fails when some of its splits raised; each split's error has a kind
(:class:`~reclock.errors.ErrorKind`). The loop asks :func:`decide` what to do, given the kinds,
how many bad-data attempts the batch has already spent, the pipeline's policy and which outputs
already hold the batch. Rows are tried top to bottom; the first that matches decides:

====================  ==========================  =============  ==========  =====================
kinds                 attempts spent              stop_on_error  holders     verdict (attempts)
====================  ==========================  =============  ==========  =====================
invariant or definite any                         any            any         ``FAIL`` (unchanged)
data                  ``>= max_retries``          yes            any         ``FAIL`` (unchanged)
data                  ``>= max_retries``          no             some        ``FAIL_HELD`` (+1)
data                  ``>= max_retries``          no             none        ``SKIP`` (+1)
data                  ``< max_retries``           any            any         ``RETRY`` (+1)
transient only        any                         any            any         ``STALL`` (unchanged)
====================  ==========================  =============  ==========  =====================

So a batch that keeps failing on bad data runs ``max_retries + 1`` times in all, however many
transient stalls come between, and is then either the pipeline's failure or a durable skip. A
transient fault never counts and never skips (the data is fine), and a batch an output already
holds is never skipped: its rows landed, so recording the range as skipped would count them twice.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from reclock.errors import ErrorKind
from reclock.runtime.settings import Settings

__all__ = ["Decision", "Verdict", "decide"]


class Verdict(StrEnum):
    """What the loop does next with a failed batch."""

    RETRY = "retry"  # bad data, attempts left: stall, back off, run the same batch again
    STALL = "stall"  # transient trouble only: stall, back off, run it again (not an attempt)
    SKIP = "skip"  # attempts spent: record the failed ranges as skipped, durably, and go on
    FAIL = "fail"  # the pipeline fails with the batch's own error
    FAIL_HELD = "fail_held"  # the pipeline fails: the batch is spent, but an output already holds it


@dataclass(frozen=True)
class Decision:
    """A verdict, and the batch's bad-data attempts counting this failure if it was one."""

    verdict: Verdict
    attempts: int
    held_by: str | None = None  # FAIL_HELD: the first output that already holds the batch


def decide(kinds: Collection[ErrorKind], attempts: int, policy: Settings, holders: Sequence[str]) -> Decision:
    """The table's row for a failed batch (see the module docstring).

    ``attempts`` is the bad-data failures of this batch before this one (0 on its first
    failure); ``policy`` the pipeline's ``max_retries`` and ``stop_on_error``; ``holders`` the
    outputs whose upper is already past the batch, in the pipeline's output order.
    """
    if ErrorKind.INVARIANT in kinds or ErrorKind.DEFINITE in kinds:
        return Decision(Verdict.FAIL, attempts)
    if ErrorKind.DATA not in kinds:
        return Decision(Verdict.STALL, attempts)
    if attempts < policy.max_retries:
        return Decision(Verdict.RETRY, attempts + 1)
    if policy.stop_on_error:
        return Decision(Verdict.FAIL, attempts)
    if holders:
        return Decision(Verdict.FAIL_HELD, attempts + 1, held_by=holders[0])
    return Decision(Verdict.SKIP, attempts + 1)
