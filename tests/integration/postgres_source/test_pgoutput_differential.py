"""The pgoutput decoder against the server's own ``test_decoding`` plugin, over the same changes.

Two slots are created before a workload (inserts, updates that change a key or leave a TOASTed
value alone, deletes, a truncate of two tables, NULLs, many types, a table with replica identity
full); each slot decodes the same WAL, one with ``test_decoding`` (text, written by PostgreSQL
itself), one with ``pgoutput`` (binary, decoded by reclock). Both are read in the same session
(``TimeZone = UTC``), so the values' text forms agree; the test parses test_decoding's lines with
its own small parser and compares change by change: transaction ids, tables, operations, old keys
or rows, every value, nulls and unchanged TOAST markers.
"""

from __future__ import annotations

from contextlib import closing

import pyarrow as pa

from reclock.sources.postgres.columns import SESSION_OPTIONS, arrow_type, typed_column
from reclock.sources.postgres.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    Truncate,
    Update,
    decode_message,
)
from reclock.sources.postgres.pgoutput_bulk import decode_changes, decode_columns

SETUP = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2), active boolean,
                       opened timestamptz, note text, blob bytea, ratio float8, day date, n bigint);
ALTER TABLE accounts ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE ledger (entry bigint PRIMARY KEY, account int, amount numeric(12,2), memo varchar(40));
ALTER TABLE ledger REPLICA IDENTITY FULL;
CREATE TABLE plain (k int PRIMARY KEY, v text);
CREATE PUBLICATION everything FOR ALL TABLES;
"""

BIG = "x" * 20_000 + "end"  # stored out of line (STORAGE EXTERNAL): an update that skips it sends 'u'

WORKLOAD = [
    "INSERT INTO accounts VALUES (1, 'ann', 10.50, true, '2026-11-25 01:02:03.456789+00', 'it''s', '\\x00ff', 1.5, "
    "'2026-01-02', 9007199254740993)",
    "INSERT INTO accounts VALUES (2, NULL, NULL, NULL, NULL, NULL, NULL, 'NaN', NULL, NULL)",
    f"INSERT INTO accounts (id, owner, note) VALUES (3, 'big', '{BIG}')",
    "BEGIN; UPDATE accounts SET balance = balance - 1 WHERE id = 1; "
    "INSERT INTO ledger VALUES (1, 1, -1, 'move one'), (2, 2, 1, NULL); COMMIT",
    "UPDATE accounts SET owner = 'bigger' WHERE id = 3",  # note unchanged: TOAST 'u'
    "UPDATE accounts SET id = 4 WHERE id = 2",  # key change: old key sent
    "UPDATE ledger SET memo = 'moved' WHERE entry = 1",  # replica identity full: old row sent
    "DELETE FROM accounts WHERE id = 4",
    "DELETE FROM ledger WHERE entry = 2",
    "INSERT INTO plain SELECT g, 'v' || g FROM generate_series(1, 5) g",
    "TRUNCATE plain, ledger",
    "INSERT INTO plain VALUES (9, 'after truncate')",
]


def _session(postgres, database):
    import psycopg2

    conn = psycopg2.connect(postgres.dsn(database), options=SESSION_OPTIONS)
    conn.autocommit = True
    return conn


def test_pgoutput_decodes_what_test_decoding_prints(postgres):
    postgres.create_database("pgoutput_diff")
    with closing(_session(postgres, "pgoutput_diff")) as conn, conn.cursor() as cur:
        cur.execute(SETUP)
        cur.execute("SELECT pg_create_logical_replication_slot('text_slot', 'test_decoding')")
        cur.execute("SELECT pg_create_logical_replication_slot('binary_slot', 'pgoutput')")
        for statement in WORKLOAD:
            cur.execute(statement)
        cur.execute("SELECT data FROM pg_logical_slot_peek_changes('text_slot', NULL, NULL, 'include-xids', '1')")
        text_changes = _from_test_decoding([row[0] for row in cur.fetchall()])
        cur.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('binary_slot', NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'everything')"
        )
        binary = [bytes(row[0]) for row in cur.fetchall()]
    binary_changes = _from_pgoutput(binary)
    assert len(text_changes) == len(binary_changes) > 15
    for ours, theirs in zip(binary_changes, text_changes, strict=True):
        assert ours == theirs
    assert any(UNCHANGED_TEXT in str(change) for change in text_changes)  # the workload did reach TOAST
    _bulk_decoders_agree(binary)


def _bulk_decoders_agree(binary: list[bytes]) -> None:
    """The stream's bulk decoders read the server's row changes as :func:`decode_message` does
    (which the test above pins to test_decoding): all of them at once, and each table's plain
    ones (no old tuple on an update, no unsent TOAST) as columns."""
    rows = [data for data in binary if data[:1] in (b"I", b"U", b"D")]
    one_by_one = [decode_message(data) for data in rows]
    bulk = decode_changes(rows)
    for i, message in enumerate(one_by_one):
        assert bulk.relation_ids[i] == message.relation_id
        assert bulk.olds[i] == (None if isinstance(message, Insert) else message.old)
        assert bulk.news[i] == (None if isinstance(message, Delete) else message.new)
    plain = [
        i
        for i, m in enumerate(one_by_one)
        if not (isinstance(m, Update) and m.old is not None)
        and UNCHANGED not in (m.old if isinstance(m, Delete) else m.new)
    ]
    by_relation: dict[int, list[int]] = {}
    for i in plain:
        by_relation.setdefault(one_by_one[i].relation_id, []).append(i)
    assert len(by_relation) == 3
    for at in by_relation.values():
        columns = decode_columns([rows[i] for i in at])
        assert columns is not None
        for row, i in enumerate(at):
            m = one_by_one[i]
            carried = m.old if isinstance(m, Delete) else m.new
            assert tuple(column[row].as_py() for column in columns.columns) == carried


def test_column_values_type_as_the_server_reads_them(postgres):
    """The typed Arrow columns of pgoutput's text values equal what psycopg2 reads from the table."""
    postgres.create_database("pgoutput_types")
    with closing(_session(postgres, "pgoutput_types")) as conn, conn.cursor() as cur:
        cur.execute(SETUP)
        cur.execute("SELECT pg_create_logical_replication_slot('typed_slot', 'pgoutput')")
        for statement in WORKLOAD[:3]:
            cur.execute(statement)
        cur.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('typed_slot', NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'everything')"
        )
        messages = [decode_message(bytes(row[0])) for row in cur.fetchall()]
        cur.execute("SELECT * FROM accounts ORDER BY id")
        expected = cur.fetchall()
    relation = next(m for m in messages if isinstance(m, Relation) and m.name == "accounts")
    rows = [m.new for m in messages if isinstance(m, Insert)]
    for i, column in enumerate(relation.columns):
        kind = arrow_type(column.type_oid, column.typmod)
        values, bad = typed_column([row[i] for row in rows], kind)
        assert bad == []
        got = values.to_pylist()
        want = [row[i] for row in expected]
        if column.name == "ratio":
            assert got[0] == want[0] and str(got[1]) == "nan"
        elif column.name == "blob":
            assert got == [None if w is None else bytes(w) for w in want]
        elif column.name == "opened":
            assert [None if g is None else g.isoformat() for g in got] == [
                None if w is None else w.isoformat() for w in want
            ]
        else:
            assert got == want, column.name
    assert typed_column(["12", "twelve", None], pa.int32()) == (pa.array([12, None, None], pa.int32()), [1])


UNCHANGED_TEXT = "<unchanged>"


def _from_pgoutput(messages: list[bytes]) -> list[tuple]:
    """Changes as (xid, op, table, old, new), values as text; booleans as test_decoding spells them."""
    relations: dict[int, Relation] = {}
    xid = None
    out: list[tuple] = []

    def values(relation: Relation, row) -> dict:
        named = {}
        for column, value in zip(relation.columns, row, strict=True):
            if value is UNCHANGED:
                value = UNCHANGED_TEXT
            elif value is not None and column.type_oid == 16:
                value = {"t": "true", "f": "false"}[value]
            named[column.name] = value
        return named

    for data in messages:
        message = decode_message(data)
        if isinstance(message, Begin):
            xid = message.xid
            out.append((xid, "BEGIN"))
        elif isinstance(message, Commit):
            out.append((xid, "COMMIT"))
        elif isinstance(message, Relation):
            relations[message.relation_id] = message
        elif isinstance(message, Insert):
            rel = relations[message.relation_id]
            out.append((xid, "INSERT", rel.qualified, None, values(rel, message.new)))
        elif isinstance(message, Update):
            rel = relations[message.relation_id]
            old = None if message.old is None else _present(values(rel, message.old))
            out.append((xid, "UPDATE", rel.qualified, old, values(rel, message.new)))
        elif isinstance(message, Delete):
            rel = relations[message.relation_id]
            out.append((xid, "DELETE", rel.qualified, _present(values(rel, message.old)), None))
        elif isinstance(message, Truncate):
            tables = sorted(relations[r].qualified for r in message.relation_ids)
            out.append((xid, "TRUNCATE", tables, message.cascade, message.restart_identity))
    return out


def _present(row: dict) -> dict:
    """An old key or row as test_decoding prints it: without its null columns (a key tuple's
    non-key columns are null)."""
    return {name: value for name, value in row.items() if value is not None}


def _from_test_decoding(lines: list[str]) -> list[tuple]:
    """test_decoding's text lines parsed into the same tuples (its format: contrib/test_decoding)."""
    out: list[tuple] = []
    xid = None
    for line in lines:
        if line.startswith("BEGIN "):
            xid = int(line.split()[1])
            out.append((xid, "BEGIN"))
            continue
        if line.startswith("COMMIT "):
            out.append((xid, "COMMIT"))
            continue
        assert line.startswith("table "), line
        head, op, rest = line[len("table ") :].split(": ", 2) if line.count(": ") >= 2 else (*line[6:].split(": "), "")
        if op == "TRUNCATE":
            flags = rest.split()
            out.append((xid, "TRUNCATE", sorted(head.split(", ")), "cascade" in flags, "restart_seqs" in flags))
            continue
        if op == "INSERT":
            out.append((xid, "INSERT", head, None, _values(rest)))
        elif op == "UPDATE":
            old = None
            if rest.startswith("old-key: "):
                old_text, new_text = rest[len("old-key: ") :].split(" new-tuple: ")
                old, rest = _values(old_text), new_text
            out.append((xid, "UPDATE", head, old, _values(rest)))
        elif op == "DELETE":
            out.append((xid, "DELETE", head, _values(rest), None))
        else:
            raise AssertionError(line)
    return out


def _values(text: str) -> dict:
    """``name[type]:value ...``: a quoted value doubles its quotes; ``null`` and
    ``unchanged-toast-datum`` are bare words."""
    values: dict = {}
    pos = 0
    while pos < len(text):
        open_at = text.index("[", pos)
        name = text[pos:open_at]
        close_at = text.index("]:", open_at)
        pos = close_at + 2
        if text[pos] == "'":
            pos += 1
            chunks = []
            while True:
                quote = text.index("'", pos)
                chunks.append(text[pos:quote])
                if text.startswith("''", quote):
                    chunks.append("'")
                    pos = quote + 2
                    continue
                pos = quote + 1
                break
            value: str | None = "".join(chunks)
        else:
            end = text.find(" ", pos)
            end = len(text) if end < 0 else end
            word = text[pos:end]
            pos = end
            value = None if word == "null" else UNCHANGED_TEXT if word == "unchanged-toast-datum" else word
        values[name] = value
        pos += 1  # the space before the next column
    return values
