"""The initial copy of the tables, consistent with the slot, captured once by tasks and bound whole.

**Consistent.** The slot is created with ``EXPORT_SNAPSHOT``: the server answers the slot's
consistent point (an LSN) and a snapshot that sees exactly the transactions committed before it.
The stream of the slot starts at that point, so the snapshot plus every transaction the slot
sends is the database, once, with nothing between (Materialize's ``snapshot.rs`` does the same).

**Landed ahead, by tasks.** The driver's probe creates the slot and keeps the exporting
connection open (an exported snapshot lives only as long as it, and only while it runs no other
command) in a :class:`Capture`; it cuts every table into chunks of ``snapshot_chunk_pages`` heap
pages (``ctid`` ranges, the last one open-ended) and asks the pipeline to land them ahead of their
binding (:class:`~reclock.sources.base.LandFirst`, :mod:`reclock.runtime.ahead`): each chunk is a
split of the batch binding the consistent point, run by the pipeline's tasks (Spark tasks on the
Spark plane), which open their own connection, join the snapshot (``SET TRANSACTION
SNAPSHOT``), copy their range (:func:`copy_rows`), type its columns
(:func:`~reclock.sources.postgres.chunks.typed_chunk`) and write the outputs' files, stamped at
the into time reserved for that binding, uncommitted. The rows are written once: a snapshot
copied into files of its own first, then landed, wrote them twice and could not keep up with
one ``COPY`` into one Delta write (``docs/design/20261127_postgres_snapshot_floor.md``). A source
probed without a pipeline (:meth:`~reclock.sources.base.Source.upper`) captures into chunk files
in the pipeline's folder of the lake (:class:`StateFolder`) itself, read back later.

**Captured once.** Only once the pipeline answered that the landing is durable in its own state
(or every chunk file is written) does the driver close the exporting connection and write the
manifest (the slot, its consistent point, the chunks), last and whole
(:meth:`Capture.landed`, :meth:`Capture.copied`): the snapshot stays readable until the landing
is durable. A crash before the manifest bound nothing: the next start drops the slot (and any
chunk files) and captures again, at a new slot, and the pipeline replaces the landing it may have
kept with the new one; no file of the first attempt was ever committed (vacuum removes them), so
nothing can land twice (the duplication of Materialize #13749 came from a second snapshot
*after* the first was bound). A chunk file's name carries its attempt (the consistent point), so
a task of a dead attempt that finishes late writes a file no manifest names. After the manifest
the snapshot is never taken again: the binding is minted at the landing's time and its batch
commits the landing's files (or reads the chunk files), the same rows every time.

**Bound whole.** Chunk ``i`` is offset ``i`` of the source's one partition (there are far fewer
chunks than the consistent point's LSN, below which the stream has nothing), and the source's
``cap`` never cuts below the consistent point, so every chunk of every table lands at the first
binding, at one into time, and each chunk is a split of its own: a Spark task.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.csv as pacsv

from reclock.errors import ContractError, DefiniteSourceError
from reclock.sources.base import Split
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.chunks import typed_chunk
from reclock.sources.postgres.clients import PostgresUnavailable, connect, server_errors
from reclock.sources.postgres.pgoutput import parse_lsn
from reclock.sources.state import StateFolder

__all__ = [
    "Capture",
    "CaptureFailed",
    "Chunk",
    "ChunkOffset",
    "ChunkTask",
    "Manifest",
    "capture",
    "copied",
    "copy_chunk",
    "copy_in_turn",
    "copy_rows",
    "load",
    "plan_chunks",
    "read_chunk",
]

MANIFEST = "snapshot.json"
#: The largest block the CSV parser takes a chunk's text in (a chunk of big values is cut in more).
_ONE_BLOCK = 1 << 30
CHUNKS = "chunks"
#: Rows a heap page holds, about, for a table the server has not counted yet (its chunks' weight).
ROWS_PER_PAGE = 50


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
    """The capture, kept whole: the slot, its consistent point, the chunks (without a file when
    the pipeline landed them ahead: what it wrote is in its own state, :mod:`reclock.runtime.ahead`)."""

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
    #: About how many rows it holds (the table's rows per page, as the server last counted them).
    rows: int = 0


@dataclass(frozen=True)
class CaptureFailed:
    """Why a task could not copy its chunk, handed back to the driver (an exception raised in a
    Spark task reaches the driver as Java's text, its kind lost)."""

    transient: bool
    message: str


def load(state: StateFolder) -> Manifest | None:
    text = state.read_text(MANIFEST)
    return None if text is None else Manifest.from_json(text)


class Capture:
    """A capture under way: the slot created, its snapshot exported on the connection held open
    here, the chunks planned (:attr:`tasks`), waiting for them to be landed or copied.

    Made by the driver's probe (:func:`capture`); the probe asks the pipeline to land or copy the
    chunks and, with its answer, finishes the capture (:meth:`landed`, :meth:`copied`), or gives it
    up (:meth:`abandon`) when no answer comes. Driver-side only: it holds a connection.
    """

    def __init__(self, exporting: Any, slot: str, consistent_lsn: int, tasks: list[ChunkTask], state: StateFolder):
        self._exporting = exporting
        self.slot = slot
        self.consistent_lsn = consistent_lsn
        self.tasks = tasks
        self._state = state

    def landed(self, read: Sequence[int]) -> Manifest:
        """The manifest of chunks the pipeline landed ahead (``read``: each chunk's rows), durable in
        its state now: the snapshot may go."""
        if len(read) != len(self.tasks):
            raise ContractError(f"the pipeline answered {len(read)} chunks landed for {len(self.tasks)} asked")
        self.abandon()
        return self._finish([Chunk(task.spec.output, "", rows) for task, rows in zip(self.tasks, read, strict=True)])

    def copied(self, done: Sequence[Chunk | CaptureFailed]) -> Manifest:
        """The manifest of chunks :func:`copy_chunk` copied into files; the first failure raised
        with its kind (transient: the capture starts over at the next probe)."""
        self.abandon()  # the copies joined the snapshot: it may go whatever they did
        return self._finish(copied(done, "the snapshot's capture failed, it starts over at the next probe"))

    def abandon(self) -> None:
        """Let the exported snapshot go (the slot stays: the next capture drops it)."""
        self._exporting.close()

    def _finish(self, chunks: list[Chunk]) -> Manifest:
        assert len(chunks) < self.consistent_lsn, "more snapshot chunks than LSNs below the consistent point"
        manifest = Manifest(self.slot, self.consistent_lsn, tuple(chunks))
        self._state.write_bytes(MANIFEST, manifest.to_json().encode())
        return manifest


def capture(
    dsn: str,
    slot: str,
    publication: str,
    specs: Sequence[TableSpec],
    state: StateFolder,
    *,
    take: bool,
    chunk_pages: int,
) -> Capture:
    """Create the slot and plan the snapshot's chunks (none unless ``take``), its snapshot held
    exported until the capture finishes (:class:`Capture`).

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
        except BaseException:
            exporting.close()
            raise
    return Capture(exporting, slot, consistent, tasks if take else [], state)


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
                    "SELECT pg_relation_size(oid) / current_setting('block_size')::int, reltuples, relpages "
                    "FROM pg_class WHERE oid = %s::regclass",
                    (spec.table.quoted,),
                )
                pages, counted, counted_pages = cur.fetchone()
                per_page = counted / counted_pages if counted > 0 and counted_pages > 0 else ROWS_PER_PAGE
                bounds = list(range(0, pages, chunk_pages)) or [0]
                for i, low in enumerate(bounds):
                    high = bounds[i + 1] if i + 1 < len(bounds) else None
                    rows = max(1, round(((high if high is not None else pages) - low) * per_page))
                    tasks.append(
                        ChunkTask(dsn, slot, publication, snapshot, attempt, spec, len(tasks), low, high, state, rows)
                    )
    finally:
        conn.close()
    return tasks


def copy_chunk(task: ChunkTask) -> Chunk | CaptureFailed:
    """Run in a task: the chunk's rows in the exported snapshot, written to its file."""
    try:
        table = copy_rows(task)
        relative = f"{CHUNKS}/{task.attempt}-{task.index:06d}-{task.spec.output}.parquet"
        task.state.write_parquet(relative, table)
    except PostgresUnavailable as exc:
        return CaptureFailed(True, str(exc))
    except OSError as exc:
        return CaptureFailed(True, f"chunk {task.index} of {task.spec.table.qualified}: {exc}")
    except DefiniteSourceError as exc:
        return CaptureFailed(False, str(exc))
    return Chunk(task.spec.output, relative, table.num_rows)


def copy_rows(task: ChunkTask) -> pa.Table:
    """Run in a task: the chunk's rows in the exported snapshot, typed (:func:`copy_in_turn`)."""
    (table,) = copy_in_turn([task])  # to its end: the transaction is rolled back, the connection closed
    return table


def copy_in_turn(tasks: Sequence[ChunkTask]) -> Iterator[pa.Table]:
    """Run in a task: each chunk's rows in the exported snapshot they share, typed
    (:func:`~reclock.sources.postgres.chunks.typed_chunk`), in turn, through one connection and
    one transaction: a chunk's own connection, snapshot import and table check cost 8-10 ms, which
    small chunks (that balance tasks well) paid many times over. Raises
    :class:`PostgresUnavailable` when a new attempt may succeed (the server away, a table
    rewritten since the export: the capture starts over) and :class:`DefiniteSourceError`
    otherwise, one line naming the chunk."""
    if not tasks:
        return
    first = current = tasks[0]
    assert all(task.snapshot == first.snapshot for task in tasks), "chunks of one snapshot in turn"
    try:
        with server_errors(first.slot, first.publication):
            conn = connect(first.dsn)
            try:
                conn.autocommit = False
                with conn.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (first.snapshot,))
                    checked: set[str] = set()
                    for current in tasks:
                        if current.spec.output not in checked:
                            if _rewritten_since(cur, current.spec):
                                raise PostgresUnavailable(
                                    "the table was rewritten (TRUNCATE, VACUUM FULL, CLUSTER or an ALTER TABLE) "
                                    "after the snapshot was exported, which a snapshot cannot see through; "
                                    "the capture starts over at the next probe"
                                )
                            checked.add(current.spec.output)
                        yield typed_chunk(_copy_rows(cur, current), current.spec)
                conn.rollback()
            finally:
                conn.close()
    except PostgresUnavailable as exc:
        raise PostgresUnavailable(f"{_chunk(current)}: {exc}") from None
    except psycopg2.Error as exc:  # the server's own words, its first line (no query, no caret)
        said = (exc.diag.message_primary or str(exc)).strip().splitlines()[0]
        raise DefiniteSourceError(f"{_chunk(current)}: {said}") from None
    except DefiniteSourceError as exc:
        raise DefiniteSourceError(f"{_chunk(current)}: {' '.join(str(exc).split())}") from None


def _chunk(task: ChunkTask) -> str:
    return f"chunk {task.index} of {task.spec.table.qualified}"


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
    benchmark's table. So a chunk with no quote at all, the common case, is parsed without it.

    The chunk is parsed as one block, so its columns are one array each, as the batches it
    becomes need them (:func:`~reclock.sources.postgres.chunks.whole`), without a copy: a task's
    chunks are parsed side by side with the other task's anyway.

    Integer and decimal columns are typed by the parser, which reads their text forms as the cast
    from text would (the same value parsers), without a string column made first only to be cast
    (42 ms of 500,000 rows' casts); a chunk with a value the parser refuses is parsed again as texts,
    typed (or not, its bad rows to ``_errors``) as every chunk was."""
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

    def parsed(types: dict[str, pa.DataType]) -> pa.Table:
        return pacsv.read_csv(
            pa.BufferReader(data),
            read_options=pacsv.ReadOptions(column_names=names, block_size=min(len(data) + 1, _ONE_BLOCK)),
            parse_options=pacsv.ParseOptions(newlines_in_values=b'"' in data),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                null_values=["\\N"],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )

    texts = {name: pa.string() for name in names}
    typed = {c.name: c.arrow for c in spec.columns if pa.types.is_integer(c.arrow) or pa.types.is_decimal(c.arrow)}
    if typed:
        try:
            return parsed({**texts, **typed})
        except pa.ArrowInvalid:
            pass
    return parsed(texts)


def read_chunk(state: StateFolder, chunk: Chunk) -> pa.Table:
    """A captured chunk's rows (typed or text columns), the same every time."""
    return state.read_parquet(chunk.file)
