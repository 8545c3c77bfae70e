"""The ranges of batches: which bindings and source range the next batch covers (step 3 of the design).

A batch starts at the slowest output, ``lower = R(resume upper - 1)``, and covers the pending
bindings from there on, as many as fit in ``max_batch`` offsets (at least one): a catch-up after
downtime is several bounded batches, never one unbounded one. Ranges recorded as skipped are cut
out of the splits, so a replay excludes exactly the records the first attempt gave up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from reclock.persist.remap import Skip
from reclock.sources.base import Split
from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import Frontier, IntoTime, Partition

__all__ = ["BatchRange", "plan_batch", "without_skips"]


@dataclass(frozen=True)
class BatchRange:
    """The bindings a batch covers, up to ``binding_ts``, and the source range ``[lower, upper)``."""

    binding_ts: IntoTime
    lower: Frontier
    upper: Frontier

    @property
    def moved(self) -> list[Partition]:
        """The partitions with records in the range: the only ones the batch reads and stamps."""
        return [p for p, o in self.upper.items() if o > self.lower.offset(p)]


def plan_batch(bindings: Bindings, resume_upper: IntoTime, max_batch: int) -> BatchRange | None:
    """The next batch from ``resume_upper`` on, or ``None`` when every binding is in every output."""
    pending = bindings.times(since=resume_upper)
    if not pending:
        return None
    lower = bindings.source_upper_at(resume_upper)
    binding_ts = pending[0]
    for t in pending[1:]:
        frontier = bindings.source_upper_at(t + 1)
        if frontier.is_closed or lower.count_to(frontier) > max_batch:
            break
        binding_ts = t
    upper = bindings.source_upper_at(binding_ts + 1)
    if upper.is_closed:
        upper = bindings.source_upper_at(binding_ts)
    return BatchRange(binding_ts, lower, upper)


def without_skips(splits: Sequence[Split], skips: list[Skip]) -> list[Split]:
    """``splits`` minus the skipped ranges, cut with ``dataclasses.replace`` (subclasses survive)."""
    if not skips:
        return list(splits)
    out: list[Split] = []
    for split in splits:
        pieces = [(split.start, split.end)]
        for skip in skips:
            if skip.partition != split.partition:
                continue
            pieces = [
                piece
                for start, end in pieces
                for piece in ((start, min(end, skip.start)), (max(start, skip.end), end))
                if piece[0] < piece[1]
            ]
        out += [split if (a, b) == (split.start, split.end) else replace(split, start=a, end=b) for a, b in pieces]
    return out
