"""Redrives in a batch: records from ``_errors`` read again and landed through the batch's own path.

A redrive (:class:`~reclock.persist.remap.Redrive`, requested by ``reclock redrive``, see
:mod:`reclock.job.redrive`) names records of a partition that went to ``_errors`` and the binding
whose batch lands them again. That batch plans them as extra splits (:func:`redrive_splits`)
beside its live ones; a task reads each again from the source, keeps only the named records
(:meth:`RedriveSplit.kept`) and lands them like any record of the batch, stamped with the
redrive's binding time: the same decode, shape, route, partition and commit, so shaped, routed
and partitioned outputs get them, and windows see them in the window of that into time.

Their coordinates (``_partition``, ``_offset``) stay their own. A record went to ``_errors``
instead of the outputs it failed for, so landing it there later duplicates nothing; its
``_errors`` row stays as the history of what happened. Only outputs it failed for get it
(:func:`redriven_routes`): a record that failed one route's transform and landed in another
lands in the first only. The binding is new and its frontier the one before, so no live record
shares its into time, and every read as of an earlier time, every window already emitted, stays.

Which range is read again: a source whose offsets name records
(:class:`~reclock.sources.base.SettableOffsets`) reads the runs of redriven offsets (runs fewer
than :data:`GAP` offsets apart as one read); any other reads the range of the binding that first
bound each record, as that batch did (a file: the whole file, as bound). A source that re-reads
(its ``rereads``, Kafka) reads it the way a set-offsets re-read does, exactly the range with no
start position applying, and its rows keep the name of the partition they were read from.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from reclock.persist.remap import Redrive, Skip
from reclock.runtime.shaping import Route
from reclock.sources.base import SettableOffsets, Source, Split, error_batch
from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import OFFSET, PARTITION, Frontier, IntoTime, Offset, Partition, Reread, encode_partition

__all__ = ["GAP", "NOT_REDRIVEN", "UNREADABLE", "RedriveSplit", "redrive_splits", "redriven_routes", "refusal_rows"]

#: Offsets between two runs below which a source that reads by offset reads both in one go.
GAP = 4096

#: ``kind`` of the ``_errors`` row of a redriven record an output it failed for cannot take now.
NOT_REDRIVEN = "not_redriven"
#: ``kind`` of the ``_errors`` row of a redriven record the source cannot read any more.
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class RedriveSplit(Split):
    """A range read again for a redrive: ``[start, end)`` of ``partition`` by the source's own
    ``split``, of which the records in ``runs`` land at ``into`` in ``outputs`` (empty: every
    output their records route to)."""

    split: Split
    runs: tuple[tuple[Offset, Offset], ...]
    into: IntoTime
    outputs: tuple[str, ...] = ()

    def kept(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` that are redriven records, under this split's partition name."""
        offsets = np.asarray(batch.column(OFFSET).to_numpy(zero_copy_only=False), dtype=np.int64)
        starts = np.array([a for a, _ in self.runs], dtype=np.int64)
        ends = np.array([b for _, b in self.runs], dtype=np.int64)
        run = np.searchsorted(starts, offsets, side="right") - 1
        keep = (run >= 0) & (offsets < ends[np.maximum(run, 0)])
        if not keep.all():
            batch = batch.filter(pa.array(keep))
        if self.split.partition != self.partition and batch.num_rows:
            name = pa.array([encode_partition(self.partition)] * batch.num_rows, batch.schema.field(PARTITION).type)
            batch = batch.set_column(batch.schema.get_field_index(PARTITION), PARTITION, name)
        return batch

    def unreadable(self, why: str) -> pa.RecordBatch:
        """One ``_errors`` row per redriven record, for a range the source cannot read any more."""
        offsets = [o for a, b in self.runs for o in range(a, b)]
        message = f"not redriven: the source cannot read it again: {why}"
        n = len(offsets)
        return error_batch(encode_partition(self.partition), offsets, [UNREADABLE] * n, [message] * n, [None] * n)


def redrive_splits(
    source: Source,
    bindings: Bindings,
    redrives: Sequence[Redrive],
    skips: Sequence[Skip],
    *,
    between: tuple[IntoTime, IntoTime],
) -> list[RedriveSplit]:
    """The splits that read again the ``redrives`` of a batch's bindings, ``between`` its lower
    and upper binding time (both included; see the module docstring), minus any range a failed
    attempt of the batch recorded as skipped. A pure function of the remap table, so a replayed
    batch reads and lands the same records."""
    runs: dict[tuple[IntoTime, Partition, tuple[str, ...]], list[tuple[Offset, Offset]]] = defaultdict(list)
    for r in redrives:
        if between[0] <= r.binding_ts <= between[1]:
            runs[(r.binding_ts, r.partition, r.outputs)].append((r.start, r.end))
    by_offset = isinstance(source, SettableOffsets)
    again = isinstance(source, SettableOffsets) and source.rereads
    skipped = {(s.partition, s.start, s.end) for s in skips}
    out: list[RedriveSplit] = []
    for (into, partition, outputs), wanted in runs.items():
        merged = _merged(wanted, 1)
        ranges = _merged(merged, GAP) if by_offset else _bound_ranges(bindings, partition, merged)
        # A re-read reads exactly the range of ``of``, whatever its generation; the rows take
        # back their own partition's name (:meth:`RedriveSplit.kept`).
        read_as = Reread(partition, 1) if again and not isinstance(partition, Reread) else partition
        for lo, hi in ranges:
            for split in source.splits(Frontier({read_as: lo}), Frontier({read_as: hi})):
                mine = tuple(
                    (max(a, split.start), min(b, split.end)) for a, b in merged if a < split.end and b > split.start
                )
                if mine and (partition, split.start, split.end) not in skipped:
                    out.append(RedriveSplit(partition, split.start, split.end, split, mine, into, outputs))
    return out


def redriven_routes(
    output: str,
    routes: Mapping[str, tuple[Route, ...]],
    envelopes: Mapping[str, tuple[str, tuple[str, ...]]],
    wanted: tuple[str, ...],
) -> tuple[list[Route], list[tuple[str, str]]]:
    """The routes of source output ``output`` a redriven record lands through, and the outputs it
    was redriven into that cannot take it, with why.

    ``wanted`` names the outputs the record failed for (empty: it failed to decode, so every
    route). An upsert or debezium output is refused: its key's latest record wins by into time,
    so an old record landing at a new into time would overwrite the key's later updates.
    """
    mine = routes.get(output, (Route(output),))
    targets = [r for r in mine if not wanted or r.output in wanted]
    refused = [
        (
            r.output,
            f"is {envelopes[r.output][0]}: a record landing at a later into time would overwrite "
            "its key's later updates",
        )
        for r in targets
        if r.output in envelopes
    ]
    names = {r.output for r in mine}
    refused += [(name, f"no longer takes the records of output {output!r}") for name in wanted if name not in names]
    return [r for r in targets if r.output not in envelopes], refused


def refusal_rows(batch: pa.RecordBatch, refused: list[tuple[str, str]]) -> pa.RecordBatch | None:
    """``_errors`` rows (kind :data:`NOT_REDRIVEN`) of ``batch``'s records for each refused output."""
    if not refused or not batch.num_rows:
        return None
    partitions = pa.concat_arrays([batch.column(PARTITION)] * len(refused))
    offsets = batch.column(OFFSET).to_pylist() * len(refused)
    messages = [f"output {name!r} {why}" for name, why in refused for _ in range(batch.num_rows)]
    n = len(offsets)
    return error_batch(partitions, offsets, [NOT_REDRIVEN] * n, messages, [None] * n)


def _merged(runs: Sequence[tuple[Offset, Offset]], gap: int) -> list[tuple[Offset, Offset]]:
    """``runs`` sorted, with runs fewer than ``gap`` offsets apart joined."""
    out: list[tuple[Offset, Offset]] = []
    for a, b in sorted(runs):
        if out and a - out[-1][1] < gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _bound_ranges(
    bindings: Bindings, partition: Partition, runs: list[tuple[Offset, Offset]]
) -> list[tuple[Offset, Offset]]:
    """The ranges of the bindings that bound ``runs``: what their batches read of ``partition``."""
    ranges: list[tuple[Offset, Offset]] = []
    for a, b in runs:
        position = a
        while position < b:
            time = bindings.reclock(partition, position)
            assert time is not None, f"a redrive names offset {position} of {partition!r}, which no binding covers"
            lo = bindings.source_upper_at(time).offset(partition)
            hi = bindings.source_upper_at(time + 1).offset(partition)
            if not ranges or ranges[-1] != (lo, hi):
                ranges.append((lo, hi))
            position = hi
    return ranges
