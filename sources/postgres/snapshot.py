"""The initial copy of the tables, consistent with the slot, captured once and bound whole.

**Consistent.** The slot is created with ``EXPORT_SNAPSHOT``: the server answers the slot's
consistent point (an LSN) and a snapshot that sees exactly the transactions committed before it.
The stream of the slot starts at that point, so the snapshot plus every transaction the slot
sends is the database, once, with nothing between (Materialize's ``snapshot.rs`` does the same).

**Captured once.** An exported snapshot lives only as long as the connection that created the
slot, so a crash would lose it; replaying a batch needs the same rows again. So before anything
is bound the driver copies every table, in chunks of ``snapshot_chunk_pages`` heap pages (a
``ctid`` range scan under ``SET TRANSACTION SNAPSHOT``), into parquet files in the pipeline's
source state folder, and writes a manifest last (atomically): the slot, its consistent point, the
chunks. A crash before the manifest exists bound nothing: the next start drops the slot and the
partial chunks and captures again, at a new slot; no row of the first attempt ever reached an
output, so nothing can land twice (the duplication of Materialize #13749 came from a second
snapshot *after* the first was bound). A crash after it never snapshots again: the chunks are
read back from the files, the same rows every time.

**Bound whole.** Chunk ``i`` is offset ``i`` of the source's one partition (there are far fewer
chunks than the consistent point's LSN, below which the stream has nothing), and the source's
``cap`` never cuts below the consistent point, so every chunk of every table lands at the first
binding, at one into time, and each chunk is a split of its own: a Spark task.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.clients import connect, server_errors
from reclock.sources.postgres.pgoutput import parse_lsn

__all__ = ["Chunk", "Manifest", "capture", "read_chunk"]

MANIFEST = "snapshot.json"


@dataclass(frozen=True)
class Chunk:
    """One captured piece of one table: its rows as text columns in ``file`` (relative)."""

    output: str
    file: str
    rows: int


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


def load(state: Path) -> Manifest | None:
    try:
        return Manifest.from_json((state / MANIFEST).read_text())
    except FileNotFoundError:
        return None


def capture(
    dsn: str, slot: str, publication: str, specs: Sequence[TableSpec], state: Path, *, take: bool, chunk_pages: int
) -> Manifest:
    """Create the slot and capture the snapshot (``take``) into ``state``; the manifest once done.

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
        shutil.rmtree(state / "chunks", ignore_errors=True)
        (state / "chunks").mkdir(parents=True, exist_ok=True)
        exporting = connect(dsn, replication=True)
        try:
            with exporting.cursor() as cur:
                how = "EXPORT_SNAPSHOT" if take else "NOEXPORT_SNAPSHOT"
                cur.execute(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput {how}")
                _, consistent_point, snapshot_name, _ = cur.fetchone()
            consistent = parse_lsn(consistent_point)
            chunks: list[Chunk] = []
            if take:
                for spec in specs:
                    chunks += _copy_table(dsn, snapshot_name, spec, state, chunk_pages, len(chunks))
        finally:
            exporting.close()
    assert len(chunks) < consistent, "more snapshot chunks than LSNs below the consistent point"
    manifest = Manifest(slot, consistent, tuple(chunks))
    _write_atomically(state / MANIFEST, manifest.to_json().encode())
    return manifest


def _copy_table(dsn: str, snapshot: str, spec: TableSpec, state: Path, chunk_pages: int, first: int) -> list[Chunk]:
    """``spec``'s table in chunks of ``chunk_pages`` pages, read in the exported ``snapshot``."""
    conn = connect(dsn)
    try:
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
            cur.execute(
                "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                (spec.table.quoted,),
            )
            pages = int(cur.fetchone()[0])
            bounds = list(range(0, pages, chunk_pages)) or [0]
            chunks = []
            for i, low in enumerate(bounds):
                high = bounds[i + 1] if i + 1 < len(bounds) else None  # the last chunk is open-ended
                where = f"ctid >= '({low},0)'::tid" + (f" AND ctid < '({high},0)'::tid" if high is not None else "")
                names = ", ".join(f'"{c.name}"' for c in spec.columns)
                chunks.append(
                    _copy_chunk(cur, spec, f"SELECT {names} FROM {spec.table.quoted} WHERE {where}", state, first + i)
                )
        conn.rollback()
    finally:
        conn.close()
    return chunks


def _copy_chunk(cur: Any, spec: TableSpec, query: str, state: Path, index: int) -> Chunk:
    """One chunk through ``COPY ... TO STDOUT (FORMAT csv, NULL '\\N')``: the same text forms
    pgoutput sends; an unquoted ``\\N`` is NULL (the server quotes a value that reads so)."""
    buffer = io.BytesIO()
    cur.copy_expert(f"COPY ({query}) TO STDOUT WITH (FORMAT csv, NULL '\\N')", buffer)
    names = [c.name for c in spec.columns]
    if buffer.tell() == 0:
        table = pa.table({name: pa.array([], pa.string()) for name in names})
    else:
        buffer.seek(0)
        table = pacsv.read_csv(
            buffer,
            read_options=pacsv.ReadOptions(column_names=names),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.string() for name in names},
                null_values=["\\N"],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
    relative = f"chunks/{index:06d}-{spec.output}.parquet"
    tmp = state / f"{relative}.tmp"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, state / relative)
    finally:
        tmp.unlink(missing_ok=True)
    return Chunk(spec.output, relative, table.num_rows)


def read_chunk(state: Path, chunk: Chunk) -> pa.Table:
    """A captured chunk's rows (text columns), the same every time."""
    return pq.read_table(state / chunk.file)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
