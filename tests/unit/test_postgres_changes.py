"""The Postgres source's pure parts: pgoutput framing, transactions as output batches, options.

The server-backed tests (tests/integration/postgres_source/) pin the decoder against
``test_decoding`` and the source end to end; these pin the rules that need no server: what a
malformed message does, which row of a key a transaction leaves, where unsent TOAST values come
from, and that a bad option is one line naming it.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.errors import ConfigError
from reclock.sources.base import ERRORS
from reclock.sources.postgres.catalog import ColumnSpec, TableSpec
from reclock.sources.postgres.changes import (
    DELETED,
    TRUNCATED,
    UNSENT,
    Change,
    ChangeBatches,
    ChangeColumns,
    TableColumns,
)
from reclock.sources.postgres.config import PostgresOptions, TableName, slot_name
from reclock.sources.postgres.pgoutput import (
    UNCHANGED,
    Begin,
    Insert,
    PgOutputError,
    Relation,
    Update,
    decode_message,
    lsn_text,
    parse_lsn,
)

SPEC = TableSpec(
    TableName("public", "t"),
    (ColumnSpec("id", 23, -1), ColumnSpec("v", 25, -1), ColumnSpec("n", 20, -1)),
    key=("id",),
    identity="d",
)


def _tuple(*values: object) -> bytes:
    out = struct.pack(">h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED:
            out += b"u"
        else:
            data = str(value).encode()
            out += b"t" + struct.pack(">i", len(data)) + data
    return out


def test_messages_decode_from_their_documented_layout():
    assert decode_message(b"B" + struct.pack(">qqI", 0x1_0000_0010, 5, 77)) == Begin(0x1_0000_0010, 5, 77)
    relation = (
        b"R"
        + struct.pack(">I", 16384)
        + b"public\0t\0d"
        + struct.pack(">h", 2)
        + b"\x01id\0"
        + struct.pack(">Ii", 23, -1)
        + b"\x00v\0"
        + struct.pack(">Ii", 25, -1)
    )
    decoded = decode_message(relation)
    assert isinstance(decoded, Relation) and decoded.qualified == "public.t"
    assert [(c.name, c.key) for c in decoded.columns] == [("id", True), ("v", False)]
    insert = decode_message(b"I" + struct.pack(">I", 16384) + b"N" + _tuple("1", None))
    assert insert == Insert(16384, ("1", None))
    update = decode_message(b"U" + struct.pack(">I", 16384) + b"K" + _tuple("1", None) + b"N" + _tuple("2", UNCHANGED))
    assert update == Update(16384, ("1", None), True, ("2", UNCHANGED))


@pytest.mark.parametrize(
    "data",
    [b"", b"Z", b"B\x00\x01", b"I" + struct.pack(">I", 1) + b"X", b"I" + struct.pack(">I", 1) + b"N" + b"\x00\x01b"],
)
def test_a_malformed_message_is_refused_not_guessed(data):
    with pytest.raises(PgOutputError):
        decode_message(data)


def test_lsn_text_round_trips():
    assert parse_lsn("16/B374D848") == 0x16_B374D848
    assert lsn_text(0x16_B374D848) == "16/B374D848"


def _rows(batches: list[tuple[str, pa.RecordBatch]], output: str) -> list[dict]:
    return [row for name, batch in batches if name == output for row in batch.to_pylist()]


def test_a_transaction_leaves_one_row_per_key_the_last_one():
    changes = ChangeBatches([SPEC], "upsert", "wal")
    txn = [
        ("public_t", Change("c", None, ("1", "a", "10"))),
        ("public_t", Change("u", None, ("1", "b", "11"))),
        ("public_t", Change("c", None, ("2", "x", None))),
        ("public_t", Change("u", ("2", None, None), ("3", "x", None))),  # key 2 becomes 3
    ]
    out = list(changes.transaction(500, 500, 9, txn)) + list(changes.finish())
    rows = _rows(out, "public_t")
    assert [(r["id"], r["v"], r["n"], r[DELETED]) for r in rows] == [
        (1, "b", 11, False),
        (2, None, None, True),
        (3, "x", None, False),
    ]
    assert {r["_offset"] for r in rows} == {500}


def test_unsent_toast_comes_from_the_old_row_or_the_keys_earlier_change_else_is_left_to_the_merge():
    """An upsert record whose value neither the old row nor an earlier change has lands with it
    null and named in ``_unsent`` (the sink's MERGE keeps the output's value); an append output
    has no such value, and the change goes to ``_errors`` naming the column."""
    txn = [
        ("public_t", Change("c", None, ("1", "big", "1"))),
        ("public_t", Change("u", None, ("1", UNCHANGED, "2"))),  # from the insert before it
        ("public_t", Change("u", ("2", "old big", "0"), ("2", UNCHANGED, "3"))),  # replica identity full
    ]
    later = [("public_t", Change("u", None, ("4", UNCHANGED, "5")))]
    changes = ChangeBatches([SPEC], "upsert", "wal")
    out = list(changes.transaction(600, 600, 1, txn))
    out += list(changes.transaction(700, 700, 2, later))
    out += list(changes.finish())
    rows = _rows(out, "public_t")
    assert [(r["id"], r["v"], r["n"], r.get(UNSENT)) for r in rows] == [
        (1, "big", 2, None),
        (2, "old big", 3, None),
        (4, None, 5, ["v"]),
    ]
    assert ERRORS not in {output for output, _ in out}
    changes = ChangeBatches([SPEC], "append", "wal")
    out = list(changes.transaction(700, 700, 2, later)) + list(changes.finish())
    errors = _rows(out, ERRORS)
    assert [(e["_offset"], e["kind"]) for e in errors] == [(700, "unchanged_toast")]
    assert "column v unchanged" in errors[0]["message"]
    assert 'ALTER TABLE "public"."t" REPLICA IDENTITY FULL' in errors[0]["message"]


def test_a_value_its_type_cannot_hold_goes_to_errors_at_its_commit():
    changes = ChangeBatches([SPEC], "append", "wal")
    txn = [("public_t", Change("c", None, ("1", "a", "12"))), ("public_t", Change("c", None, ("x", "b", "1")))]
    out = list(changes.transaction(800, 800, 3, txn)) + list(changes.finish())
    rows = _rows(out, "public_t")
    assert [(r["after"]["id"], r["op"], r["seq"], r["xid"]) for r in rows] == [(1, "c", 0, 3)]
    assert [(e["_offset"], e["kind"]) for e in _rows(out, ERRORS)] == [(800, "decode")]


def test_a_truncate_of_an_upsert_output_drops_the_earlier_changes_and_comes_before_the_later():
    changes = ChangeBatches([SPEC], "upsert", "wal")
    txn = [
        ("public_t", Change("c", None, ("1", "a", "1"))),
        ("public_t", Change("c", None, ("2", "b", "2"))),
        ("public_t", Change("t", None, None)),
        ("public_t", Change("c", None, ("2", "c", "3"))),
    ]
    out = list(changes.transaction(900, 900, 4, txn)) + list(changes.finish())
    rows = _rows(out, "public_t")
    assert [(r["id"], r["v"], r[DELETED], r[TRUNCATED]) for r in rows] == [
        (None, None, True, True),
        (2, "c", False, False),
    ]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"dsn": ""}, "dsn"),
        ({"tables": "t"}, "tables"),
        ({"tables": ["a.b.c-d"]}, "tables"),
        ({"tables": ["t", "public.t"]}, "tables"),
        ({"envelope": "debezium"}, "envelope"),
        ({"slot": "Bad-Name"}, "slot"),
        ({"snapshot_chunk_pages": 0}, "snapshot_chunk_pages"),
        ({"read_timeout_s": 0}, "read_timeout_s"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(override, field):
    options = {
        "dsn": "host=127.0.0.1",
        "tables": ["t"],
        "envelope": "upsert",
        "slot": "s",
        "publication": "p",
        "snapshot": True,
        "snapshot_chunk_pages": 8,
        "read_timeout_s": 1.0,
        "feedback_interval_s": 1.0,
        **override,
    }
    with pytest.raises(ConfigError) as error:
        PostgresOptions.check(**options)
    assert error.value.field == field and "\n" not in str(error.value)


def test_a_pipelines_slot_is_a_legal_slot_name():
    assert slot_name("Orders-EU") == "reclock_orders_eu"


# -- the columnar path of the stream against transaction by transaction ------------------------

TWO = (
    SPEC,
    TableSpec(
        TableName("public", "u"), (ColumnSpec("a", 25, -1), ColumnSpec("b", 20, -1)), key=("a", "b"), identity="d"
    ),
)
_cell = st.one_of(st.none(), st.sampled_from(["1", "2", "x", "", "é"]))


@st.composite
def _transactions(draw: st.DrawFn) -> list[list[tuple[str, str, tuple]]]:
    """Transactions of inserts, updates and deletes (by key) over two tables, keys from a small
    pool so that a transaction often changes one key twice; some values an int column refuses."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        txn = []
        for _ in range(draw(st.integers(0, 8))):
            spec = draw(st.sampled_from(TWO))
            kind = draw(st.sampled_from("IUD"))
            row = tuple(draw(_cell) for _ in spec.columns)
            if kind == "D":
                row = tuple(v if c.name in spec.key else None for v, c in zip(row, spec.columns, strict=True))
            txn.append((spec.output, kind, row))
        out.append(txn)
    return out


def _by_output(batches: list[tuple[str, pa.RecordBatch]]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for name, batch in batches:
        out.setdefault(name, []).extend(batch.to_pylist())
    return out


@given(_transactions(), st.integers(1, 5))
def test_changes_as_columns_land_as_they_do_transaction_by_transaction(transactions, flush_rows):
    ops = {"I": "c", "U": "u", "D": "d"}
    by_txn = ChangeBatches(TWO, "upsert", "wal", flush_rows=flush_rows)
    expected = []
    for t, txn in enumerate(transactions):
        changes = [
            (output, Change(ops[kind], row if kind == "D" else None, None if kind == "D" else row))
            for output, kind, row in txn
        ]
        expected += by_txn.transaction(100 + t, 100 + t, 7 + t, changes)
    expected += by_txn.finish()

    as_columns = ChangeBatches(TWO, "upsert", "wal", flush_rows=flush_rows)
    flat = [(t, *change) for t, txn in enumerate(transactions) for change in txn]
    tables = []
    for spec in TWO:
        at = [i for i, (_, output, _, _) in enumerate(flat) if output == spec.output]
        if at:
            rows = [flat[i][3] for i in at]
            columns = [pa.array([row[j] for row in rows], pa.string()) for j in range(len(spec.columns))]
            kinds = np.array([ord(flat[i][2]) for i in at], np.uint8)
            tables.append(TableColumns(spec.output, np.array(at, np.int64), kinds, columns))
    got = []
    if flat:
        got += as_columns.columns(
            ChangeColumns(
                offsets=np.array([100 + t for t in range(len(transactions))], np.int64),
                xids=[7 + t for t in range(len(transactions))],
                txn=np.array([f[0] for f in flat], np.int64),
                tables=tables,
            )
        )
    got += as_columns.finish()
    want, have = _by_output(expected), _by_output(got)
    assert have.keys() == want.keys()
    for name in want:
        if name == ERRORS:
            key = lambda e: (e["_offset"], e["raw"])  # noqa: E731
            assert sorted(have[name], key=key) == sorted(want[name], key=key)
        else:
            assert have[name] == want[name], name
