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

from collections.abc import Callable
from dataclasses import dataclass

from reclock import job
from reclock.control import exclusive
from reclock.errors import ConfigError, ReclockError
from reclock.persist.asof import output_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import USER_SKIP, RemapTable, Skip
from reclock.resumption import resume_frontier, resume_upper
from reclock.time import Frontier, Partition, decode_partition, encode_partition, wall_clock_ms

__all__ = ["PartitionOffsets", "offsets", "set_offset"]


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


def offsets(lake: Lake, name: str) -> list[PartitionOffsets]:
    """Per partition, what the source has now against what the pipeline bound and loaded.

    Asks the source (a Kafka probe, a directory listing) once; read-only on the lake, so it may
    run beside the job.
    """
    config, created_at = job.load(lake, name)
    source = job.source_of(lake, name, config, created_at)
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
            skipped[skip.partition] = skipped.get(skip.partition, 0) + skip.end - skip.start
        return [
            PartitionOffsets(
                encode_partition(p),
                earliest.get(p),
                latest.offset(p),
                None if bindings.frontier.is_closed else bindings.frontier.offset(p),
                None if loaded.is_closed else loaded.offset(p),
                skipped.get(p, 0),
            )
            for p in partitions
        ]
    finally:
        source.close()


def set_offset(lake: Lake, name: str, partition: str, offset: int, *, now: Callable[[], int] = wall_clock_ms) -> Skip:
    """Skip ``partition`` ahead to ``offset``: one remap commit with a binding and its skip.

    Refused, one line naming the field, when the pipeline is running, the partition is unknown,
    the offset is below what is already bound (that would re-read) or past what the source has
    (the next probe would see the source behind its bindings).
    """
    config, created_at = job.load(lake, name)
    lock = exclusive(lake, name)
    try:
        source = job.source_of(lake, name, config, created_at)
        try:
            if not getattr(source, "settable_offsets", False):
                raise ConfigError(
                    "pipeline",
                    f"pipeline {name!r} reads files: skip or re-read whole files with reclock drop-file",
                )
            return _skip_ahead(lake, name, source.upper(), partition, offset, now())
        finally:
            source.close()
    finally:
        lock.close()


def _skip_ahead(lake: Lake, name: str, latest: Frontier, text: str, offset: int, now: int) -> Skip:
    remap = RemapTable(lake.remap_path(name), lake.store)
    bindings = remap.bindings
    if bindings.is_closed:
        raise ReclockError(f"pipeline {name!r} has read its whole source; there is nothing to skip")
    try:
        partition = decode_partition(text)
    except ValueError:
        partition = None
    known = {*latest.partitions(), *bindings.frontier.partitions()}
    if partition not in known:
        names = ", ".join(sorted(encode_partition(p) for p in known)[:5]) or "none yet"
        raise ConfigError("partition", f"pipeline {name!r} has no partition {text} (known: {names})")
    bound = bindings.frontier.offset(partition)
    if offset < bound:
        raise ConfigError(
            "offset",
            f"offset {offset} of partition {text} is below {bound}, which is already bound: re-reading "
            "would land those records twice (only files pipelines re-read, per file, with reclock drop-file)",
        )
    if offset == bound:
        raise ConfigError("offset", f"partition {text} is already at offset {offset}; nothing to skip")
    if offset > latest.offset(partition):
        raise ConfigError(
            "offset", f"offset {offset} of partition {text} is past the source's latest, {latest.offset(partition)}"
        )
    time = max(now, bindings.upper)
    skip = Skip(time, partition, bound, offset, f"{USER_SKIP} by the user")
    if not remap.mint_with_skips(time, bindings.frontier.join(Frontier({partition: offset})), [skip]):
        raise ReclockError(f"pipeline {name!r}: another writer moved the remap table meanwhile; try again")
    return skip


def _earliest(source: object, partitions: list[Partition]) -> dict[Partition, int]:
    """The source's earliest offsets where it can tell (Kafka's low watermarks)."""
    earliest = getattr(source, "earliest", None)
    return earliest(partitions) if earliest is not None else {}
