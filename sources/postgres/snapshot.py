"""The initial copy of the tables, consistent with the slot, captured once by tasks and bound whole.

**Consistent.** The slot is created with ``EXPORT_SNAPSHOT``: the server answers the slot's
consistent point (an LSN) and a snapshot that sees exactly the transactions committed before it.
The stream of the slot starts at that point, so the snapshot plus every transaction the slot
sends is the database, once, with nothing between (Materialize's ``snapshot.rs`` does the same).

**Captured by tasks.** The driver creates the slot and keeps the exporting connection open (an
exported snapshot lives only as long as it, and only while it runs no other command); it cuts
every table into chunks of ``snapshot_chunk_pages`` heap pages (``ctid`` ranges, the last one
open-ended) and hands them to the pipeline's tasks (:data:`~reclock.sources.base.TaskRunner`:
Spark tasks on the Spark plane, the driver's threads otherwise). Each task opens its own
connection, joins the snapshot (``SET TRANSACTION SNAPSHOT``), copies its range, types its
columns (:func:`~reclock.sources.postgres.chunks.typed_chunk`: all of them, or none if a value
does not type) and writes it as one parquet file into the pipeline's folder of the lake
(:class:`StateFolder`, local or S3).

**Captured once.** Only when every task succeeded does the driver write the manifest (the slot,
its consistent point, the chunks), last and whole. A crash before it bound nothing: the next
start drops the slot and the partial chunks and captures again, at a new slot; no row of the
first attempt ever reached an output, so nothing can land twice (the duplication of Materialize
#13749 came from a second snapshot *after* the first was bound). A chunk's file name carries its
attempt (the consistent point), so a task of a dead attempt that finishes late writes a file no
manifest names. After the manifest the snapshot is never taken again: chunks are read back from
the files, the same rows every time.

**Bound whole.** Chunk ``i`` is offset ``i`` of the source's one partition (there are far fewer
chunks than the consistent point's LSN, below which the stream has nothing), and the source's
``cap`` never cuts below the consistent point, so every chunk of every table lands at the first
binding, at one into time, and each chunk is a split of its own: a Spark task.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.csv as pacsv

from reclock.errors import DefiniteSourceError
from reclock.sources.base import Split, TaskRunner
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.chunks import typed_chunk
from reclock.sources.postgres.clients import PostgresUnavailable, connect, server_errors
from reclock.sources.postgres.pgoutput import parse_lsn
from reclock.sources.postgres.state import StateFolder

__all__ = [
    "Chunk",
    "ChunkOffset",
    "ChunkTask",
    "Manifest",
    "capture",
    "copied",
    "copy_chunk",
    "load",
    "plan_chunks",
    "read_chunk",
]

MANIFEST = "snapshot.json"
CHUNKS = "chunks"


@dataclass(frozen=True)
class Chunk:
    """One captured piece of one table: its rows in ``file`` (relative), typed or as texts."""

    output: str
    file: str
    rows: int


@dataclass(frozen=True)
class ChunkOffset(Split):
    """A split of one captured chunk, at its offset (the chunk's index), with the slot's point it
    was copied at: of the snapshot or of a joined table's copy."""

    chunk: Chunk | None = None
    consistent_lsn: int = 0

    @property
    def weight(self) -> int:
        """Its rows: a chunk is one offset, and its work is its rows (a batch of five chunks of
        100,000 rows is no small batch for a data plane)."""
        return self.chunk.rows if self.chunk is not None else 1


@dataclass(frozen=True)
class Manifest:
    slot: str
    consistent_lsn: int
    chunks: tuple[Chunk, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "slot": self.slot,
                "consistent_lsn": self.consistent_lsn,
                "chunks": [[c.output, c.file, c.rows] for c in self.chunks],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(data["slot"], data["consistent_lsn"], tuple(Chunk(*c) for c in data["chunks"]))


@dataclass(frozen=True)
class ChunkTask:
    """One chunk to copy, everything its task needs: pages ``[low, high)`` of ``spec``'s table
    (``high`` ``None``: to the table's end) in the exported ``snapshot``, as chunk ``index``."""

    dsn: str
    slot: str
    publication: str
    snapshot: str
    attempt: str
    spec: TableSpec
    index: int
    low: int
    high: int | None
    state: StateFolder


@dataclass(frozen=True)
class CaptureFailed:
    """Why a task could not copy its chunk, handed back to the driver (an exception raised in a
    Spark task reaches the driver as Java's text, its kind lost)."""

    transient: bool
    message: str


def load(state: StateFolder) -> Manifest | None:
    text = state.read_text(MANIFEST)
    return None if text is None else Manifest.from_json(text)


def capture(
    dsn: str,
    slot: str,
    publication: str,
    specs: Sequence[TableSpec],
    state: StateFolder,
    *,
    take: bool,
    chunk_pages: int,
    run: TaskRunner,
) -> Manifest:
    """Create the slot and capture the snapshot (``take``) into ``state`` by ``run``'s tasks;
    the manifest once every chunk is written.

    Called by the driver's first probe when ``state`` has no manifest: whatever a crashed
    attempt left (a slot, chunk files) is dropped first.
    """
    with server_errors(slot, publication):
        plain = connect(dsn)
        try:
            with plain.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                if cur.fetchone() is not None:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        finally:
            plain.close()
        state.clear(CHUNKS)
        exporting = connect(dsn, replication=True)
        try:
            with exporting.cursor() as cur:
                how = "EXPORT_SNAPSHOT" if take else "NOEXPORT_SNAPSHOT"
                cur.execute(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput {how}")
                _, consistent_point, snapshot_name, _ = cur.fetchone()
            consistent = parse_lsn(consistent_point)
            tasks = plan_chunks(dsn, slot, publication, snapshot_name, f"{consistent:016X}", specs, state, chunk_pages)
            done = run(copy_chunk, tasks) if take else []
        finally:
            exporting.close()  # only now: the tasks joined the snapshot it exported
    chunks = copied(done, "the snapshot's capture failed, it starts over at the next probe")
    assert len(chunks) < consistent, "more snapshot chunks than LSNs below the consistent point"
    manifest = Manifest(slot, consistent, tuple(chunks))
    state.write_bytes(MANIFEST, manifest.to_json().encode())
    return manifest


def copied(done: Sequence[Chunk | CaptureFailed], failed: str) -> list[Chunk]:
    """The chunks the tasks copied; the first failure raised with its kind (transient: the
    capture starts over at the next probe), ``failed`` saying what failed."""
    chunks = []
    for result in done:
        if isinstance(result, CaptureFailed):
            kind = PostgresUnavailable if result.transient else DefiniteSourceError
            raise kind(f"{failed}: {result.message}")
        chunks.append(result)
    return chunks


def plan_chunks(
    dsn: str,
    slot: str,
    publication: str,
    snapshot: str,
    attempt: str,
    specs: Sequence[TableSpec],
    state: StateFolder,
    chunk_pages: int,
) -> list[ChunkTask]:
    """Every table's chunks, numbered in table order. A table's size now may differ from its size
    in the snapshot; the last chunk is open-ended, so every row the snapshot sees is in one."""
    conn = connect(dsn)
    try:
        tasks: list[ChunkTask] = []
        with conn.cursor() as cur:
            for spec in specs:
                cur.execute(
                    "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                    (spec.table.quoted,),
                )
                pages = int(cur.fetchone()[0])
                bounds = list(range(0, pages, chunk_pages)) or [0]
                for i, low in enumerate(bounds):
                    high = bounds[i + 1] if i + 1 < len(bounds) else None
                    tasks.append(
                        ChunkTask(dsn, slot, publication, snapshot, attempt, spec, len(tasks), low, high, state)
                    )
    finally:
        conn.close()
    return tasks


def copy_chunk(task: ChunkTask) -> Chunk | CaptureFailed:
    """Run in a task: the chunk's rows in the exported snapshot, written to its file."""
    try:
        with server_errors(task.slot, task.publication):
            conn = connect(task.dsn)
            try:
                conn.autocommit = False
                with conn.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (task.snapshot,))
                    if _rewritten_since(cur, task.spec):
                        return CaptureFailed(
                            True,
                            f"table {task.spec.table.qualified} was rewritten (TRUNCATE, VACUUM FULL, CLUSTER or "
                            "an ALTER TABLE) after the snapshot was exported, which a snapshot cannot see through; "
                            "the capture starts over at the next probe",
                        )
                    table = typed_chunk(_copy_rows(cur, task), task.spec)
                conn.rollback()
            finally:
                conn.close()
        relative = f"{CHUNKS}/{task.attempt}-{task.index:06d}-{task.spec.output}.parquet"
        task.state.write_parquet(relative, table)
    except (PostgresUnavailable, OSError) as exc:
        return CaptureFailed(True, f"chunk {task.index} of {task.spec.table.qualified}: {exc}")
    except (DefiniteSourceError, psycopg2.Error) as exc:
        return CaptureFailed(False, f"chunk {task.index} of {task.spec.table.qualified}: {exc}".strip())
    return Chunk(task.spec.output, relative, table.num_rows)


def _rewritten_since(cur: Any, spec: TableSpec) -> bool:
    """Whether the table has a new file since the snapshot: PostgreSQL's rewrites are not
    MVCC-safe, so an older snapshot sees a rewritten table's new file as empty (or a retyped
    column's rows as gone), not the rows it held. The table is locked first (``ACCESS SHARE``,
    which every rewrite's ``ACCESS EXCLUSIVE`` waits for) until this transaction ends, so none can
    start while the chunk is copied; then ``pg_class`` as the snapshot sees it (a catalog read
    under the transaction's snapshot) is compared with the file the server uses now."""
    cur.execute(f"LOCK TABLE {spec.table.quoted} IN ACCESS SHARE MODE")
    cur.execute(
        "SELECT relfilenode <> pg_relation_filenode(oid) FROM pg_class WHERE oid = %s::regclass",
        (spec.table.quoted,),
    )
    row = cur.fetchone()
    return row is None or bool(row[0])


def _copy_rows(cur: Any, task: ChunkTask) -> pa.Table:
    """The chunk through ``COPY ... TO STDOUT (FORMAT csv, NULL '\\N')``: the same text forms
    pgoutput sends; an unquoted ``\\N`` is NULL (the server quotes a value that reads so).

    A value can hold a line break only inside quotes, and parsing for that (``newlines_in_values``)
    makes pyarrow cut the text into blocks serially: 97 ms instead of 54 ms for 500,000 rows of the
    benchmark's table. So a chunk with no quote at all, the common case, is parsed without it."""
    spec = task.spec
    where = f"ctid >= '({task.low},0)'::tid" + (f" AND ctid < '({task.high},0)'::tid" if task.high is not None else "")
    names = [c.name for c in spec.columns]
    columns = ", ".join(f'"{name}"' for name in names)
    query = f"SELECT {columns} FROM {spec.table.quoted} WHERE {where}"
    buffer = io.BytesIO()
    cur.copy_expert(f"COPY ({query}) TO STDOUT WITH (FORMAT csv, NULL '\\N')", buffer)
    if buffer.tell() == 0:
        return pa.table({name: pa.array([], pa.string()) for name in names})
    data = buffer.getvalue()
    return pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=names),
        parse_options=pacsv.ParseOptions(newlines_in_values=b'"' in data),
        convert_options=pacsv.ConvertOptions(
            column_types={name: pa.string() for name in names},
            null_values=["\\N"],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )


def read_chunk(state: StateFolder, chunk: Chunk) -> pa.Table:
    """A captured chunk's rows (typed or text columns), the same every time."""
    return state.read_parquet(chunk.file)
