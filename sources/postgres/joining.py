"""Tables that join the publication while the pipeline runs: found by the probe, copied at their
own consistent point, and born as outputs at one binding, while the other tables go on.

**Which tables join.** A definition selects its explicit ``tables`` and, with ``"*"`` among them,
every table of the publication. The tables it selected at its first start are its *initial*
tables (their specs pinned in ``tables.json``, their rows in the slot's snapshot). Any table
selected later (``ALTER PUBLICATION ... ADD TABLE`` or ``CREATE TABLE`` under a ``FOR ALL
TABLES`` publication, with ``"*"``; a name added to an explicit list at a restart) *joins*. So
does a table back in the publication after it left it, into the output it has, its copy
replacing the output's rows (:mod:`~reclock.sources.postgres.leaving`).

**Its copy, at its own consistent point ``C``.** The publication sends a table's changes from the
commit of the ``ALTER PUBLICATION`` (``J``) on, and its rows before ``J`` are in no WAL the slot
sends. The pipeline's slot cannot export a snapshot after its creation, so the driver's probe
creates a **temporary** slot with ``EXPORT_SNAPSHOT``: its snapshot sees exactly the transactions
whose commit LSN is below ``C``, and those at or after ``C`` are streamed by the pipeline's slot
(``C`` is after ``J``). The table is cut into chunks copied by the pipeline's tasks with the
initial snapshot's machinery (:func:`~reclock.sources.postgres.snapshot.copy_chunk`), and the
manifest ``joins/<output>.json`` (the table's spec as the snapshot sees it, ``C``, the chunks) is
written **last**: the probe asks the pipeline to run the copies (:class:`~reclock.sources.base.RunFirst`)
and writes it with the answer (:class:`JoinCapture`). The spec is read under the snapshot, so it is
the definition of the copy's rows: columns added, dropped or retyped before ``C`` are simply the
output's. The temporary slot goes with its connection, also when the process dies. A crash before
the manifest bound nothing: the next probe copies again at a new ``C`` (the files of the dead
attempt are deleted first; a late task of it writes a file no manifest names).

**The stream below ``C`` is skipped.** The snapshot holds every change of the table committed
below ``C``; the reader drops them (:class:`JoinedBatches`), and keeps those at or after ``C``.
Those below ``C`` may come under an older definition of the table than the spec's: their
``Relation`` is no error (:meth:`JoinedBatches.drops`); from ``C`` on the table's changes meet
the rules of every table (an added column follows ``schema_evolution``, a dropped or retyped one
is a definite error naming the table).
This is exact because the output holds nothing before the binding it is born at (below).

**Bound at one binding.** The chunks are partition ``snapshot:<schema.table>``, offsets the chunk
indexes. The probe reports it only once its manifest is written, and in the same frontier as a
WAL upper at or past ``C``, so the first binding that holds the partition holds the whole copy and
every change of the table from ``C`` to that WAL upper, at one into time ``T_join``. Every earlier
binding's WAL upper was probed before the temporary slot existed, so it is at most ``C``: no
change of the table is bound before ``T_join``. In an upsert output's MERGE the copy's records
(offsets: chunk indexes) sort before the stream's (offsets: commit LSNs, above ``C``).

**Born at ``T_join``.** The source reports the table as a
:class:`~reclock.sources.base.JoinedOutput` of that partition (:class:`~reclock.sources.base.GrowsOutputs`);
the runtime gives it a sink with an empty version labelled ``T_join - 1`` before the batch that
holds ``T_join``, so its upper never holds the resume frontier back, and a read as of a time
before ``T_join`` finds it empty. The manifest pins the table's spec: a restart reads it back, so
the output's columns and the replay of its WAL stay the first ones (``tables.json`` stays the
initial tables', written at the first start).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from reclock.errors import ConfigError, DefiniteSourceError
from reclock.sources.base import Split
from reclock.sources.postgres.catalog import TableSpec, describe, spec_json, spec_of_json
from reclock.sources.postgres.changes import Change, ChangeBatches
from reclock.sources.postgres.clients import connect, server_errors
from reclock.sources.postgres.config import TableName
from reclock.sources.postgres.leaving import changed_while_out, replaces
from reclock.sources.postgres.pgoutput import parse_lsn
from reclock.sources.postgres.snapshot import CHUNKS, CaptureFailed, Chunk, ChunkOffset, ChunkTask, copied, plan_chunks
from reclock.sources.state import StateFolder

__all__ = [
    "JOINS",
    "Joined",
    "JoinedBatches",
    "JoinCapture",
    "JoinedChunkSplit",
    "ReplaceSplit",
    "capture_join",
    "load_joins",
    "published",
    "replacement",
    "snapshot_partition",
]

#: The folder of the joined tables' manifests, one ``<output>.json`` each (``<output>@<n>.json``
#: for its ``n``-th return, :mod:`~reclock.sources.postgres.leaving`).
JOINS = "joins"
_ATTEMPT = "join"


def snapshot_partition(table: TableName, rejoin: int = 0) -> str:
    """The partition of a joined table's copy: ``snapshot:<schema.table>``, offsets chunk indexes
    (``snapshot:<schema.table>@<n>`` for the copy of its ``n``-th return)."""
    return f"snapshot:{table.qualified}" + (f"@{rejoin}" if rejoin else "")


@dataclass(frozen=True)
class Joined:
    """A table that joined: its spec when it was copied, the copy's consistent point, its chunks;
    ``rejoin`` counts its returns after leaving the publication (0: its first join)."""

    spec: TableSpec
    consistent_lsn: int
    chunks: tuple[Chunk, ...]
    rejoin: int = 0

    @property
    def partition(self) -> str:
        return snapshot_partition(self.spec.table, self.rejoin)

    @property
    def first(self) -> int:
        """The offset of chunk 0: a return's offset 0 is the replacement (:class:`ReplaceSplit`)."""
        return 1 if self.rejoin else 0

    @property
    def upper(self) -> int:
        """The partition's upper once the copy is whole."""
        return self.first + len(self.chunks)

    @property
    def manifest(self) -> str:
        return f"{JOINS}/{self.spec.output}" + (f"@{self.rejoin}" if self.rejoin else "") + ".json"

    def to_json(self) -> str:
        return json.dumps(
            {
                "spec": spec_json(self.spec),
                "consistent_lsn": self.consistent_lsn,
                "chunks": [[c.output, c.file, c.rows] for c in self.chunks],
                "rejoin": self.rejoin,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Joined:
        data = json.loads(text)
        chunks = tuple(Chunk(*c) for c in data["chunks"])
        return cls(spec_of_json(data["spec"]), data["consistent_lsn"], chunks, data.get("rejoin", 0))


@dataclass(frozen=True)
class JoinedChunkSplit(ChunkOffset):
    """Chunk ``start - first`` of a joined table's copy (partition :func:`snapshot_partition`)."""


@dataclass(frozen=True)
class ReplaceSplit(Split):
    """Offset 0 of a returning table's copy: one ``TRUNCATE`` of its output at the copy's point,
    so the copy after it replaces what the output held when the table left
    (:mod:`~reclock.sources.postgres.leaving`)."""

    output: str = ""
    consistent_lsn: int = 0


def load_joins(state: StateFolder | None) -> tuple[Joined, ...]:
    """The joined tables whose manifest is written, in the order they joined."""
    if state is None:
        return ()
    joins = []
    for name in state.files(JOINS):
        text = state.read_text(f"{JOINS}/{name}") if name.endswith(".json") else None
        if text is not None:
            joins.append(Joined.from_json(text))
    return tuple(sorted(joins, key=lambda j: (j.consistent_lsn, j.spec.table, j.rejoin)))


def published(cursor: Any, publication: str) -> list[TableName]:
    """The tables ``publication`` publishes now (a ``FOR ALL TABLES`` one: every table), sorted."""
    cursor.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,))
    return sorted(TableName(s, n) for s, n in cursor.fetchall())


class JoinCapture:
    """A joining table's copy under way: its temporary slot's snapshot exported on the connection
    held open here, its chunks planned (:attr:`tasks`), waiting for the pipeline's tasks to copy
    them (:func:`~reclock.sources.postgres.snapshot.copy_chunk`). Driver-side only."""

    def __init__(self, exporting: Any, joined: Joined, tasks: list[ChunkTask], state: StateFolder) -> None:
        self._exporting = exporting
        self._joined = joined
        self.tasks = tasks
        self._state = state

    def copied(self, done: Sequence[Chunk | CaptureFailed]) -> Joined:
        """Step 5: the manifest, last and whole, once every chunk is copied; the first failure
        raised with its kind (transient: the copy starts over at the next probe)."""
        self.abandon()  # the copies joined the snapshot: the temporary slot may go with it
        table = self._joined.spec.table
        chunks = copied(done, f"the copy of joining table {table.qualified} failed, it starts over")
        assert chunks, "a table's copy has at least one chunk (possibly empty): its partition must be bound"
        joined = replace(self._joined, chunks=tuple(chunks))
        self._state.write_bytes(joined.manifest, joined.to_json().encode())
        return joined

    def abandon(self) -> None:
        """Let the snapshot and the temporary slot go: the next probe copies again."""
        self._exporting.close()


def capture_join(
    dsn: str,
    slot: str,
    publication: str,
    envelope: str,
    table: TableName,
    state: StateFolder,
    *,
    chunk_pages: int,
    rejoin: int = 0,
    output_spec: TableSpec | None = None,
) -> JoinCapture:
    """Start copying ``table`` at the consistent point of a temporary slot (see the module
    docstring): its chunks planned for the pipeline's tasks. Called by the driver's probe.

    ``rejoin``: the table's ``n``-th return, whose output exists with ``output_spec``: a copy of
    other columns or another key cannot replace its rows, a definite error naming the table
    (:func:`~reclock.sources.postgres.leaving.changed_while_out`)."""
    prefix = f"{_ATTEMPT}{rejoin or ''}-"
    output = f"-{table.schema}_{table.name}.parquet"
    # Step 1: the files of an attempt that died before its manifest go (those of this join or
    # return only: an earlier one's chunks stay, named by its manifest).
    for name in state.files(CHUNKS):
        if name.startswith(prefix) and name.endswith(output):
            state.delete(f"{CHUNKS}/{name}")
    with server_errors(slot, publication):
        # Step 2: a temporary slot exports the snapshot at C; its connection stays open (and runs
        # nothing else) until every task joined the snapshot, then the slot goes with it.
        exporting = connect(dsn, replication=True)
        try:
            with exporting.cursor() as cur:
                temporary = f"{slot[:40]}_join_{secrets.token_hex(4)}"
                cur.execute(f"CREATE_REPLICATION_SLOT {temporary} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT")
                _, consistent_point, snapshot_name, _ = cur.fetchone()
            consistent = parse_lsn(consistent_point)
            # Step 3: the table as the snapshot sees it: the columns of the copy's rows, which the
            # output is made for and the manifest pins, whatever changed since it joined.
            spec = _described_at(dsn, snapshot_name, table, envelope)
            if output_spec is not None and not replaces(spec, output_spec):
                raise changed_while_out(spec, output_spec, publication)
            attempt = f"{prefix}{consistent:016X}"
            # Step 4: the chunks, for the tasks to copy.
            tasks = plan_chunks(dsn, slot, publication, snapshot_name, attempt, [spec], state, chunk_pages)
        except BaseException:
            exporting.close()
            raise
    return JoinCapture(exporting, Joined(spec, consistent, (), rejoin), tasks, state)


def _described_at(dsn: str, snapshot: str, table: TableName, envelope: str) -> TableSpec:
    """``table``'s spec in the exported ``snapshot``: its catalog rows are read under the snapshot
    the copy's rows are, so a column added, dropped or retyped before ``C`` is the output's as the
    copy has it, and one changed at or after ``C`` reaches the stream as for any table."""
    conn = connect(dsn)
    try:
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
            try:
                (spec,) = describe(cur, [table], envelope)
            except ConfigError as exc:
                raise DefiniteSourceError(f"table {table.qualified} joined the publication: {exc.reason}") from None
        conn.rollback()
    finally:
        conn.close()
    return spec


class JoinedBatches(ChangeBatches):
    """:class:`ChangeBatches` that keeps a table's changes only while its output reads them
    (``live``: output -> its spans ``[from, to)`` of commit LSNs, ``to`` ``None`` while it reads
    on): from each copy's consistent point ``C`` (the copy holds those below it) to the removal
    the probe noticed after it (``M``, :mod:`~reclock.sources.postgres.leaving`). An output not
    in ``live`` reads every change."""

    def __init__(
        self,
        specs: Sequence[TableSpec],
        envelope: str,
        partition: str,
        *,
        live: Mapping[str, Sequence[tuple[int, int | None]]],
        **options: Any,
    ) -> None:
        super().__init__(specs, envelope, partition, **options)
        self.live = {output: tuple(spans) for output, spans in live.items()}

    def takes_columns(self, output: str) -> bool:
        """Not a table whose changes may need dropping: :meth:`transaction` drops them, by the
        commit LSN of each (a range within one open span has none such)."""
        return output not in self.live and super().takes_columns(output)

    def drops(self, output: str, lsn: int) -> bool:
        """Outside every span of ``output``."""
        spans = self.live.get(output)
        return spans is not None and not any(low <= lsn and (high is None or lsn < high) for low, high in spans)

    def transaction(
        self, offset: int, lsn: int, xid: int | None, changes: Sequence[tuple[str, Change]]
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        if self.live:
            changes = [(output, change) for output, change in changes if not self.drops(output, lsn)]
        yield from super().transaction(offset, lsn, xid, changes)


def replacement(
    spec: TableSpec, envelope: str, partition: str, lsn: int, unknown: Collection[str]
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The rows of a :class:`ReplaceSplit`: a ``TRUNCATE`` of ``spec``'s table at offset 0 and
    commit LSN ``lsn`` (the copy's point), exactly as the stream's path lands one: an ``upsert``
    output's ``_truncated`` record (its MERGE deletes every row no later record writes), an
    ``append`` output's ``op = 't'`` row (a consumer replaying the changes empties the table
    there, and the copy's ``r`` rows that follow fill it again)."""
    batches = ChangeBatches([spec], envelope, partition, unknown=unknown)
    yield from batches.transaction(0, lsn, None, [(spec.output, Change("t", None, None))])
    yield from batches.finish()
