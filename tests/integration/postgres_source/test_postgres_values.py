"""Every value a PostgreSQL table holds lands as the server holds it (issue 40).

One types table: a column of every built-in type family (and arrays, a domain, an enum, a
composite type, ranges), each with its edge values (``NaN`` and the infinities, the first and
last dates and timestamps the server takes, ``numeric(1000, 500)``, money's bounds, JSON the
server keeps as written). Its rows are copied by the snapshot, then each row is updated through
every edge value of every column, new rows inserted and some deleted, in the stream. An
``upsert`` pipeline and an ``append`` pipeline read it; both are read back by the tests' own
reader (pyarrow over the ``_delta_log``, :mod:`tests.faults.reader`), and every value must equal
what the server returns for ``SELECT col::text`` (its output function's text), column by column: in its typed column,
formatted here by code of this file, or as the text kept in ``_unheld`` when the column's Arrow
type cannot hold it. ``_errors`` stays empty.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest

from reclock.runtime.pipeline import Pipeline
from tests.delta_log import lake_file_schema_mismatches
from tests.integration.postgres_source.test_postgres_source import drop_slot, execute, make_source, output_table, query

#: (column, type, edge values as SQL literals). A row ``r`` at version ``v`` holds, in each
#: column, the value at ``(r + v) % len(values)``: every row passes through every value.
COLUMNS: list[tuple[str, str, list[str]]] = [
    ("b", "boolean", ["true", "false"]),
    ("i2", "smallint", ["-32768", "32767", "0"]),
    ("i4", "integer", ["-2147483648", "2147483647"]),
    ("i8", "bigint", ["-9223372036854775808", "9223372036854775807"]),
    ("o", "oid", ["0", "4294967295"]),
    ("f4", "real", ["'NaN'", "'Infinity'", "'-Infinity'", "'1.17549435e-38'", "'3.4028235e+38'", "'-0'"]),
    (
        "f8",
        "double precision",
        ["'NaN'", "'Infinity'", "'-Infinity'", "'4.9e-324'", "'1.7976931348623157e+308'", "'0.1'"],
    ),
    ("n", "numeric(10,2)", ["'NaN'", "'-99999999.99'", "'99999999.99'", "'0'", "'0.01'"]),
    ("n38", "numeric(38,10)", ["'9999999999999999999999999999.9999999999'", "'NaN'", "'-0.0000000001'"]),
    ("nu", "numeric", ["'NaN'", "'Infinity'", "'-Infinity'", "'1e-1000'", "'-1e1000'"]),
    ("nbig", "numeric(1000,500)", ["repeat('9', 500) || '.' || repeat('9', 500)", "'NaN'", "'-0.5'"]),
    ("m", "money", ["'-92233720368547758.08'", "'92233720368547758.07'"]),
    (
        "d",
        "date",
        ["'infinity'", "'-infinity'", "'4713-01-01 BC'", "'5874897-12-31'", "'2000-02-29'", "'0001-01-01 BC'"],
    ),
    (
        "ts",
        "timestamp",
        [
            "'infinity'",
            "'-infinity'",
            "'4713-01-01 00:00:00 BC'",
            "'294276-12-31 23:59:59.999999'",
            "'294247-01-10 04:00:54.775807'",  # the last microsecond Arrow holds
            "'294247-01-10 04:00:54.775808'",  # the first it does not
            "'1999-12-31 23:59:59.5'",
        ],
    ),
    (
        "tz",
        "timestamptz",
        [
            "'infinity'",
            "'-infinity'",
            "'4714-11-24 00:00:00+00 BC'",
            "'294276-12-31 23:59:59.999999+00'",
            "'2000-01-01 00:00:00.000001+00'",
        ],
    ),
    ("t", "time", ["'00:00'", "'24:00:00'", "'23:59:59.999999'"]),
    ("ttz", "timetz", ["'00:00+1559'", "'24:00-1559'"]),
    ("iv", "interval", ["'-178000000 years'", "'178000000 years'", "'1 day -00:00:01'"]),
    ("bt", "bit(3)", ["B'101'", "B'000'"]),
    ("vb", "bit varying", ["B''", "B'1'"]),
    ("ba", "bytea", ["'\\x'", "'\\x00ff'"]),
    ("tx", "text", ["''", "'é'", "E'a\\nb\\t\"c\"'", "'\\N'", "'NULL'", "repeat('x', 3000)"]),
    ("vc", "varchar(5)", ["'abcde'", "''"]),
    ("ch", "char(3)", ["'a'", "'abc'"]),
    ("nm", "name", ["'n'"]),
    ("u", "uuid", ["'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'"]),
    ("j", "json", ['\'{"a": 1, "a": 2}\'', "'  [1,  2 ] '", "'\"\\u0000\"'", "'null'", "'1e400'"]),
    ("jb", "jsonb", ['\'{"b": 1, "a": [1.0e2]}\'', "'null'", "'\"é\"'", "'{}'"]),
    ("x", "xml", ["'<a>x</a>'", "'text only'"]),
    ("tv", "tsvector", ["'a fat cat'", "''"]),
    ("tq", "tsquery", ["'fat & rat'"]),
    ("ir", "int4range", ["'[1,5)'", "'empty'", "'(,)'"]),
    ("nr", "numrange", ["'[1.5,2.5]'"]),
    ("tr", "tsrange", ["'[-infinity,infinity]'", "'[2000-01-01,)'"]),
    ("dr", "daterange", ["'[4713-01-01 BC,infinity)'"]),
    ("mr", "int4multirange", ["'{[1,2),[5,6)}'", "'{}'"]),
    ("ip", "inet", ["'::1/128'", "'192.168.0.1/24'"]),
    ("cd", "cidr", ["'10.0.0.0/8'"]),
    ("mc", "macaddr", ["'08:00:2b:01:02:03'"]),
    ("m8", "macaddr8", ["'08:00:2b:01:02:03:04:05'"]),
    ("pt", "point", ["'(1,2)'", "'(NaN,Infinity)'"]),
    ("ln", "line", ["'{1,-1,0}'"]),
    ("ls", "lseg", ["'[(0,0),(1,1)]'"]),
    ("bx", "box", ["'(1,1),(0,0)'"]),
    ("ph", "path", ["'[(0,0),(1,1)]'"]),
    ("pg", "polygon", ["'((0,0),(1,1),(1,0))'"]),
    ("ci", "circle", ["'<(0,0),1>'"]),
    ("lsn", "pg_lsn", ["'0/0'", "'FFFFFFFF/FFFFFFFF'"]),
    ("ia", "integer[]", ["'{1,NULL}'", "'{{1,2},{3,4}}'", "'[0:1]={1,2}'", "'{}'"]),
    ("na", "numeric(10,2)[]", ["'{NaN,1.50}'"]),
    ("da", "date[]", ["'{infinity,\"4713-01-01 BC\"}'"]),
    ("ta", "text[]", ["ARRAY['a,b', '\"', NULL, 'NULL', '\\']"]),
    ("tsa", "timestamptz[]", ["'{-infinity,\"2000-01-01 00:00:00+00\"}'"]),
    ("dm", "money_plus", ["'NaN'", "'1.25'"]),
    ("en", "mood", ["'sad'", "'happy'"]),
    ("ea", "mood[]", ["'{sad,happy}'"]),
    ("cp", "pair", ["'(1,\"x y\")'", "'(,)'"]),
    ("bo", "boolean[]", ["'{t,f,NULL}'"]),
]
NAMES = [name for name, _, _ in COLUMNS]
ROWS = 7  # snapshot rows 1..7; the stream inserts 8..14
VERSIONS = max(len(values) for _, _, values in COLUMNS)


def _value(column: int, row: int, version: int) -> str:
    values = COLUMNS[column][2]
    return values[(row + version) % len(values)]


@pytest.fixture(scope="module")
def types_db(postgres):
    """The types table's database, with the server's own text of every edge value."""
    db = "pgvalues"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE DOMAIN money_plus AS numeric(10,2) CHECK (VALUE IS NULL OR VALUE = 'NaN' OR VALUE >= 0)",
        "CREATE TYPE mood AS ENUM ('sad', 'happy')",
        "CREATE TYPE pair AS (a int, b text)",
        "CREATE TABLE types (id int PRIMARY KEY, v int, "
        + ", ".join(f"{name} {kind}" for name, kind, _ in COLUMNS)
        + ")",
    )
    # each value's text as its type's output function writes it (concat() calls it, as COPY and
    # pgoutput do): a plain ::text cast is that text too, except that it trims char(n)'s padding
    # and spells booleans out
    literals = [f"concat(({v})::{kind})" for _, kind, values in COLUMNS for v in values]
    texts = iter(query(postgres, db, "SELECT " + ", ".join(literals))[0])
    truth = {name: [next(texts) for _ in values] for name, _, values in COLUMNS}
    return db, truth


def _insert(row: int, version: int) -> str:
    values = ", ".join(f"({_value(c, row, version)})::{COLUMNS[c][1]}" for c in range(len(COLUMNS)))
    return f"INSERT INTO types VALUES ({row}, {version}, {values})"


def _update(row: int, version: int) -> str:
    sets = ", ".join(f"{name} = ({_value(c, row, version)})::{COLUMNS[c][1]}" for c, name in enumerate(NAMES))
    return f"UPDATE types SET v = {version}, {sets} WHERE id = {row}"


def _text(kind: pa.DataType, value: object) -> str | None:
    """A typed value as the server writes its text (DateStyle ISO, UTC), by this file's own code."""
    if value is None:
        return None
    if pa.types.is_boolean(kind):
        return "t" if value else "f"
    if pa.types.is_binary(kind):
        return "\\x" + value.hex()  # type: ignore[attr-defined]
    if pa.types.is_decimal(kind):
        return format(value, "f")
    if pa.types.is_date32(kind):
        return _civil(int(value))  # type: ignore[call-overload]
    if pa.types.is_timestamp(kind):
        us = int(value)  # type: ignore[call-overload]
        days, rest = divmod(us, 86_400_000_000)
        seconds, micro = divmod(rest, 1_000_000)
        clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if micro:
            clock += f".{micro:06d}".rstrip("0")
        date = _civil(days)
        bc = date.endswith(" BC")
        text = f"{date.removesuffix(' BC')} {clock}{'+00' if kind.tz else ''}"
        return text + (" BC" if bc else "")
    return str(value)


def _civil(days: int) -> str:
    """The proleptic Gregorian date ``days`` after 1970-01-01, as the server writes it."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    return f"{year:04d}-{month:02d}-{day:02d}" if year > 0 else f"{1 - year:04d}-{month:02d}-{day:02d} BC"


def _same(kind: pa.DataType, got: str | None, want: str | None) -> bool:
    if pa.types.is_floating(kind) and got is not None and want is not None:
        g, w = float(got), float(want)
        if pa.types.is_float32(kind):  # the server's shortest text of a float4 reads back as that float4
            g, w = float(np.float32(g)), float(np.float32(w))
        return (math.isnan(g) and math.isnan(w)) or (g == w and math.copysign(1, g) == math.copysign(1, w))
    return got == want


def _check_row(schema: pa.Schema, row: dict, truth: dict[str, list[str]], where: str) -> None:
    """``row`` (an output row: the table's columns and ``_unheld``, dates and timestamps as their
    integers) holds version ``v`` of its id; ``schema`` has the row's own types."""
    unheld = json.loads(row["_unheld"]) if row.get("_unheld") else {}
    for c, name in enumerate(NAMES):
        kind = schema.field(name).type
        values = COLUMNS[c][2]
        want = truth[name][(row["id"] + row["v"]) % len(values)]
        typed = row[name]
        if name in unheld:
            assert typed is None, (where, name, typed, unheld[name])
            got = unheld[name]
        else:
            got = _text(kind, typed)
        assert _same(kind, got, want), (where, row["id"], row["v"], name, got, want)


def _as_storage(table: pa.Table) -> pa.Table:
    """Dates and timestamps as their integers: Python's datetime holds years 1 to 9999 only."""

    def plain(kind: pa.DataType) -> pa.DataType:
        if pa.types.is_date32(kind):
            return pa.int32()
        if pa.types.is_timestamp(kind):
            return pa.int64()
        if pa.types.is_struct(kind):
            return pa.struct([kind.field(i).with_type(plain(kind.field(i).type)) for i in range(kind.num_fields)])
        return kind

    return table.cast(pa.schema([f.with_type(plain(f.type)) for f in table.schema]))


def test_every_value_of_every_type_lands_as_the_server_holds_it_through_the_snapshot_and_the_stream(
    postgres, types_db, tmp_path
):
    db, truth = types_db
    execute(postgres, db, "TRUNCATE types", *(_insert(r, 0) for r in range(1, ROWS + 1)))
    upsert = make_source(postgres, db, tmp_path / "u", tables=["types"], slot="s_values_u", publication="p_values")
    append = make_source(
        postgres, db, tmp_path / "a", tables=["types"], slot="s_values_a", publication="p_values", envelope="append"
    )
    pipelines = [Pipeline("u", tmp_path / "lake", upsert), Pipeline("a", tmp_path / "lake", append)]
    for pipeline in pipelines:
        pipeline.step()  # the snapshot

    def check_mirror(step: str) -> None:
        table = output_table(tmp_path / "lake", "u", "public_types")
        rows = _as_storage(table).to_pylist()
        ids = sorted(r[0] for r in query(postgres, db, "SELECT id FROM types"))
        assert sorted(r["id"] for r in rows) == ids, step
        versions = dict(query(postgres, db, "SELECT id, v FROM types"))
        for row in rows:
            assert row["v"] == versions[row["id"]], (step, row["id"])
            _check_row(table.schema, row, truth, step)

    check_mirror("snapshot")
    # the stream: every row through every value of every column, new rows, deletes
    statements = [_insert(r, 0) for r in range(ROWS + 1, 2 * ROWS + 1)]
    for version in range(1, VERSIONS + 1):
        statements.append("BEGIN")
        statements += [_update(r, version) for r in range(1, 2 * ROWS + 1)]
        statements.append("COMMIT")
    statements.append("DELETE FROM types WHERE id IN (2, 9)")
    execute(postgres, db, *statements)
    for pipeline in pipelines:
        pipeline.step()
    check_mirror("stream")
    changes = output_table(tmp_path / "lake", "a", "public_types")
    schema = changes.schema.field("after").type
    seen: set[tuple[int, int]] = set()
    for change in _as_storage(changes).to_pylist():
        if change["op"] == "d":
            assert change["before"]["id"] in (2, 9) and change["after"] is None
            continue
        after = change["after"]
        _check_row(pa.schema(list(schema)), after, truth, f"change {change['op']}")
        seen.add((after["id"], after["v"]))
    assert seen == {(r, v) for r in range(1, 2 * ROWS + 1) for v in range(VERSIONS + 1)}
    for lake_pipeline in ("u", "a"):
        assert output_table(tmp_path / "lake", lake_pipeline, "_errors").num_rows == 0
    assert lake_file_schema_mismatches(tmp_path / "lake") == []  # snapshot, stream and MERGE files alike
    for source in (upsert, append):
        drop_slot(postgres, db, source.options.slot)


def test_an_update_leaving_a_toasted_value_unsent_under_the_default_identity_leaves_the_mirror_equal_to_the_table(
    postgres, tmp_path
):
    """``UPDATE tt SET small = small + 100`` does not send ``big`` (TOASTed, unchanged) under the
    default replica identity: the upsert output keeps its value, from the table (the update's
    own batch holds no other record of the key) or from the batch's earlier record (a value set
    in an earlier transaction of the same batch), and ``_errors`` stays empty. An append output,
    which has no earlier row, reports it as ``unchanged_toast`` naming the column."""
    db = "pgtoast"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE tt (id int PRIMARY KEY, small int, big text, note text)",
        "ALTER TABLE tt ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO tt SELECT g, g, repeat(chr(96 + g), 30000), 'n' FROM generate_series(1, 6) g",
    )
    upsert = make_source(postgres, db, tmp_path / "u", tables=["tt"], slot="s_toast_u", publication="p_toast")
    append = make_source(
        postgres, db, tmp_path / "a", tables=["tt"], slot="s_toast_a", publication="p_toast", envelope="append"
    )
    pipelines = [Pipeline("u", tmp_path / "lake", upsert), Pipeline("a", tmp_path / "lake", append)]
    for pipeline in pipelines:
        pipeline.step()  # the snapshot
    execute(postgres, db, "UPDATE tt SET small = small + 100")
    pipelines[0].step()  # the table holds big for every key: the MERGE keeps it
    execute(
        postgres,
        db,
        "UPDATE tt SET big = repeat('z', 30000) WHERE id = 2",  # sent: the next update's value
        "UPDATE tt SET small = small + 1000, note = 'm' WHERE id IN (1, 2)",  # big unsent again
        "INSERT INTO tt VALUES (7, 7, repeat('q', 30000), 'n')",
        "UPDATE tt SET small = 77 WHERE id = 7",
        "DELETE FROM tt WHERE id = 3",
    )
    for pipeline in pipelines:
        pipeline.step()
    want = {r[0]: r[1:] for r in query(postgres, db, "SELECT id, small, big, note FROM tt")}
    mirror = output_table(tmp_path / "lake", "u", "public_tt").to_pylist()
    assert {r["id"]: (r["small"], r["big"], r["note"]) for r in mirror} == want
    assert output_table(tmp_path / "lake", "u", "_errors").num_rows == 0
    errors = output_table(tmp_path / "lake", "a", "_errors").to_pylist()
    assert {e["kind"] for e in errors} == {"unchanged_toast"} and len(errors) == 6 + 2 + 1
    assert all("column big" in e["message"] and "REPLICA IDENTITY FULL" in e["message"] for e in errors)
    assert lake_file_schema_mismatches(tmp_path / "lake") == []
    for source in (upsert, append):
        drop_slot(postgres, db, source.options.slot)
