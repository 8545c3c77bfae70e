"""The replication reader without a server: the same rows whichever way a segment is landed.

A fake replication cursor feeds ``read_range`` pgoutput messages made by the test's own encoder:
transactions over two tables the pipeline reads (one keyed by ``id``, one with a column added
after its output was made and its columns sent in another order) and one it does not read;
inserts, updates (some changing the key, some leaving a TOASTed value unsent), deletes, and
now and then a TRUNCATE. Segments are cut every few row changes (``DECODE_ROWS``). The rows the
reader lands must equal what it lands when every output refuses columns, so every segment goes
transaction by transaction through ``ChangeBatches.transaction``; that path is pinned by
``test_postgres_changes.py`` and, against the server, by ``tests/integration/postgres_source``.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.sources.base import ERRORS
from reclock.sources.postgres import stream
from reclock.sources.postgres.catalog import ColumnSpec, TableSpec
from reclock.sources.postgres.changes import ChangeBatches
from reclock.sources.postgres.config import TableName
from reclock.sources.postgres.pgoutput import UNCHANGED
from tests.unit.test_pgoutput_bulk import tuple_bytes

ITEMS = TableSpec(TableName("public", "items"), (ColumnSpec("id", 23, -1), ColumnSpec("v", 25, -1)), ("id",), "d")
NOTES = TableSpec(TableName("public", "notes"), (ColumnSpec("k", 25, -1), ColumnSpec("n", 20, -1)), ("k",), "d")
# notes as the server now has it: a column added, and the columns in another order than the output's
NOTES_NOW = [("extra", 25), ("n", 20), ("k", 25)]


_tuple = tuple_bytes  # the bulk decoder test's own TupleData encoder


def _relation(relation_id: int, name: str, columns: list[tuple[str, int]]) -> bytes:
    out = [
        b"R",
        struct.pack(">I", relation_id),
        b"public\0",
        name.encode() + b"\0",
        b"d",
        struct.pack(">h", len(columns)),
    ]
    for column, oid in columns:
        out += [b"\x00", column.encode() + b"\0", struct.pack(">Ii", oid, -1)]
    return b"".join(out)


_text = st.sampled_from(["a", "b", "é", "", "12"])
_int = st.sampled_from(["1", "2", "3", "x"])  # "x": a value an int column cannot hold


@st.composite
def _change(draw: st.DrawFn) -> bytes:
    table = draw(st.sampled_from([1, 2, 3]))  # 3: a table the pipeline does not read
    kind = draw(st.sampled_from("IIUUDT"))
    if kind == "T":
        ids = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=3, unique=True))
        return b"T" + struct.pack(">ib", len(ids), 0) + b"".join(struct.pack(">I", i) for i in ids)
    if table == 2:
        row = (draw(st.none() | _text), draw(_int), draw(_text))  # extra, n, k
        key = (None, None, row[2])
    else:
        row = (draw(_int), draw(st.one_of(_text, st.just(UNCHANGED))) if kind == "U" else draw(_text))
        key = (row[0], None)
    head = kind.encode() + struct.pack(">I", table)
    if kind == "I":
        return head + b"N" + _tuple(row)
    if kind == "D":
        return head + b"K" + _tuple(key)
    if draw(st.booleans()):  # the key changed: the old key is sent
        old = (draw(_int), None) if table != 2 else (None, None, draw(_text))
        return head + b"K" + _tuple(old) + b"N" + _tuple(row)
    return head + b"N" + _tuple(row)


@st.composite
def _stream(draw: st.DrawFn) -> list[bytes]:
    messages = [
        _relation(1, "items", [("id", 23), ("v", 25)]),
        _relation(2, "notes", NOTES_NOW),
        _relation(3, "other", [("z", 25)]),
    ]
    lsn = 1 << 32
    for xid in range(draw(st.integers(1, 12))):
        lsn += 100
        messages.append(b"B" + struct.pack(">qqI", lsn, 0, xid))
        messages += draw(st.lists(_change(), max_size=8))
        messages.append(b"C" + struct.pack(">bqqq", 0, lsn, lsn + 10, 0))
    return messages


class _Message:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload


class _Cursor:
    """What read_range asks of psycopg2's replication cursor: messages, then the server's WAL end."""

    def __init__(self, payloads: list[bytes]) -> None:
        self._payloads = iter(payloads)
        self.wal_end = 0

    def send_feedback(self, reply: bool = False) -> None:
        pass

    def read_message(self) -> _Message | None:
        payload = next(self._payloads, None)
        if payload is None:
            self.wal_end = 1 << 62
            return None
        return _Message(payload)

    def fileno(self) -> int:
        raise AssertionError("the reader waits only when no message is left, and then it stops")


class _Connection:
    def close(self) -> None:
        pass


class _RowsOnly(ChangeBatches):
    def takes_columns(self, output: str) -> bool:
        return False


def _landed(payloads: list[bytes], batches: ChangeBatches, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[dict]]:
    monkeypatch.setattr(stream, "replication", lambda *args, **kwargs: (_Connection(), _Cursor(payloads)))
    out: dict[str, list[dict]] = {}
    for output, batch in stream.read_range(
        "", "slot", "pub", [ITEMS, NOTES], batches, 0, 1 << 62, read_timeout_s=5, feedback_interval_s=60
    ):
        out.setdefault(output, []).extend(batch.to_pylist())
    if ERRORS in out:
        out[ERRORS].sort(key=lambda e: (e["_offset"], e["raw"]))
    return out


@given(_stream(), st.integers(1, 12))
def test_the_reader_lands_the_same_rows_as_columns_or_transaction_by_transaction(payloads, segment):
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(stream, "DECODE_ROWS", segment)
        got = _landed(payloads, ChangeBatches([ITEMS, NOTES], "upsert", "wal", flush_rows=7), monkeypatch)
        want = _landed(payloads, _RowsOnly([ITEMS, NOTES], "upsert", "wal", flush_rows=7), monkeypatch)
    assert got == want


def test_plain_segments_do_go_as_columns(monkeypatch):
    """The property above compares something: a plain stream takes ``columns``."""
    taken = []
    monkeypatch.setattr(ChangeBatches, "columns", lambda self, changes: taken.append(changes) or iter(()))
    payloads = [
        _relation(1, "items", [("id", 23), ("v", 25)]),
        b"B" + struct.pack(">qqI", 500, 0, 1),
        b"I" + struct.pack(">I", 1) + b"N" + _tuple(("1", "a")),
        b"C" + struct.pack(">bqqq", 0, 500, 510, 0),
    ]
    _landed(payloads, ChangeBatches([ITEMS, NOTES], "upsert", "wal"), monkeypatch)
    assert len(taken) == 1 and [t.output for t in taken[0].tables] == ["public_items"]
    assert pa.array(taken[0].tables[0].columns[1]).to_pylist() == ["a"]
