"""The Postgres source itself: :class:`PostgresSource` wires the stages into the source contract.

**Source time is the commit LSN.** The source has one partition, :data:`WAL`. A change's
``_offset`` is its transaction's commit LSN (``Begin.final_lsn``), the same for every change of the
transaction in every table, so a transaction is complete at a binding whole or not at all and all
its rows get one ``_into_ts``. Below the slot's consistent point the offsets are the snapshot's
chunks (:mod:`~reclock.sources.postgres.snapshot`).

* ``upper`` (the probe, on the driver): the server's ``pg_current_wal_flush_lsn()``: every
  transaction whose commit record starts below it is durable and will be sent by the slot. It
  moves with any WAL the server writes, so an idle source's frontier moves too.
  The first probe captures the snapshot: it asks the pipeline to land its chunks ahead in the
  outputs (the source :class:`~reclock.sources.base.AsksFirst`, its probe a
  :class:`~reclock.sources.base.LandFirst`; probed without a pipeline, :meth:`PostgresSource.upper`
  copies them into chunk files itself), and asks its tasks to copy a joining table
  (a :class:`~reclock.sources.base.RunFirst`).
* ``splits``: one split per snapshot chunk, and one replication range ``[lower, upper)`` (a slot
  is read by one connection at a time, so the range is not cut).
* ``read``: a chunk from the exported snapshot while it is landed ahead, or from its captured
  file; a range from the slot
  (:mod:`~reclock.sources.postgres.stream`); both replayable.
* ``commit`` (the offset committer): moves the slot's ``confirmed_flush_lsn`` to the resume
  frontier's LSN, which the runtime gives only after every output committed it
  (``pg_replication_slot_advance``). The server then frees the WAL below it.

Outputs: one per table, named ``<schema>_<table>``; ``upsert`` by the replica identity's key
(the primary key) or ``append`` change rows (see :mod:`~reclock.sources.postgres.changes`).
A table the definition selects after the first start (``tables = ["*"]``: the publication's)
joins: the probe copies it and it becomes an output at one binding
(:mod:`~reclock.sources.postgres.joining`; the source :class:`~reclock.sources.base.GrowsOutputs`,
and :class:`~reclock.sources.base.AwaitsOutputs`: a definition may configure such an output
before it joins); one that leaves the publication stops its output, and joins again with a fresh
copy that replaces the output's rows if it comes back (:mod:`~reclock.sources.postgres.leaving`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from reclock.envelope import UPSERT
from reclock.errors import ConfigError, DefiniteSourceError
from reclock.sources.base import (
    AsksFirst,
    AwaitsOutputs,
    DistinctInserts,
    GroupReads,
    GrowsOutputs,
    JoinedOutput,
    Output,
    SourceBase,
    SourceContext,
    Split,
    check_record_error_policy,
)
from reclock.sources.postgres.catalog import (
    TableSpec,
    check_wal_level,
    describe,
    ensure_publication,
    pinned,
    pinned_tables,
)
from reclock.sources.postgres.changes import ChangeBatches
from reclock.sources.postgres.chunks import chunk_batches
from reclock.sources.postgres.clients import SlotInUse, connect, server_errors
from reclock.sources.postgres.config import PostgresOptions, may_name_a_table, slot_name
from reclock.sources.postgres.joining import (
    JoinCapture,
    Joined,
    JoinedBatches,
    JoinedChunkSplit,
    ReplaceSplit,
    load_joins,
    published,
    replacement,
)
from reclock.sources.postgres.leaving import Left, load_left
from reclock.sources.postgres.pgoutput import lsn_text
from reclock.sources.postgres.probing import WAL, ChunkSplit, PostgresProbe
from reclock.sources.postgres.snapshot import (
    Capture,
    Chunk,
    Manifest,
    copy_in_turn,
    copy_rows,
    read_chunk,
)
from reclock.sources.postgres.stream import read_range
from reclock.sources.state import StateFolder
from reclock.timeline.frontier import Frontier, Partition, encode_partition

__all__ = ["WAL", "ChunkSplit", "PostgresSource", "RangeSplit"]

log = logging.getLogger("reclock.sources.postgres")


@dataclass(frozen=True)
class RangeSplit(Split):
    """The transactions committed in ``[start, end)``, read from the slot."""


class PostgresSource(PostgresProbe, SourceBase, GroupReads, GrowsOutputs, AwaitsOutputs, DistinctInserts, AsksFirst):
    """Tables of one PostgreSQL database, through one slot and one publication (module docstring)."""

    #: A task's copies wait on the server and write parquet outside the GIL, its ranges on the
    #: slot's connection: the in-driver plane reads several tasks at once (:class:`GroupReads`).
    parallel_reads = True

    #: Rows per Arrow batch a read yields (bounded memory per task).
    flush_rows: int = 50_000

    def __init__(
        self,
        dsn: str,
        *,
        tables: Sequence[str],
        envelope: str = UPSERT,
        slot: str | None = None,
        publication: str | None = None,
        snapshot: bool = True,
        snapshot_chunk_pages: int = 256,
        read_timeout_s: float = 30.0,
        feedback_interval_s: float = 1.0,
        state_dir: str | StateFolder | None = None,
        on_record_error: str = "skip",
    ) -> None:
        if slot is None or publication is None:
            raise ConfigError("slot", "name the slot and the publication (a pipeline's default is reclock_<pipeline>)")
        self.options = PostgresOptions.check(
            dsn=dsn,
            tables=tables,
            envelope=envelope,
            slot=slot,
            publication=publication,
            snapshot=snapshot,
            snapshot_chunk_pages=snapshot_chunk_pages,
            read_timeout_s=read_timeout_s,
            feedback_interval_s=feedback_interval_s,
        )
        if (
            state_dir is not None
            and not isinstance(state_dir, StateFolder)
            and (not isinstance(state_dir, str) or not state_dir)
        ):
            raise ConfigError("state_dir", f"must be a folder's path or an s3:// URI, got {state_dir!r}")
        self.state = StateFolder.at(state_dir) if isinstance(state_dir, str) else state_dir
        self.on_record_error = check_record_error_policy(on_record_error)
        kept = pinned_tables(self.state)
        conn = connect(self.options.dsn, timeout_s=self.options.read_timeout_s)
        try:
            with server_errors(self.options.slot, self.options.publication), conn.cursor() as cur:
                check_wal_level(cur)
                now = describe(cur, self.options.tables, self.options.envelope)
                ensure_publication(cur, self.options.publication, self.options.tables)
                if self.options.whole_publication:  # the publication's other tables: at the first start
                    listed = published(cur, self.options.publication) if kept is None else sorted(kept)
                    now += describe(cur, [t for t in listed if t not in self.options.tables], self.options.envelope)
        finally:
            conn.close()
        made = pinned(self.state, now)
        #: The initial tables: those of the first start (their rows in the slot's snapshot).
        self.specs: tuple[TableSpec, ...] = tuple(s for s in made if kept is None or s.table in kept)
        #: Tables joined since (manifest written), and those an explicit list names that must join.
        self.joins: tuple[Joined, ...] = load_joins(self.state)
        self._named_later = tuple(s.table for s in made if kept is not None and s.table not in kept)
        live = {spec.output: spec for spec in now}
        #: Outputs whose key is their table's unique key now, as when they were made.
        self._unique = frozenset(
            spec.output for spec in self.specs if spec.output in live and spec.key == live[spec.output].key
        )
        #: Removals from the publication (:mod:`~reclock.sources.postgres.leaving`), as noticed.
        self.leaves: tuple[Left, ...] = load_left(self.state)
        self._unknown: frozenset[str] = frozenset()
        self._manifest: Manifest | None = None
        #: The capture whose probe waits for the pipeline's answer (driver-side: it holds the
        #: connection that exported its snapshot).
        self._waiting: Capture | JoinCapture | None = None

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> PostgresSource:
        """The pipeline's source: slot and publication ``reclock_<pipeline>`` unless named, the
        snapshot kept in the pipeline's folder of the lake (local or in object storage, reached
        with the lake's storage options), the pipeline's ``on_record_error``."""
        name = slot_name(context.pipeline)
        state = None if context.state_path is None else StateFolder.at(context.state_path, context.state_options)
        defaults = {"slot": name, "publication": name, "state_dir": state}
        return cls(**{**defaults, **options, "on_record_error": context.on_record_error})

    def __getstate__(self) -> dict[str, Any]:
        """A task's copy: without the capture the driver holds open (its exporting connection)."""
        state = dict(self.__dict__)
        state["_waiting"] = None
        return state

    # -- the Source protocol --------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        return [spec.as_output(self.options.envelope) for spec in self.specs]

    def joined_outputs(self) -> Sequence[JoinedOutput]:
        """The tables joined so far, each an output born at its first copy's partition
        (:mod:`~reclock.sources.postgres.joining`; a table's return lands in the output it has)."""
        return [JoinedOutput(j.spec.as_output(self.options.envelope), j.partition) for j in self.joins if not j.rejoin]

    def may_join(self, name: str) -> bool:
        """:class:`~reclock.sources.base.AwaitsOutputs`: with ``"*"``, any ``<schema>_<table>``
        name may join (a table added to the publication later); with a list, none."""
        return self.options.whole_publication and may_name_a_table(name)

    def keep_unknown_fields(self, outputs: Sequence[str]) -> None:
        """Columns added to these outputs' tables go on as unknown fields (``schema_evolution``);
        also of an output that may join later (:meth:`may_join`), from its copy on."""
        known = {spec.output for spec in self._read_specs}
        unknown = [name for name in outputs if name not in known and not self.may_join(name)]
        if unknown:
            raise ConfigError(f"outputs.{unknown[0]}.schema_evolution", f"the source has no output {unknown[0]!r}")
        self._unknown = frozenset(outputs)

    def cap(self, lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
        """A binding takes the whole probe, except that the snapshot is bound alone: the first
        binding's frontier is the slot's consistent point, so every chunk lands at one into time
        (a cut of the database at that point) and the first batch holds nothing but chunks,
        which :meth:`distinct_inserts` can promise are inserts of distinct keys. Otherwise never
        cut: offsets are WAL bytes, not records, and a range is read from the slot whole anyway;
        ``max_batch`` still bounds how many bindings a catch-up batch groups (``max_batch = 1``:
        one batch per binding, so that every binding time is a cut of upsert outputs, see
        docs/sources/postgres.md).

        A returning table's copy is not bound with a change of the table from before it left (at
        the same into time, such a change would sort after the copy in an upsert MERGE and bring
        back rows deleted while it was out): while the WAL lower is below the removal's ``M``,
        the binding is ``[lower, M)`` alone (:mod:`~reclock.sources.postgres.leaving`)."""
        manifest = self._manifest
        if manifest is not None and manifest.chunks:
            consistent = manifest.consistent_lsn
            if lower.offset(WAL) < consistent < upper.offset(WAL):
                return Frontier({WAL: consistent})
        removals = {(left.output, left.returns + 1): left.lsn for left in self.leaves}
        held = [
            removals[(j.spec.output, j.rejoin)]
            for j in self.joins
            if j.rejoin and lower.offset(j.partition) == 0 < upper.offset(j.partition)
        ]
        held = [lsn for lsn in held if lower.offset(WAL) < lsn]
        if held:
            assert min(held) <= upper.offset(WAL), "a return's copy is probed with a WAL upper past its removal"
            return Frontier({**{p: lower.offset(p) for p, _ in upper.items()}, WAL: min(held)})
        return upper

    def distinct_inserts(self, splits: Sequence[Split]) -> frozenset[str]:
        """:class:`~reclock.sources.base.DistinctInserts`: a batch of snapshot chunks only (the
        first binding's, see :meth:`cap`) inserts each row of a table once, and an ``upsert``
        output's key is its table's primary key or replica identity index, unique: its outputs,
        if that key is still the one the outputs were made for (a key pinned at the first start
        and since changed on the server promises nothing). A batch with a replication range
        may update or delete any key: none."""
        if self.options.envelope != UPSERT or not splits:
            return frozenset()
        chunks = [split.chunk for split in splits if isinstance(split, ChunkSplit) and split.chunk is not None]
        if len(chunks) < len(splits):
            return frozenset()
        return frozenset(chunk.output for chunk in chunks) & self._unique

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[Split]:
        manifest = self._captured()
        start, end = lower.offset(WAL), upper.offset(WAL)
        out: list[Split] = [
            ChunkSplit(WAL, i, i + 1, chunk, manifest.consistent_lsn)
            for i, chunk in enumerate(manifest.chunks)
            if start <= i < end
        ]
        for joined in self.joins:
            low, high = lower.offset(joined.partition), upper.offset(joined.partition)
            if joined.rejoin and low == 0 < high:
                out.append(ReplaceSplit(joined.partition, 0, 1, joined.spec.output, joined.consistent_lsn))
            out += [
                JoinedChunkSplit(joined.partition, at, at + 1, chunk, joined.consistent_lsn)
                for at, chunk in enumerate(joined.chunks, start=joined.first)
                if low <= at < high
            ]
        begin = max(start, manifest.consistent_lsn)
        if begin < end:
            out.append(RangeSplit(WAL, begin, end))
        return out

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The rows of a chunk, or the changes of a range; the same for the same split."""
        if isinstance(split, ChunkSplit) and split.copy is not None:
            spec = next(spec for spec in self._read_specs if spec.output == split.copy.spec.output)
            yield from self._chunk_batches(
                copy_rows(split.copy), spec, split.partition, split.start, split.consistent_lsn
            )
            return
        if isinstance(split, ChunkSplit | JoinedChunkSplit):
            assert split.chunk is not None
            if not split.chunk.file:
                raise DefiniteSourceError(
                    f"snapshot chunk {split.start} of output {split.chunk.output} was landed ahead of its binding, "
                    "read once from the snapshot its slot exported, which is gone: it cannot be read again"
                )
            yield from self._read_chunk(split.partition, split.start, split.chunk, split.consistent_lsn)
            return
        if isinstance(split, ReplaceSplit):
            spec = next(spec for spec in self._read_specs if spec.output == split.output)
            partition = encode_partition(split.partition)
            yield from replacement(spec, self.options.envelope, partition, split.consistent_lsn, self._unknown)
            return
        batches = self._batches(WAL, split.start)
        yield from read_range(
            self.options.dsn,
            self.options.slot,
            self.options.publication,
            self._read_specs,
            batches,
            split.start,
            split.end,
            read_timeout_s=self.options.read_timeout_s,
            feedback_interval_s=self.options.feedback_interval_s,
        )

    def read_group(self, splits: Sequence[Split]) -> Iterator[tuple[str, pa.RecordBatch]]:
        """A task's splits: the snapshot chunks it lands ahead copied in turn through one
        connection (:func:`~reclock.sources.postgres.snapshot.copy_in_turn`), so small chunks,
        which balance tasks, cost little each; any other split as :meth:`read` gives it."""
        copies = [s for s in splits if isinstance(s, ChunkSplit) and s.copy is not None]
        specs = {spec.output: spec for spec in self._read_specs}
        for chunk, rows in zip(copies, copy_in_turn([s.copy for s in copies if s.copy is not None]), strict=True):
            assert chunk.copy is not None
            yield from self._chunk_batches(
                rows, specs[chunk.copy.spec.output], chunk.partition, chunk.start, chunk.consistent_lsn
            )
        for split in splits:
            if not (isinstance(split, ChunkSplit) and split.copy is not None):
                yield from self.read(split)

    def _read_chunk(
        self, partition: Partition, offset: int, chunk: Chunk, consistent_lsn: int
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """A chunk's rows (of the snapshot, or of a joined table's copy), typed column by column
        (:mod:`~reclock.sources.postgres.chunks`): the rows the stream's path gives for them as
        one transaction at the chunk's offset."""
        assert self.state is not None, "a chunk split is made only once the snapshot is captured"
        spec = next(spec for spec in self._read_specs if spec.output == chunk.output)
        yield from self._chunk_batches(read_chunk(self.state, chunk), spec, partition, offset, consistent_lsn)

    def _chunk_batches(
        self, rows: pa.Table, spec: TableSpec, partition: Partition, offset: int, consistent_lsn: int
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        yield from chunk_batches(
            rows,
            spec,
            self.options.envelope,
            encode_partition(partition),
            offset,
            consistent_lsn,
            fail=self.on_record_error == "fail",
            unknown=self._unknown,
        )

    def commit(self, frontier: Frontier) -> None:
        """Confirm the slot up to the resume frontier (advisory: a failure is logged, and the
        next batch confirms further). The batch's reader closed its replication connection a
        moment ago and the server may not have let go of the slot yet, so a busy slot is asked
        again until ``read_timeout_s``."""
        target = frontier.offset(WAL)
        manifest = self._manifest
        if manifest is None or target <= manifest.consistent_lsn:
            return
        deadline = time.monotonic() + self.options.read_timeout_s
        while True:
            try:
                self._advance(target)
                return
            except SlotInUse as exc:
                if time.monotonic() > deadline:
                    log.warning("could not confirm slot %s to %s: %s", self.options.slot, lsn_text(target), exc)
                    return
                time.sleep(0.05)
            except Exception as exc:  # advisory: never fails a batch that is already durable
                log.warning("could not confirm slot %s to %s: %s", self.options.slot, lsn_text(target), exc)
                return

    def _advance(self, target: int) -> None:
        """``pg_replication_slot_advance`` to ``target``, never backwards."""
        conn = connect(self.options.dsn, timeout_s=self.options.read_timeout_s)
        try:
            with server_errors(self.options.slot, self.options.publication), conn.cursor() as cur:
                cur.execute(
                    "SELECT pg_replication_slot_advance(%s, %s::pg_lsn) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND confirmed_flush_lsn < %s::pg_lsn",
                    (self.options.slot, lsn_text(target), self.options.slot, lsn_text(target)),
                )
        finally:
            conn.close()

    def __repr__(self) -> str:
        tables = [t.qualified for t in self.options.tables]
        return f"PostgresSource(tables={tables!r}, slot={self.options.slot!r}, envelope={self.options.envelope!r})"

    # -- internals ------------------------------------------------------------------------------

    def _spans(self) -> dict[str, list[tuple[int, int | None]]]:
        """Per output, the commit LSNs whose changes it reads: one span per stint of its table in
        the publication, from its copy's point (0 for an initial table) to its removal."""
        starts: dict[str, list[int]] = {spec.output: [0] for spec in self.specs}
        for j in sorted(self.joins, key=lambda j: j.rejoin):
            starts.setdefault(j.spec.output, []).append(j.consistent_lsn)
        ends: dict[str, list[int]] = {}
        for left in sorted(self.leaves, key=lambda left: left.returns):
            ends.setdefault(left.output, []).append(left.lsn)
        spans: dict[str, list[tuple[int, int | None]]] = {}
        for output, lows in starts.items():
            highs = [*ends.get(output, []), None]
            spans[output] = [(low, highs[i] if i < len(highs) else None) for i, low in enumerate(lows)]
        return spans

    def _batches(self, partition: Partition, start: int = 0) -> ChangeBatches:
        """A reader's batches of ``partition`` from offset ``start``; a table's changes outside its
        stints in the publication are dropped (an output read on from before ``start`` drops none)."""
        return JoinedBatches(
            self._read_specs,
            self.options.envelope,
            encode_partition(partition),
            live={
                output: spans
                for output, spans in self._spans().items()
                if not any(low <= start and high is None for low, high in spans)
            },
            flush_rows=self.flush_rows,
            fail=self.on_record_error == "fail",
            unknown=self._unknown,
        )
