"""The initial snapshot: every row of the tables at one binlog position, captured before anything is bound.

MariaDB gives a consistent snapshot and its binlog position without a global lock:
``START TRANSACTION WITH CONSISTENT SNAPSHOT``, then ``SHOW STATUS LIKE 'binlog_snapshot_%'``
in the same session (``binlog_snapshot_file``, ``binlog_snapshot_position``): the transaction
sees exactly the transactions whose binlog groups start below that position. MySQL has no such
status: there the position is read under a brief ``FLUSH TABLES WITH READ LOCK`` taken around
the snapshot's start (it needs the ``RELOAD`` privilege).

Neither server lets another connection share the snapshot (Postgres exports one; MySQL and
MariaDB cannot), so its rows can be read only by the driver's one connection, while it lives, and
a batch must be replayable after any crash. So the driver copies them first, table by table in
primary-key order, ``snapshot_chunk_rows`` rows per chunk file in the state folder
(:class:`~reclock.sources.state.StateFolder`: the lake's, reachable from every task), and writes
the :class:`Manifest` last. Chunk ``i`` is offset ``i`` of :data:`~reclock.sources.mysql.position.BINLOG`
(far below any binlog offset), read back from its file by any task, every time the same. A kill
during the capture leaves no manifest: the next probe clears the chunks and captures again, at a
new position; nothing was bound before, so the result is the same as without the kill.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pymysql.cursors

from reclock.errors import DefiniteSourceError
from reclock.sources.mysql.catalog import TableSpec
from reclock.sources.mysql.changes import plain_value
from reclock.sources.mysql.clients import connect, server_errors
from reclock.sources.mysql.config import MysqlOptions
from reclock.sources.mysql.position import current, offset_of
from reclock.sources.state import StateFolder

__all__ = ["Chunk", "Manifest", "capture", "load", "read_chunk"]

_FOLDER = "mysql"
_MANIFEST = f"{_FOLDER}/manifest.json"
_CHUNKS = f"{_FOLDER}/chunks"


@dataclass(frozen=True)
class Chunk:
    """Rows of one table from the snapshot, in the file ``file`` of the state folder."""

    output: str
    rows: int
    file: str


@dataclass(frozen=True)
class Manifest:
    """A captured snapshot: its binlog ``position`` (an offset), the binlog's base name, its chunks."""

    position: int
    base: str
    chunks: tuple[Chunk, ...]

    def to_json(self) -> str:
        return json.dumps(
            {"position": self.position, "base": self.base, "chunks": [c.__dict__ for c in self.chunks]}, indent=1
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(data["position"], data["base"], tuple(Chunk(**c) for c in data["chunks"]))


def load(state: StateFolder) -> Manifest | None:
    """The manifest of a finished capture, ``None`` while there is none."""
    text = state.read_text(_MANIFEST)
    return None if text is None else Manifest.from_json(text)


def _snapshot_position(cur: pymysql.cursors.Cursor) -> tuple[str, int]:
    """Open the consistent snapshot on ``cur``'s connection and return its binlog position."""
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
    found = dict(cur.fetchall())
    if "binlog_snapshot_file" in found:
        return found["binlog_snapshot_file"], int(found["binlog_snapshot_position"])
    cur.execute("ROLLBACK")  # MySQL: the position is read with writes held back for a moment
    cur.execute("FLUSH TABLES WITH READ LOCK")
    try:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        return current(cur)
    finally:
        cur.execute("UNLOCK TABLES")


def capture(options: MysqlOptions, specs: Sequence[TableSpec], state: StateFolder) -> Manifest:
    """Copy every row of ``specs``' tables at one consistent binlog position into chunk files, then
    write the manifest (module docstring); without ``options.snapshot``, no chunk, at the current position."""
    state.clear(_CHUNKS)
    conn = connect(options)
    chunks: list[Chunk] = []
    try:
        with server_errors(options), conn.cursor() as cur:
            if not options.snapshot:
                file, pos = current(cur)
            else:
                file, pos = _snapshot_position(cur)
                for spec in specs:
                    chunks += _copy(conn, spec, state, len(chunks), options.snapshot_chunk_rows)
                cur.execute("COMMIT")
    finally:
        conn.close()
    base = file.rpartition(".")[0]
    if not base:
        raise DefiniteSourceError(f"binlog file name {file!r} has no number")
    manifest = Manifest(offset_of(file, pos), base, tuple(chunks))
    state.write_bytes(_MANIFEST, manifest.to_json().encode())
    return manifest


def _copy(conn: pymysql.Connection, spec: TableSpec, state: StateFolder, first: int, per_chunk: int) -> list[Chunk]:
    """``spec``'s table in primary-key order, streamed (an unbuffered cursor) into chunk files
    numbered from ``first``."""
    names = ", ".join(f"`{name}`" for name, _ in spec.columns)
    order = ", ".join(f"`{name}`" for name in spec.key)
    chunks: list[Chunk] = []
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(f"SELECT {names} FROM `{spec.database}`.`{spec.table}` ORDER BY {order}")
        while rows := cur.fetchmany(per_chunk):
            table = pa.table(
                [
                    pa.array([plain_value(row[i], kind) for row in rows], kind)
                    for i, (_, kind) in enumerate(spec.columns)
                ],
                schema=spec.schema,
            )
            file = f"{_CHUNKS}/{first + len(chunks):06d}.parquet"
            state.write_parquet(file, table)
            chunks.append(Chunk(spec.output, len(rows), file))
    return chunks


def read_chunk(state: StateFolder, chunk: Chunk) -> pa.Table:
    """A chunk's rows as captured."""
    return state.read_parquet(chunk.file)
