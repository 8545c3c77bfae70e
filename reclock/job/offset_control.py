"""Offset control, after SingleStore's ``ALTER PIPELINE ... SET OFFSETS``: see and move where a
pipeline reads.

``reclock offsets`` shows, per source partition, the earliest and latest offsets the source has
now, how far bindings reach (*bound*), how far every output holds (*loaded*) and how many offsets
were skipped. ``reclock set-offsets`` skips a partition ahead, past records a user does not want
(a poison range, a backlog not worth loading).

A skip is never a side channel: it is one commit of the remap table holding a new binding that
moves only that partition *and* a skip of the range it passed over, so the next batch plans the
range, leaves it out like any skipped range and lands one ``_errors`` row (kind ``skipped``)
naming it, exactly once, with the batch. A crash cannot leave the binding without its skip, and
a second driver sees both or neither. The pipeline must not be running: the command holds the
job lock while it acts.

Going back (re-reading a range already loaded) would land those records a second time, which a
partition-and-offset model can only express as a new partition generation; files pipelines do
that per file with ``reclock drop-file``, and for other sources it is refused with that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from reclock.errors import ConfigError, ReclockError
from reclock.job import lifecycle
from reclock.job.control import exclusive, load
from reclock.persist.asof import output_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import REREAD_START, USER_SKIP, RemapTable, Skip
from reclock.sources.base import SettableOffsets, Source
from reclock.timeline.frontier import Frontier, Partition, Reread, decode_partition, encode_partition, wall_clock_ms
from reclock.timeline.lag import partition_lags
from reclock.timeline.resume import resume_frontier, resume_upper

__all__ = ["OffsetChange", "PartitionOffsets", "offsets", "set_offset"]


@dataclass(frozen=True)
class PartitionOffsets:
    """One row of ``reclock offsets``; ``earliest`` is ``None`` where the source cannot tell, and
    ``bound`` and ``loaded`` are ``None`` once the whole (bounded) source is bound or loaded."""

    partition: str
    earliest: int | None
    latest: int
    bound: int | None
    loaded: int | None
    skipped: int
    #: Offsets of ``latest`` not yet in every output (:func:`reclock.timeline.lag.partition_lags`).
    lag: int = 0


def offsets(lake: Lake, name: str) -> list[PartitionOffsets]:
    """Per partition, what the source has now against what the pipeline bound and loaded.

    Asks the source (a Kafka probe, a directory listing) once; read-only on the lake, so it may
    run beside the job.
    """
    config, created_at = load(lake, name)
    source = lifecycle.source_of(lake, name, config, created_at)
    try:
        remap = RemapTable(lake.remap_path(name), lake.store)
        bindings = remap.bindings
        uppers = [output_upper(lake.output_path(name, o), sink_id(name, o), lake.store) for o in lake.outputs(name)]
        loaded = resume_frontier(bindings, resume_upper(uppers))
        latest = source.upper()
        partitions = sorted({*latest.partitions(), *bindings.frontier.partitions()}, key=lambda p: (repr(type(p)), p))
        earliest = _earliest(source, partitions)
        skipped: dict[Partition, int] = {}
        for skip in remap.skips:
            if skip.reason != REREAD_START:  # offsets a re-read never had to load
                skipped[skip.partition] = skipped.get(skip.partition, 0) + skip.end - skip.start
        # A re-read partition ends where it is bound: no probe names it.
        newest = {p: bindings.frontier.offset(p) if isinstance(p, Reread) else latest.offset(p) for p in partitions}
        lags = partition_lags(loaded, Frontier(newest))
        return [
            PartitionOffsets(
                encode_partition(p),
                earliest.get(p),
                newest[p],
                None if bindings.frontier.is_closed else bindings.frontier.offset(p),
                None if loaded.is_closed else loaded.offset(p),
                skipped.get(p, 0),
                lags.get(p, 0),
            )
            for p in partitions
        ]
    finally:
        source.close()


@dataclass(frozen=True)
class OffsetChange:
    """What ``set-offsets`` recorded: offsets ``[start, end)`` of ``partition`` are skipped, or,
    with ``reread_as``, loaded again under that partition, in the batch ``binding_ts``."""

    partition: str
    start: int
    end: int
    binding_ts: int
    reread_as: str | None = None


def set_offset(
    lake: Lake, name: str, partition: str, offset: int, *, now: Callable[[], int] = wall_clock_ms
) -> OffsetChange:
    """Move ``partition`` to ``offset``: skip ahead, or (below what is bound) re-read from there.

    Either way one remap commit holds a binding and a skip. Refused, one line naming the field,
    when the pipeline is running, the partition is unknown or itself a re-read, the offset is
    past what the source has (the next probe would see the source behind its bindings), below
    what it still has, or below what is bound in a source that cannot re-read.
    """
    config, created_at = load(lake, name)
    lease = exclusive(lake, name)
    try:
        source = lifecycle.source_of(lake, name, config, created_at)
        try:
            if not isinstance(source, SettableOffsets):
                raise ConfigError(
                    "pipeline",
                    f"pipeline {name!r} reads files: skip or re-read whole files with reclock drop-file",
                )
            return _move(lake, name, source, partition, offset, now())
        finally:
            source.close()
    finally:
        lease.release()


def _move(lake: Lake, name: str, source: Source, text: str, offset: int, now: int) -> OffsetChange:
    remap = RemapTable(lake.remap_path(name), lake.store)
    bindings = remap.bindings
    if bindings.is_closed:
        raise ReclockError(f"pipeline {name!r} has read its whole source; its offsets cannot move")
    latest = source.upper()
    try:
        partition = decode_partition(text)
    except ValueError:
        partition = None
    known = {*latest.partitions(), *bindings.frontier.partitions()}
    if partition not in known:
        names = ", ".join(sorted(encode_partition(p) for p in known)[:5]) or "none yet"
        raise ConfigError("partition", f"pipeline {name!r} has no partition {text} (known: {names})")
    if isinstance(partition, Reread):
        raise ConfigError("partition", f"partition {text} is a re-read; move the partition it copies instead")
    bound = bindings.frontier.offset(partition)
    if offset == bound:
        raise ConfigError("offset", f"partition {text} is already at offset {offset}; nothing to move")
    if offset > latest.offset(partition):
        raise ConfigError(
            "offset", f"offset {offset} of partition {text} is past the source's latest, {latest.offset(partition)}"
        )
    time = max(now, bindings.upper)
    if offset > bound:
        frontier = bindings.frontier.join(Frontier({partition: offset}))
        skips = [Skip(time, partition, bound, offset, f"{USER_SKIP} by the user")]
        change = OffsetChange(text, bound, offset, time)
    else:
        frontier, skips, change = _reread(source, bindings.frontier, partition, text, offset, bound, time)
    if not remap.mint_with_skips(time, frontier, skips):
        raise ReclockError(f"pipeline {name!r}: another writer moved the remap table meanwhile; try again")
    return change


def _reread(
    source: Source, bound: Frontier, partition: Partition, text: str, offset: int, end: int, time: int
) -> tuple[Frontier, list[Skip], OffsetChange]:
    """A new re-read partition bound to ``end``, whose offsets below ``offset`` are never read."""
    if not isinstance(source, SettableOffsets) or not source.rereads:
        raise ConfigError(
            "offset",
            f"offset {offset} of partition {text} is below {end}, which is already bound: this source cannot "
            "re-read (files pipelines re-read whole files with reclock drop-file)",
        )
    earliest = _earliest(source, [partition]).get(partition)
    if earliest is not None and offset < earliest:
        raise ConfigError("offset", f"offset {offset} of partition {text} is below the source's earliest, {earliest}")
    copies = [p.generation for p in bound.partitions() if isinstance(p, Reread) and p.of == partition]
    copy = Reread(partition, max(copies, default=0) + 1)
    skips = [Skip(time, copy, 0, offset, REREAD_START)] if offset else []
    change = OffsetChange(text, offset, end, time, reread_as=encode_partition(copy))
    return bound.join(Frontier({copy: end})), skips, change


def _earliest(source: Source, partitions: list[Partition]) -> Mapping[Partition, int]:
    """The source's earliest offsets where it can tell (Kafka's low watermarks)."""
    return source.earliest(partitions) if isinstance(source, SettableOffsets) else {}
