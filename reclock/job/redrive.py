"""Re-driving ``_errors``: once a decoder or a schema is fixed, land the records that failed.

``reclock redrive NAME`` reads the record-level rows of a stopped pipeline's ``_errors`` output
(not skipped ranges: those were never read), reads each record again from the source at its
coordinates, with the definition as it is *now* (``reclock create --replace`` after a fix), and
lands the ones that decode into their output.

A re-driven record keeps its place on the timeline: its ``_into_ts`` is its ``_errors`` row's,
the time its offset was bound, so every later as-of read sees it where it would have been had
it decoded the first time. Reads as of a time before the redrive do change; that is the point
(a correction), and the ``_errors`` row stays as the record of what happened.

Exactly once: each output is one append commit, and before it the output is read for the
coordinates about to land (only at the into times concerned, which the files' statistics
narrow), so a record already re-driven, by this run before a crash or by an earlier one, is
never landed twice. Records that still fail stay in ``_errors`` only, and a later redrive tries
them again. ``upsert`` and ``debezium`` outputs are not re-driven (their MERGE is a batch's), nor
are partitioned outputs (their files are cut by partition in the batch's write).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from reclock.job import lifecycle
from reclock.job.control import exclusive, load
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.persist.remap import RemapTable
from reclock.persist.sink import append_unlabelled, table_schema, write_data_file
from reclock.runtime.rows import output_rows
from reclock.sources.base import ERRORS, SettableOffsets, Source
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION, Frontier, Partition, decode_partition

__all__ = ["RedriveReport", "redrive"]

#: ``_errors`` kinds that are not records which failed to decode: nothing to read again.
NOT_RECORDS = frozenset({"skipped", "offset_lost"})


@dataclass
class RedriveReport:
    """What a redrive did: rows landed per output, and the records it did not land, by reason."""

    landed: dict[str, int] = field(default_factory=dict)
    already: int = 0  # landed by an earlier redrive
    still_bad: int = 0  # fail again with the definition as it is now
    not_append: int = 0  # decode now, but into an upsert, debezium or partitioned output
    gone: int = 0  # the source no longer has them (Kafka retention, a deleted file)


def redrive(lake: Lake, name: str, on_progress: Callable[[int, int], None] | None = None) -> RedriveReport:
    """Land what the current definition decodes of the stopped pipeline's failed records.

    ``on_progress(done, total)`` hears how many of the failed records were read again so far.
    """
    config, created_at = load(lake, name)
    lease = exclusive(lake, name)
    try:
        failed = _failed_records(lake, name)
        report = RedriveReport()
        if not failed:
            return report
        source = lifecycle.source_of(lake, name, config, created_at)
        try:
            bound = RemapTable(lake.remap_path(name), lake.store).bindings.frontier
            decoded = _read_again(source, failed, bound, report, on_progress or (lambda done, total: None))
            outputs = {o.name: o for o in source.outputs()}
        finally:
            source.close()
        for output, rows in decoded.items():
            layout = config.layouts.get(output)
            if outputs[output].envelope != "append" or (layout is not None and layout.partition_by):
                report.not_append += rows.num_rows
                continue
            rows = _not_landed(lake, name, output, rows, report)
            if rows.num_rows:
                path = lake.output_path(name, output)
                data = write_data_file(path, output, rows, lake.store)
                append_unlabelled(path, [data], lake.store, note=f"redrive of {rows.num_rows} records from _errors")
                report.landed[output] = rows.num_rows
        return report
    finally:
        lease.release()


def _failed_records(lake: Lake, name: str) -> dict[tuple[Partition, int], int]:
    """``(partition, offset) -> _into_ts`` of every record-level ``_errors`` row."""
    path = lake.output_path(name, ERRORS)
    if not lake.store.is_table(path):
        return {}
    rows = read_table(lake.store.open_table(path), columns=[PARTITION, OFFSET, INTO_TS, "kind"], store=lake.store)
    rows = rows.filter(pc.invert(pc.is_in(rows["kind"], pa.array(sorted(NOT_RECORDS)))))
    return {
        (decode_partition(p), o): t
        for p, o, t in zip(*(rows[c].to_pylist() for c in (PARTITION, OFFSET, INTO_TS)), strict=True)
    }


def _read_again(
    source: Source,
    failed: dict[tuple[Partition, int], int],
    bound: Frontier,
    report: RedriveReport,
    on_progress: Callable[[int, int], None],
) -> dict[str, pa.Table]:
    """The failed records read and decoded again, as output rows stamped with their old into time.

    A source whose offsets are records (Kafka) reads each record alone; one whose offsets are
    bytes of a file reads the file as bound and keeps the failed records' rows.
    """
    by_partition: dict[Partition, list[int]] = defaultdict(list)
    for partition, offset in failed:
        by_partition[partition].append(offset)
    schemas = {o.name: table_schema(o.schema) for o in source.outputs()}
    pieces: dict[str, list[pa.Table]] = defaultdict(list)
    decoded = gone = done = 0
    for partition, offsets in by_partition.items():
        if isinstance(source, SettableOffsets):
            ranges, each = [(o, o + 1) for o in sorted(offsets)], 1
        else:
            ranges, each = [(0, bound.offset(partition))], len(offsets)
        for start, end in ranges:
            try:
                splits = source.splits(Frontier({partition: start}), Frontier({partition: end}))
                batches = [b for split in splits for b in source.read(split)]
            except Exception:  # the source lost them (retention, a deleted file): counted, not fatal
                gone += sum(start <= o < end for o in offsets)
                batches = []
            for output, batch in batches:
                if output == ERRORS:
                    continue
                keys = [
                    (decode_partition(p), o)
                    for p, o in zip(batch[PARTITION].to_pylist(), batch[OFFSET].to_pylist(), strict=True)
                ]
                keep = [key in failed for key in keys]
                if not any(keep):
                    continue
                into = pa.array([failed[key] for key, k in zip(keys, keep, strict=True) if k], pa.int64())
                pieces[output].append(output_rows(batch.filter(pa.array(keep)), into, schemas[output]))
                decoded += sum(keep)
            done += each
            on_progress(done, len(failed))
    report.gone = gone
    report.still_bad = len(failed) - decoded - gone
    return {output: pa.concat_tables(tables) for output, tables in pieces.items()}


def _not_landed(lake: Lake, name: str, output: str, rows: pa.Table, report: RedriveReport) -> pa.Table:
    """``rows`` minus the coordinates ``output`` holds already (an earlier redrive landed them)."""
    times = sorted(set(rows[INTO_TS].to_pylist()))
    table = lake.store.open_table(lake.output_path(name, output))
    held = read_table(table, columns=[PARTITION, OFFSET], filters=[(INTO_TS, "in", times)], store=lake.store)
    landed = set(zip(held[PARTITION].to_pylist(), held[OFFSET].to_pylist(), strict=True))
    keep = [(p, o) not in landed for p, o in zip(rows[PARTITION].to_pylist(), rows[OFFSET].to_pylist(), strict=True)]
    report.already += keep.count(False)
    return rows.filter(pa.array(keep))
