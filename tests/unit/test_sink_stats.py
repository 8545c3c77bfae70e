"""Whatever values a batch holds, the sink's Delta log stays strict JSON with exact statistics.

A single ``Infinity`` once made an output unreadable: the statistics writer put a non-JSON number
in the log. These properties write hostile values of every column type the decoders produce
through the real sink, then check the log from outside: every entry parses with a strict JSON
parser, every ``minValues``/``maxValues`` bound holds for the file it describes, and the table
reads back equal to the input both through pyarrow over the files the log lists and through
delta-rs's own query engine, also after a checkpoint.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.persist.data_files import _stats_json, write_data_file
from reclock.persist.sink import OutputSink, table_schema

_UTC = dt.UTC

FLOATS = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan, -0.0, 0.0, 1e308, -1e308, 5e-324]),
    st.floats(allow_nan=True, allow_infinity=True),
)
FLOATS32 = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan, -0.0, 3.4028234663852886e38]),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
)
TEXT = st.one_of(st.sampled_from(["", "x" * 100_000, "\u0000", "é\U0001f600", "Infinity", "NaN"]), st.text(max_size=80))
DECIMALS = st.decimals(min_value=-(10**36) + 1, max_value=10**36 - 1, places=2, allow_nan=False, allow_infinity=False)
TIMESTAMPS = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59))

#: (Arrow type, values) for every type a decoder can hand the sink (see sources/decode/ and sources/files/).
COLUMN_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy]] = {
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float32": (pa.float32(), FLOATS32),
    "float64": (pa.float64(), FLOATS),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), TEXT),
    "binary": (pa.binary(), st.one_of(st.binary(max_size=64), st.just(b"\xff\xfe" * 50_000))),
    "date": (pa.date32(), st.dates()),
    "timestamp_utc": (pa.timestamp("us", tz="UTC"), TIMESTAMPS.map(lambda t: t.replace(tzinfo=_UTC))),
    "timestamp_ms_utc": (pa.timestamp("ms", tz="UTC"), TIMESTAMPS.map(lambda t: t.replace(microsecond=0, tzinfo=_UTC))),
    "timestamp_naive": (pa.timestamp("us"), TIMESTAMPS),
    "decimal": (pa.decimal128(38, 2), DECIMALS),
    "list": (pa.list_(pa.float64()), st.lists(st.one_of(st.none(), FLOATS), max_size=4)),
    "struct": (
        pa.struct([("a", pa.string()), ("b", pa.float64())]),
        st.fixed_dictionaries({"a": st.one_of(st.none(), TEXT), "b": st.one_of(st.none(), FLOATS)}),
    ),
    "map": (
        pa.map_(pa.string(), pa.float64()),
        st.dictionaries(st.text(max_size=5), st.one_of(st.none(), FLOATS), max_size=3).map(lambda d: list(d.items())),
    ),
}


@st.composite
def batches(draw: st.DrawFn) -> tuple[pa.Schema, list[pa.Table]]:
    """An output schema over some column types, and 1-3 batches of rows, nulls anywhere."""
    names = draw(st.lists(st.sampled_from(sorted(COLUMN_TYPES)), min_size=1, max_size=5, unique=True))
    own = pa.schema([(n, COLUMN_TYPES[n][0]) for n in names])
    schema = table_schema(own)
    out = []
    offset = 0
    for into_ts in sorted(draw(st.sets(st.integers(1, 10**12), min_size=1, max_size=3))):
        n = draw(st.integers(1, 6))
        columns = {
            name: draw(st.lists(st.one_of(st.none(), COLUMN_TYPES[name][1]), min_size=n, max_size=n)) for name in names
        }
        columns |= {"_into_ts": [into_ts] * n, "_partition": ["p"] * n, "_offset": list(range(offset, offset + n))}
        offset += n
        out.append(pa.table(columns, schema=schema))
    return schema, out


def _strict(constant: str) -> None:
    raise ValueError(f"non-JSON number {constant} in the Delta log")


def _log_entries(root: Path) -> list[dict]:
    """Every action of every commit, parsed strictly; stats strings parsed strictly too."""
    actions = []
    for commit in sorted((root / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line, parse_constant=_strict)
            if "add" in action and action["add"].get("stats"):
                action["add"]["stats"] = json.loads(action["add"]["stats"], parse_constant=_strict)
            actions.append(action)
    return actions


def _comparable(value: object) -> object:
    """Python values with NaN and the sign of zero made visible, so equality is exact."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_comparable(v) for v in value]
    return value


def _rows(table: pa.Table) -> list:
    return _comparable(table.sort_by("_offset").to_pylist())


def _engine(root: Path, sql: str) -> pa.Table:
    """``sql`` over the table as delta-rs's own engine reads it (its log parsing, its skipping)."""
    return pa.table(QueryBuilder().register("t", DeltaTable(str(root))).execute(sql))


def _bound_holds(bound: object, values: list, check) -> bool:
    present = [v for v in values if v is not None]
    return all(check(bound, v) for v in present)


@settings(max_examples=40)
@given(batches())
def test_any_values_leave_a_strict_json_log_with_exact_bounds_and_read_back_equal(tmp_path_factory, drawn):
    schema, tables = drawn
    root = tmp_path_factory.mktemp("sink") / "out"
    sink = OutputSink(root, "reclock/p/out", schema)
    for table in tables:
        assert sink.commit([write_data_file(str(root), "out", table)], table.column("_into_ts")[0].as_py())
    expected = _rows(pa.concat_tables(tables))

    adds = [a["add"] for a in _log_entries(root) if "add" in a]
    assert len(adds) == len(tables)
    for add in adds:
        stats = add["stats"]
        data = pq.read_table(root / add["path"]).to_pydict()
        assert stats["numRecords"] == len(data["_offset"])
        for name, low in stats["minValues"].items():
            assert _bound_holds(low, data[name], lambda b, v: b <= v), (name, low)
        for name, high in stats["maxValues"].items():
            assert _bound_holds(high, data[name], lambda b, v: v <= b), (name, high)
    files = [str(root / add["path"]) for add in adds]
    assert _rows(pq.read_table(files, schema=schema)) == expected

    DeltaTable(str(root)).create_checkpoint()
    assert _rows(_engine(root, "SELECT * FROM t").cast(schema)) == expected


def test_infinity_in_a_double_column_keeps_the_table_readable_and_unskipped(tmp_path):
    """The reported case: ``Infinity`` beside finite values, then a reader filtering on the column."""
    schema = table_schema(pa.schema([("price", pa.float64())]))
    sink = OutputSink(tmp_path / "out", "reclock/p/out", schema)
    table = pa.table(
        {"price": [1.5, math.inf, -math.inf], "_into_ts": [7] * 3, "_partition": ["0"] * 3, "_offset": [0, 1, 2]},
        schema=schema,
    )
    sink.commit([write_data_file(str(sink.path), "out", table)], 7)
    _log_entries(sink.path)
    assert OutputSink(tmp_path / "out", "reclock/p/out", schema).upper == 8
    actions = pa.table(DeltaTable(str(sink.path)).get_add_actions(flatten=True))
    assert actions.column("num_records").to_pylist() == [3]
    assert actions.column("min._into_ts").to_pylist() == [7]
    query = "SELECT count(*) AS n FROM t WHERE price > 1e300"
    found = _engine(sink.path, query)
    assert found.column("n").to_pylist() == [1]


def test_decimal_and_timestamp_extremes_round_trip(tmp_path):
    schema = table_schema(pa.schema([("d", pa.decimal128(38, 2)), ("t", pa.timestamp("us", tz="UTC"))]))
    sink = OutputSink(tmp_path / "out", "reclock/p/out", schema)
    edge = decimal.Decimal("9" * 36 + ".99")  # the largest decimal(38, 2)
    table = pa.table(
        {
            "d": [edge, edge.copy_negate()],
            "t": [dt.datetime(1, 1, 1, tzinfo=_UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=_UTC)],
            "_into_ts": [1, 1],
            "_partition": ["0", "0"],
            "_offset": [0, 1],
        },
        schema=schema,
    )
    sink.commit([write_data_file(str(sink.path), "out", table)], 1)
    _log_entries(sink.path)
    assert _rows(_engine(sink.path, "SELECT * FROM t").cast(schema)) == _rows(table)


def test_bounds_taken_from_the_parquet_footer_are_the_rows_own_over_every_row_group(tmp_path):
    """Integer and string bounds come from the writer's footer, not a second pass: they must be
    the rows' exact least and greatest values whichever row group holds them, in the readers'
    order (unsigned 64-bit, UTF-8 bytes), with no bound for a column the footer lacks one for
    (a row group of nulls only, a string too long) and float bounds still refused beside NaN."""
    long = "z" * 65
    table = pa.table(
        {
            "i8": pa.array([3, -128, 127, 0, None, 5], pa.int8()),
            "u64": pa.array([2**64 - 1, 1, 7, 2**63, 2**63 - 1, 9], pa.uint64()),
            "s": ["b", "é", "a" * 64, "\u0000", None, "Z"],
            "ls": pa.array(["m", "n", "o", "p", "q", "a"], pa.large_string()),
            "late": [None, None, None, "x", "y", "w"],
            "wide": ["a", "b", long, "c", "d", "e"],
            "f": [1.0, 2.0, math.nan, 0.5, None, 3.0],
            "g": [1.5, -2.0, None, 0.25, 8.0, 3.0],
            "_into_ts": pa.array([7] * 6, pa.int64()),
        }
    )
    footer: list[pq.FileMetaData] = []
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=3, metadata_collector=footer)
    assert footer[0].num_row_groups == 2
    stats = json.loads(_stats_json(table, footer[0]))
    assert stats["numRecords"] == 6
    assert stats["minValues"] == {"i8": -128, "u64": 1, "s": "\u0000", "ls": "a", "g": -2.0, "_into_ts": 7}
    assert stats["maxValues"] == {"i8": 127, "u64": 2**64 - 1, "s": "é", "ls": "q", "g": 8.0, "_into_ts": 7}
    assert stats["nullCount"] == {
        "i8": 1,
        "u64": 0,
        "s": 1,
        "ls": 0,
        "late": 3,
        "wide": 0,
        "f": 1,
        "g": 1,
        "_into_ts": 0,
    }
    for name in ("s", "u64", "i8"):  # the same as a pass over the rows
        bounds = pc.min_max(table.column(name))
        assert (stats["minValues"][name], stats["maxValues"][name]) == (bounds["min"].as_py(), bounds["max"].as_py())
