"""The contract between reclock and a source reader.

Shaped like PySpark 4's Python streaming data source (``latestOffset``, ``partitions``, ``read``,
``commit``) with reclock's vocabulary:

* :meth:`Source.upper` runs on the driver and *probes* how far data exists now, as a
  :class:`~reclock.timeline.frontier.Frontier` (offset = first offset **not** yet available).
* :meth:`Source.splits` cuts the records between two frontiers into picklable :class:`Split` s.
* :meth:`Source.read` runs in a Spark task and yields ``(output name, Arrow batch)`` pairs. It must
  be *replayable*: the same split returns the same records every time, which is what makes
  resumption exact. Every batch carries ``_partition`` (the encoded partition id, see
  :func:`~reclock.timeline.frontier.encode_partition`) and ``_offset`` (int64, the record's source offset)
  next to the output's own columns.
* :meth:`Source.commit` is told the resume frontier after each batch (advisory: a Kafka source
  commits it to its consumer group); resumption never reads it back.

Envelopes say what a record *means* for its output table (``Output.envelope``):

* ``append`` (default): every record is a new row.
* ``upsert``: the output's ``key`` columns identify a row; the latest record per key wins and a
  record whose non-key columns are all null (a Kafka tombstone) deletes the key, unless the batch
  carries an explicit boolean ``_deleted`` column.
* ``debezium``: batches carry the change-event columns of :func:`debezium_schema` (``before``,
  ``after``, ``op``); ``op = "d"`` deletes ``before``'s key, anything else upserts ``after``.

A record that cannot be decoded is not an exception: the reader yields it to :data:`ERRORS` with
its coordinates so that it is never silently lost, or raises :class:`RecordError` when its own
``on_record_error`` option says ``fail`` (sources that decode take that option).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import pyarrow as pa

from reclock.errors import ReclockError
from reclock.timeline.frontier import OFFSET, PARTITION, Frontier, Offset, Partition

__all__ = [
    "ERRORS",
    "ERRORS_SCHEMA",
    "LINEAGE_FIELDS",
    "MAX_MESSAGE",
    "Envelope",
    "Output",
    "RecordError",
    "Source",
    "SourceBase",
    "Split",
    "cap_frontier",
    "clip_message",
    "debezium_schema",
    "error_batch",
]

Envelope = Literal["append", "upsert", "debezium"]

#: Output name of the errors table every pipeline has; readers yield bad records to it.
ERRORS = "_errors"

#: Columns every batch from :meth:`Source.read` carries besides the output's own.
LINEAGE_FIELDS = (pa.field(PARTITION, pa.string(), nullable=False), pa.field(OFFSET, pa.int64(), nullable=False))

#: Longest ``message`` a reader writes to :data:`ERRORS`: a problem quoting a huge value stays readable.
MAX_MESSAGE = 500

ERRORS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("message", pa.string()),
        pa.field("raw", pa.binary()),
    ]
)


class RecordError(ReclockError):
    """A record could not be decoded and the pipeline asked to fail the batch."""


@dataclass(frozen=True)
class Output:
    """A subsource: one Delta table. ``schema`` holds only the output's own columns."""

    name: str
    schema: pa.Schema
    key: tuple[str, ...] = ()
    envelope: Envelope = "append"


@dataclass(frozen=True)
class Split:
    """Picklable unit of work: offsets ``[start, end)`` of one partition (``end`` excluded).

    Sources may subclass it (as a frozen dataclass) to carry what their reader needs.
    """

    partition: Partition
    start: Offset
    end: Offset


@runtime_checkable
class Source(Protocol):
    """What the runtime needs from a source; :class:`SourceBase` gives defaults for the optional part.

    The driver calls :meth:`outputs`, :meth:`upper`, :meth:`cap`, :meth:`end`, :meth:`splits`,
    :meth:`commit` and :meth:`close`; Spark tasks call :meth:`read` on a pickled copy, so a source
    must pickle without its driver-side clients. A source may also offer ``read_group(splits)``,
    the records of a task's splits as one stream whose batches may span splits (the Kafka source
    decodes many small partitions together that way); the data plane then reads a task with it,
    and falls back to :meth:`read` split by split when it fails, to tell which splits fail.
    Offsets are the source's own; a frontier maps
    each partition to the first offset *not* yet available.
    """

    #: Whether :meth:`upper` may stop naming a partition it named before (a deleted file). The
    #: runtime then joins a probe with what is already bound; otherwise a probe below the bound
    #: frontier means the source was recreated, a definite error.
    forgets_partitions: bool

    #: Whether partitions are files ``(path, generation)``: the job then keeps file states.
    is_file_source: bool

    def outputs(self) -> Sequence[Output]:
        """The output tables, fixed for the pipeline's life (``_errors`` is added by the runtime)."""
        ...

    def upper(self) -> Frontier:
        """How far data exists now: never goes back for a partition (unless it is forgotten)."""
        ...

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[Split]:
        """Picklable pieces of work covering exactly ``[lower, upper)`` of every partition."""
        ...

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Every record of ``split`` once, as ``(output, batch)`` with lineage columns; bad
        records go to :data:`ERRORS` at their coordinates. The same split reads the same rows."""
        ...

    def commit(self, frontier: Frontier) -> None:
        """Advisory: every output holds everything below ``frontier`` (a Kafka group commit)."""
        ...

    def cap(self, lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
        """Backpressure: an upper between ``lower`` and ``upper`` at most ``max_records`` past ``lower``."""
        ...

    def end(self) -> Frontier | None:
        """The final frontier of a bounded source once known; ``None`` while unbounded."""
        ...

    def close(self) -> None:
        """Release driver-side resources; called once when the pipeline stops running."""
        ...


class SourceBase:
    """Defaults for the optional parts of :class:`Source`; subclass and override what differs."""

    #: Largest number of offsets one split covers; bigger ranges are cut into several tasks.
    max_split_offsets: int = 1_000_000

    forgets_partitions: bool = False
    is_file_source: bool = False
    #: Whether :meth:`read` may run in several threads of one process at once (the in-driver
    #: data plane then reads splits in parallel). Off unless a source says so.
    parallel_reads: bool = False
    #: Whether an offset names one record, so a user may skip a partition ahead to any offset
    #: (``reclock set-offsets``). Off unless a source says so: a byte offset into a file would
    #: cut a record in two.
    settable_offsets: bool = False
    #: Whether the source reads a partition made by :func:`~reclock.timeline.frontier.reread` (``reclock
    #: set-offsets`` below what is bound): the same records again, under their own identity.
    rereads: bool = False

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[Split]:
        """One split per partition that advanced, cut at :attr:`max_split_offsets`."""
        out: list[Split] = []
        for partition, end in sorted(upper.items(), key=lambda item: repr(item[0])):
            start = lower.offset(partition)
            while start < end:
                stop = min(end, start + self.max_split_offsets)
                out.append(Split(partition, start, stop))
                start = stop
        return out

    def commit(self, frontier: Frontier) -> None:
        """Advisory; nothing to tell by default."""

    def cap(self, lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
        """Backpressure: at most ``max_records`` offsets past ``lower``, shared fairly."""
        return cap_frontier(lower, upper, max_records)

    def end(self) -> Frontier | None:
        """The final frontier of a bounded source once it is known; ``None`` while unbounded."""
        return None

    def close(self) -> None:
        """Nothing to release by default."""


def cap_frontier(lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
    """Water-fill ``max_records`` over the partitions between ``lower`` and ``upper``.

    Each lagging partition gets an equal share; what a short partition leaves over goes to the
    others, so the cap is reached whenever there is enough data and no partition starves.
    """
    lags = {p: o - lower.offset(p) for p, o in upper.items() if o > lower.offset(p)}
    if sum(lags.values()) <= max_records:
        return upper
    grant: dict[Partition, int] = {}
    budget = max_records
    pending = sorted(lags.items(), key=lambda item: item[1])
    while pending:
        share = budget // len(pending)
        p, lag = pending[0]
        if lag <= share:
            grant[p] = lag
            budget -= lag
            pending.pop(0)
            continue
        for i, (p, _) in enumerate(pending):
            grant[p] = share + (1 if i < budget - share * len(pending) else 0)
        break
    return lower.join(Frontier({p: lower.offset(p) + g for p, g in grant.items()}))


def debezium_schema(own: pa.Schema) -> pa.Schema:
    """The columns a ``debezium`` output's batches carry: the row before and after, and the op."""
    row = pa.struct(list(own))
    return pa.schema([pa.field("before", row), pa.field("after", row), pa.field("op", pa.string())])


def error_batch(
    partition: str | pa.Array,
    offsets: Sequence[Offset],
    kinds: Sequence[str],
    messages: Sequence[str],
    raws: Sequence[bytes | None],
) -> pa.RecordBatch:
    """The one builder of :data:`ERRORS` rows: lineage, then ``kind``, ``message`` and ``raw``.

    ``partition`` is already encoded: one string for every row (a reader's split), or a string
    array with one per row. Every record a reader rejects becomes such a row, at its own
    coordinates, so it is counted exactly once and never silently lost.
    """
    n = len(offsets)
    partitions = pa.array([partition] * n, pa.string()) if isinstance(partition, str) else partition
    return pa.RecordBatch.from_arrays(
        [
            partitions,
            pa.array(offsets, pa.int64()),
            pa.array(kinds, pa.string()),
            pa.array(messages, pa.string()),
            pa.array(raws, pa.binary()),
        ],
        schema=pa.schema([*LINEAGE_FIELDS, *ERRORS_SCHEMA]),
    )


def clip_message(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE` characters (ending in ``...`` when cut)."""
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
