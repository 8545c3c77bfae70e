"""Bindings: the in-memory view of a remap collection.

A *binding* ``(T, F)`` says that every record complete at ``F`` and not complete at any earlier
binding has into time ``T``. Bindings strictly increase in ``T`` and their frontiers never regress,
so ``R(T)`` (the frontier of the last binding at or below ``T``) is monotone in ``T``. The initial
frontier, before any binding, is the empty one: nothing is complete.

Reclock rule: record ``(p, o)`` gets the least binding time ``T`` with ``o < R(T).offset(p)``;
beyond the newest binding it has no into time yet and waits (``None``), it never gets a guess.

Inversion: ``source_upper_at(U) = R(U - 1)``, the frontier of the last binding strictly below the
into-time upper ``U``. Compaction to ``since`` merges the bindings at or below ``since`` into one
binding at ``since``, which commutes with reclocking: every time at or below ``since`` becomes
``since`` whether you reclock first or compact first.

Lookups are O(log n) in the number of bindings: next to the list of bindings we keep, per
partition, the offsets at which that partition's upper changed and the time it changed at.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

from reclock.timeline.frontier import Frontier, IntoTime, Offset, Partition
from reclock.timeline.stamp import Stamper

__all__ = ["Bindings"]


class Bindings:
    """An append-only, compactable sequence of bindings ``(T, R(T))``."""

    def __init__(self) -> None:
        self._times: list[IntoTime] = []
        self._frontiers: list[Frontier] = []
        # Per partition, parallel lists: strictly increasing uppers and the first time each held.
        self._changes: dict[Partition, tuple[list[Offset], list[IntoTime]]] = {}
        self._closed_at: IntoTime | None = None
        self._since: IntoTime = 0

    # -- reading -------------------------------------------------------------------------------

    @property
    def upper(self) -> IntoTime:
        """The first into time not yet bound: last binding's time + 1 (0 when empty)."""
        return self._times[-1] + 1 if self._times else 0

    @property
    def since(self) -> IntoTime:
        """Times at or below ``since`` have been merged; reads below it are not distinguished."""
        return self._since

    @property
    def frontier(self) -> Frontier:
        """The newest binding's frontier: how far the source has been bound."""
        return self._frontiers[-1] if self._frontiers else Frontier()

    @property
    def is_closed(self) -> bool:
        return self._closed_at is not None

    def __iter__(self) -> Iterator[tuple[IntoTime, Frontier]]:
        return iter(zip(self._times, self._frontiers, strict=True))

    def __len__(self) -> int:
        return len(self._times)

    def times(self, since: IntoTime = 0) -> list[IntoTime]:
        """Binding times at or after ``since``, oldest first: O(log n) plus what is returned."""
        return self._times[bisect_left(self._times, since) :]

    def reclock(self, partition: Partition, offset: Offset) -> IntoTime | None:
        """Into time of record ``(partition, offset)``, or ``None`` while no binding covers it."""
        change = self._changes.get(partition)
        if change is not None:
            uppers, times = change
            i = bisect_right(uppers, offset)
            if i < len(uppers):
                return times[i]
        return self._closed_at

    def source_upper_at(self, upper: IntoTime) -> Frontier:
        """``R(upper - 1)``: where a consumer whose into-time upper is ``upper`` resumes."""
        i = bisect_left(self._times, upper) - 1
        return self._frontiers[i] if i >= 0 else Frontier()

    def into_upper_of(self, frontier: Frontier) -> IntoTime:
        """Least binding time whose frontier is not ``<= frontier``; else :attr:`upper`.

        Everything a consumer holding exactly ``frontier`` has is bound strictly below it.
        """
        lo, hi = 0, len(self._frontiers)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._frontiers[mid].less_equal(frontier):
                lo = mid + 1
            else:
                hi = mid
        return self._times[lo] if lo < len(self._times) else self.upper

    def stamper(self, *, after: IntoTime | None = None, partitions: Iterable[Partition] | None = None) -> Stamper:
        """A picklable, vectorised form of :meth:`reclock` for Spark tasks.

        With ``after``, bindings at or below it collapse into one at ``after`` (a compaction), so
        a batch ships only the bindings it can need; rows below the batch's lower frontier then
        stamp at ``after`` or lower, which the caller treats as already durable.
        """
        wanted = self._changes.keys() if partitions is None else [p for p in partitions if p in self._changes]
        entries = {}
        for p in wanted:
            uppers, times = self._changes[p]
            start = 0
            if after is not None:
                start = max(0, bisect_right(times, after) - 1)
            entries[p] = (uppers[start:], [max(t, after) if after is not None else t for t in times[start:]])
        return Stamper(entries, self._closed_at)

    # -- writing -------------------------------------------------------------------------------

    def mint(self, time: IntoTime, frontier: Frontier) -> None:
        """Append binding ``(time, frontier)``.

        Raises ``ValueError`` if ``time`` does not increase or ``frontier`` regresses; the same
        frontier at a later time is allowed (into time advances while the source is idle).
        """
        if not isinstance(time, int) or time < 0:
            raise ValueError(f"binding time must be an int >= 0, got {time!r}")
        if time < self.upper:
            raise ValueError(f"binding time {time} does not advance past the upper {self.upper}")
        if not self.frontier.less_equal(frontier):
            raise ValueError(f"frontier {frontier!r} regresses from {self.frontier!r}")
        self._times.append(time)
        self._frontiers.append(frontier)
        if frontier.is_closed:
            if self._closed_at is None:
                self._closed_at = time
            return
        for p, offset in frontier.items():
            change = self._changes.get(p)
            if change is None:
                self._changes[p] = ([offset], [time])
            elif offset > change[0][-1]:
                change[0].append(offset)
                change[1].append(time)

    def compact(self, since: IntoTime) -> None:
        """Merge every binding at or below ``since`` into one binding at ``since``.

        ``since`` must stay below :attr:`upper` (a reader can only be as of a bound time).
        """
        if since <= self._since:
            return
        if since >= self.upper:
            raise ValueError(f"cannot compact to {since}: the upper is {self.upper}")
        self._since = since
        k = bisect_right(self._times, since)
        if k == 0:
            return
        merged = self._frontiers[k - 1]
        self._times[:k] = [since]
        self._frontiers[:k] = [merged]
        for uppers, times in self._changes.values():
            j = bisect_right(times, since)
            if j:
                del uppers[: j - 1]
                del times[: j - 1]
                times[0] = since
        if self._closed_at is not None and self._closed_at < since:
            self._closed_at = since

    def __repr__(self) -> str:
        return f"Bindings({list(self)!r}, since={self._since})"
