"""Resumption: where a pipeline stands, from its bindings and its outputs' uppers alone.

These few rules decide exactly-once, so they are written once and shared by the batch loop, the
job's status, metrics, maintenance, file states and as-of reads:

* every output holds the rows below its upper (its commit label + 1), so everything below the
  **resume upper**, the least upper over the outputs, is durable in every output;
* the source resumes at the **resume frontier** ``R(resume upper - 1)``, which is also the most it
  may commit upstream (a Kafka group's offsets);
* a pipeline is **finished** when its source is closed and every output holds the closing binding.

Pure functions of the time model: no I/O, so persist and sources may use them too.
"""

from __future__ import annotations

from collections.abc import Iterable

from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import Frontier, IntoTime

__all__ = ["is_finished", "resume_frontier", "resume_upper"]


def resume_upper(uppers: Iterable[IntoTime]) -> IntoTime:
    """The least of the outputs' uppers (0 without outputs: nothing is durable yet)."""
    return min(uppers, default=0)


def resume_frontier(bindings: Bindings, upper: IntoTime) -> Frontier:
    """``R(upper - 1)``: where a source whose outputs all reached ``upper`` resumes."""
    return bindings.source_upper_at(upper)


def is_finished(bindings: Bindings, upper: IntoTime) -> bool:
    """The source is closed and every output (least upper ``upper``) holds the closing binding."""
    return bindings.is_closed and upper >= bindings.upper
