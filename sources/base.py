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

Beyond :class:`Source`, what a source *can* do is a capability, a protocol of its own that the
runtime asks for with ``isinstance`` and never by sniffing attributes: :class:`GroupReads`,
:class:`SettableOffsets`, :class:`FileStates`, :class:`KeepsUnknownFields`, :class:`AsksFirst`,
:class:`GrowsOutputs`, :class:`AwaitsOutputs`, :class:`DistinctInserts` and, for the class,
:class:`TakesContext`. A source declares one by subclassing it (which also gives its defaults) or
by having its members; any class may, a plugin as much as a built-in. None hands the source
anything to call back: a source that needs the runtime to act says so in what it returns (the
:class:`Probe` of an :class:`AsksFirst` source), and the runtime acts.

The lineage and ``_errors`` names (:mod:`reclock.sources.records`) and :class:`SourceContext`
(:mod:`reclock.sources.context`) are defined below this module and imported from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from reclock.envelope import APPEND, Envelope
from reclock.errors import ContractError
from reclock.sources.context import SourceContext, parse_generations
from reclock.sources.records import (
    ERRORS,
    ERRORS_SCHEMA,
    LINEAGE_FIELDS,
    MAX_MESSAGE,
    RECORD_ERROR_POLICIES,
    RecordError,
    RecordErrorPolicy,
    check_record_error_policy,
    clip_message,
    debezium_schema,
    error_batch,
)
from reclock.timeline.frontier import Frontier, Offset, Partition, cap_frontier

__all__ = [
    "Answer",
    "AsksFirst",
    "AwaitsOutputs",
    "ERRORS",
    "ERRORS_SCHEMA",
    "LINEAGE_FIELDS",
    "MAX_MESSAGE",
    "RECORD_ERROR_POLICIES",
    "DistinctInserts",
    "Envelope",
    "FileStates",
    "GroupReads",
    "GrowsOutputs",
    "JoinedOutput",
    "KeepsUnknownFields",
    "LandFirst",
    "ListedFile",
    "Output",
    "Probe",
    "RecordError",
    "RecordErrorPolicy",
    "RunFirst",
    "SettableOffsets",
    "Source",
    "SourceBase",
    "SourceContext",
    "Split",
    "TakesContext",
    "cap_frontier",
    "check_record_error_policy",
    "clip_message",
    "debezium_schema",
    "error_batch",
    "parse_generations",
]


@dataclass(frozen=True)
class Output:
    """A subsource: one Delta table. ``schema`` holds only the output's own columns."""

    name: str
    schema: pa.Schema
    key: tuple[str, ...] = ()
    envelope: Envelope = APPEND


@dataclass(frozen=True)
class Split:
    """Picklable unit of work: offsets ``[start, end)`` of one partition (``end`` excluded).

    Sources may subclass it (as a frozen dataclass) to carry what their reader needs.
    """

    partition: Partition
    start: Offset
    end: Offset

    @property
    def stamp_at(self) -> Offset | None:
        """The offset every record of this split is stamped at, where that is not the record's own
        ``_offset``: a unit bound whole (a compressed file, bound at its compressed size) whose
        records are numbered finer than its binding. ``None``: each at its own offset."""
        return None

    @property
    def weight(self) -> int:
        """How much work the split is, in records or offsets: what a data plane weighs it by (a
        batch too small to pay a Spark job, tasks of like load). Its offsets, unless one offset
        stands for many records, as a snapshot chunk does (one offset, a hundred thousand rows)."""
        return self.end - self.start


@runtime_checkable
class Source(Protocol):
    """What the runtime needs from every source; :class:`SourceBase` gives defaults for the optional part.

    The driver calls :meth:`outputs`, :meth:`upper`, :meth:`cap`, :meth:`end`, :meth:`splits`,
    :meth:`commit` and :meth:`close`; Spark tasks call :meth:`read` on a pickled copy, so a source
    must pickle without its driver-side clients. Offsets are the source's own; a frontier maps
    each partition to the first offset *not* yet available. What only some sources do is a
    capability (the protocols below).
    """

    #: Whether :meth:`upper` may stop naming a partition it named before (a deleted file). The
    #: runtime then joins a probe with what is already bound; otherwise a probe below the bound
    #: frontier means the source was recreated, a definite error.
    forgets_partitions: bool

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
    #: :class:`GroupReads`' setting, so that a subclass that only adds ``read_group`` reads groups.
    parallel_reads: bool = False

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> SourceBase:
        """The source a pipeline definition describes: ``options`` are its ``[source]`` keys (less
        ``kind``). By default the constructor takes them and the context is not needed; override
        to take what the context offers (see :class:`TakesContext`)."""
        return cls(**options)

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

    def warnings(self) -> Sequence[str]:
        """Conditions worth an operator's attention that are not errors (``reclock status`` shows
        them); none by default."""
        return []

    def close(self) -> None:
        """Nothing to release by default."""


# -- capabilities: what some sources can do, asked for with isinstance ---------------------------


@runtime_checkable
class TakesContext(Protocol):
    """A source *class* built from a pipeline definition with the runtime's :class:`SourceContext`.

    Every :class:`SourceBase` is one (its default ignores the context); any other class is built
    with its ``[source]`` options as keyword arguments.
    """

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> Source:
        """The source ``options`` (the ``[source]`` keys, less ``kind``) describe, in ``context``."""
        ...


@runtime_checkable
class GroupReads(Protocol):
    """Reads a task's splits as one stream, whose batches may span splits.

    The data plane reads a task of several splits with :meth:`read_group` (the Kafka source
    decodes many small partitions together, the files source parses many small files at once),
    and falls back to :meth:`Source.read` split by split when it fails, to tell which splits fail.
    """

    #: Whether tasks may run in several threads of one process at once (the in-driver data plane
    #: then reads its tasks in parallel). Off unless a source says so.
    parallel_reads: bool = False

    def read_group(self, splits: Sequence[Split]) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Every record of ``splits`` once, as :meth:`Source.read` of each would give them."""
        ...


@runtime_checkable
class SettableOffsets(Protocol):
    """An offset names one record, so a user may move a partition to any offset (``reclock
    set-offsets``), and a failed record can be read alone again (``reclock redrive``).

    A byte offset into a file is not one: it would cut a record in two.
    """

    #: Whether a partition moved *below* what is bound is read again as a
    #: :class:`~reclock.timeline.frontier.Reread` partition: :meth:`Source.splits` and
    #: :meth:`Source.read` then take such partitions, reading the offsets of ``Reread.of``.
    rereads: bool = False

    def earliest(self, partitions: Sequence[Partition]) -> Mapping[Partition, Offset]:
        """The first offset each of ``partitions`` still has (Kafka's low watermarks); one the
        source cannot tell is left out (the default: none)."""
        return {}


@runtime_checkable
class FileStates(Protocol):
    """The source's partitions are files ``(path, generation)``: the job keeps their states.

    ``reclock files`` lists every file bound or listed now with its state (Loaded, Skipped,
    Unloaded, Ignored), the ``files`` status table records them, and ``reclock drop-file`` makes
    the runtime bump a file's generation in the lake, which the source reads through
    :meth:`SourceContext.generations`: the file comes back as the new partition
    ``(path, generation + 1)``, at offset 0.
    """

    def listing(self) -> Sequence[ListedFile]:
        """Every candidate file now, read or not, at its current generation; called by the CLI
        and on the driver, never on the batch path."""
        ...


@runtime_checkable
class DistinctInserts(Protocol):
    """Some of its batches only insert, each key once: a database's initial snapshot.

    An ``upsert`` or ``debezium`` output's commit is a MERGE, which looks every key of the batch
    up in the table. When the table holds no row yet and the batch's records of the output are
    inserts of distinct keys, the MERGE can only insert them all: the runtime then has the tasks
    write them as the table's own files and appends those in the batch's one labelled commit
    (:meth:`~reclock.persist.sink.OutputSink.commit`), the same rows for a fraction of the work.
    """

    def distinct_inserts(self, splits: Sequence[Split]) -> frozenset[str]:
        """The outputs whose records in ``splits``, all together, are inserts (never a delete, a
        truncate or a record of only nulls), no two of one key. Called on the driver with every
        split of a batch; a promise about what :meth:`Source.read` yields, so when in doubt an
        output is left out (its batch is then merged, as always)."""
        ...


# -- the probe: what a source found, and what the runtime must do before it can bind it --------


@dataclass(frozen=True)
class LandFirst:
    """Records readable only now, to be landed by the runtime before their binding exists.

    A database's initial snapshot is readable only through the snapshot its slot exported, which
    dies with the connection that exported it, and its rows must be durable before the binding
    that stamps them (a crash after the binding must replay the same rows). The runtime reserves
    the next into time ``T`` and runs the tasks of ``splits`` as the batch binding ``upper`` at
    ``T`` will (stamped, enveloped, shaped, routed, partitioned), leaves their files uncommitted,
    keeps what they wrote durable in its own state, and only then answers (:attr:`Answer.landed`):
    the source keeps the records readable until that answer. The runtime then mints ``upper`` at
    ``T``, and the batch of ``T`` commits the files the landing wrote instead of reading again the
    splits the source plans for it, which must be these.
    """

    upper: Frontier
    splits: tuple[Split, ...]


@dataclass(frozen=True)
class RunFirst:
    """Work outside any batch worth spreading over the pipeline's tasks (a joining table's copy,
    its chunks written by tasks): ``[fn(item) for item in items]``, computed where the pipeline's
    tasks run (Spark tasks on the Spark plane, the driver's threads otherwise) and answered in
    the items' order (:attr:`Answer.ran`). ``fn`` and the items must pickle, and ``fn`` should
    return its failures rather than raise them (an exception raised in a Spark task reaches the
    driver as Java's text, its kind lost)."""

    fn: Callable[[Any], Any]
    items: tuple[Any, ...]


@dataclass(frozen=True)
class Probe:
    """What a probe found: ``upper``, how far data exists now; or, while ``upper`` is ``None``, the
    one thing the runtime must do first (``land_first`` or ``run_first``), after which it probes
    again with the :class:`Answer`."""

    upper: Frontier | None = None
    land_first: LandFirst | None = None
    run_first: RunFirst | None = None

    def __post_init__(self) -> None:
        said = [name for name in ("upper", "land_first", "run_first") if getattr(self, name) is not None]
        if len(said) != 1:
            raise ContractError(f"a probe says exactly one of upper, land_first and run_first, not {said or 'none'}")


@dataclass(frozen=True)
class Answer:
    """The runtime's answer to a probe that asked it to act: for a :class:`LandFirst`, ``landed``,
    the records each split read, in the splits' order (the landing is durable in the runtime's
    state); for a :class:`RunFirst`, ``ran``, the results in the items' order."""

    landed: tuple[int, ...] | None = None
    ran: tuple[Any, ...] | None = None


@runtime_checkable
class AsksFirst(Protocol):
    """Its probe may need the runtime to act before it can say how far data exists: the Postgres
    source, whose snapshot is landed ahead of its binding and whose joining tables are copied by
    the pipeline's tasks.

    The runtime probes it with :meth:`probe` instead of :meth:`Source.upper`: first with no
    answer, then, for as long as a probe asks for something (:class:`LandFirst`,
    :class:`RunFirst`), again with the :class:`Answer` once that is done, until a probe reports its
    ``upper``. The source is handed nothing to call: it says what it needs and the runtime does it
    (Materialize's sources, likewise, return streams and receive ``resume_uppers``; they never call
    into the framework). A probe with no answer while a request waits for one means the runtime
    gave the request up (it failed, or another driver starts): the source starts that work over.
    :meth:`Source.upper`, for callers outside a pipeline, does such work itself.
    """

    def probe(self, answer: Answer | None) -> Probe:
        """How far data exists, or what the runtime must do first; called on the driver."""
        ...


@runtime_checkable
class KeepsUnknownFields(Protocol):
    """Hands on the fields a record has and its output does not declare (schema evolution)."""

    def keep_unknown_fields(self, outputs: Sequence[str]) -> None:
        """From now on, add each record's undeclared fields of ``outputs`` as one JSON object in
        :data:`~reclock.timeline.frontier.UNKNOWN_FIELDS`; a :class:`ConfigError` naming
        ``outputs.<name>.schema_evolution`` if an output's format has no such fields."""
        ...


@dataclass(frozen=True)
class JoinedOutput:
    """An output that joined the source after it was built, born at the into time of offset 0 of
    ``partition``: the binding that first holds that partition holds the output's first records
    (a table's snapshot), and the output holds nothing before it."""

    output: Output
    partition: Partition


@runtime_checkable
class GrowsOutputs(Protocol):
    """Gains outputs while it runs: the Postgres source, a table that joins the publication.

    :meth:`Source.outputs` names the outputs the source was built with; these come later. The
    runtime asks before it plans every batch (and when a pipeline is built): an output whose
    ``partition`` is bound is *born* at that binding ``T`` (the least binding time with
    ``0 < R(T)[partition]``). Its sink then commits an empty version labelled ``T - 1`` before
    any batch that reaches ``T``, so its upper is ``T``: it never holds the resume frontier back
    to the start, and a read as of a time before ``T`` finds it empty.

    A source must keep reporting a joined output once it did (a restart builds it again), and
    must produce no record of it at a partition and offset bound before ``T``.
    """

    def joined_outputs(self) -> Sequence[JoinedOutput]:
        """The outputs joined so far, beyond :meth:`Source.outputs`; called on the driver after a probe."""
        ...


@runtime_checkable
class AwaitsOutputs(Protocol):
    """Says, before an output joins, whether one of a name may ever join (a :class:`GrowsOutputs`
    source that follows something growing: the Postgres source with ``tables = [..., "*"]``).

    A definition may then configure such an output before it exists (``[outputs.<name>]``: its
    layout, its shaping and routes): ``create`` accepts the name, and the runtime applies what
    the definition says when the output is born. A name no output can ever have is refused at
    ``create`` as for any other source, so a typo is still caught where it can be.
    """

    def may_join(self, name: str) -> bool:
        """Whether an output named ``name``, not among the source's outputs now, may join later."""
        ...


@dataclass(frozen=True)
class ListedFile:
    """One candidate file as a :class:`FileStates` source sees it now.

    ``path`` is relative with ``/`` separators, ``generation`` its current one; ``upper`` is the
    offset after its last record (bytes, rows for Parquet), 0 for an ignored file; ``ignored``
    says why the source never reads it (``None`` when it does); ``settling`` that it is too
    recently modified to be taken yet.
    """

    path: str
    generation: int
    upper: int
    settling: bool = False
    ignored: str | None = None
