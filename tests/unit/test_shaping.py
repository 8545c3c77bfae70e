"""Shaping and routing: transforms between decode and the sink, their error port and their checks."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import duckdb_extension_delta
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.cli.main import main
from reclock.errors import ConfigError, ContractError
from reclock.job.config import build_source, check_shapes, parse_config
from reclock.persist.lake import Lake
from reclock.persist.layout import INTO_DATE, OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.shaping import TRANSFORM_ERROR, Shape, apply_route, route_outputs
from reclock.sources.base import ERRORS, ERRORS_SCHEMA, Output
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION
from tests.delta_log import replay

FRACTIONS = pa.schema([("num", pa.int64()), ("den", pa.int64())])
OUTPUTS = {"m": Output("m", FRACTIONS), ERRORS: Output(ERRORS, ERRORS_SCHEMA)}
RATIO = "SELECT num, num / den AS ratio FROM input WHERE num >= 0"
BIG = "SELECT num FROM input WHERE num > 2"


def route(*shapes: Shape, outputs=OUTPUTS):
    resolved, routes = route_outputs(outputs, shapes)
    return resolved, routes


def batch(nums: list[int], dens: list[int], partition: str = "p0", into: int = 1_000) -> pa.Table:
    n = len(nums)
    return pa.table(
        {
            PARTITION: pa.array([partition] * n),
            OFFSET: pa.array(range(n), pa.int64()),
            "num": pa.array(nums, pa.int64()),
            "den": pa.array(dens, pa.int64()),
            INTO_TS: pa.array([into] * n, pa.int64()),
        }
    )


def shaped(sql: str = RATIO, **kw) -> object:
    _, routes = route(Shape("m", sql=sql, **kw))
    return routes["m"][0]


# -- definitions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "function"),
    [
        ("SELECT num, random() AS r FROM input", "random"),
        ("SELECT num FROM input WHERE now() > 0", "now"),
        ("SELECT num, current_timestamp AS t FROM input", "now"),
        ("SELECT num, UUID() AS u FROM input", "uuid"),
        # Spellings a deny-list of names in the text let through: the plan has resolved them.
        ('SELECT num, "now"() AS t FROM input', "now"),
        ("SELECT num, random/**/() AS r FROM input", "random"),
        ("SELECT num, random -- a comment\n () AS r FROM input", "random"),
        ("SELECT num, rand() AS r FROM input", "random"),
        # Stable functions too: the same within a query, but not between a run and its replay.
        ("SELECT num, current_date AS d FROM input", "current_date"),
        ("SELECT num, CAST(current_time AS VARCHAR) AS t FROM input", "current_time"),
        ("SELECT num FROM input WHERE CASE WHEN num > 0 THEN den ELSE abs(random()) END > 0", "random"),
        ("SELECT num, coalesce(NULL, date_trunc('day', today())) AS d FROM input", "current_date"),
    ],
)
def test_sql_calling_a_volatile_or_stable_function_is_refused_naming_the_output_and_the_function(sql, function):
    with pytest.raises(ConfigError) as caught:
        route(Shape("m", sql=sql))
    assert caught.value.field == "outputs.m.sql"
    assert caught.value.reason.startswith(f"{function}() is not deterministic") and "\n" not in str(caught.value)


def test_names_of_volatile_functions_in_strings_or_as_columns_are_allowed():
    named = {"m": Output("m", pa.schema([("name", pa.string()), ("now", pa.int64())]))}
    sql = "SELECT now, 'random()' AS label, upper(name) AS big, to_timestamp(now) AS t FROM input WHERE name <> 'now()'"
    resolved, _ = route(Shape("m", sql=sql), outputs=named)
    assert resolved["m"].schema.names == ["now", "label", "big", "t"]


def test_a_definition_with_random_fails_at_create_in_one_line():
    raw = {
        "pipeline": {"name": "p"},
        "source": {"kind": "generator", "limit": 10},
        "outputs": {"lucky": {"from": "bids", "sql": "SELECT price FROM input WHERE random() < 0.5"}},
    }
    config = parse_config(raw, file="p.toml")
    with pytest.raises(ConfigError, match=r"^p\.toml: outputs\.lucky\.sql: random\(\) is not deterministic") as caught:
        check_shapes(config, build_source(config, created_at_ms=0), file="p.toml")
    assert "\n" not in str(caught.value)


def test_outputs_tables_round_trip_through_the_stored_definition():
    raw = {
        "pipeline": {"name": "p"},
        "source": {"kind": "generator", "limit": 10},
        "outputs": {"big": {"from": "bids", "sql": "SELECT price FROM input WHERE price > 10"}},
    }
    config = parse_config(raw)
    assert config.shapes == (Shape("big", "bids", "SELECT price FROM input WHERE price > 10"),)
    assert parse_config(config.to_dict()) == config
    assert "outputs" not in parse_config({k: v for k, v in raw.items() if k != "outputs"}).to_dict()


@pytest.mark.parametrize(
    ("outputs", "field", "message"),
    [
        ({"x": {"sql": 3}}, "outputs.x.sql", "expected a string"),
        ({"x": {"from": "bids"}}, "outputs.x.sql", "missing"),
        ({"x": {"sql": "SELECT 1", "into": "y"}}, "outputs.x.into", "unknown key"),
        ({"x": "SELECT 1"}, "outputs.x", "must be a table"),
    ],
)
def test_bad_outputs_tables_name_their_field(outputs, field, message):
    raw = {"pipeline": {"name": "p"}, "source": {"kind": "generator", "limit": 10}, "outputs": outputs}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert caught.value.field == field and message in caught.value.reason


@pytest.mark.parametrize(
    ("shape", "field", "message"),
    [
        (Shape("m", sql="SELECT nope FROM input"), "outputs.m.sql", "nope"),
        (Shape("m", sql="SELECT count(*) AS n FROM input"), "outputs.m.sql", "Aggregate in the query"),
        (Shape("m", sql="SELECT num FROM input GROUP BY num"), "outputs.m.sql", "Aggregate in the query"),
        (Shape("m", sql="SELECT DISTINCT num FROM input"), "outputs.m.sql", "Distinct in the query"),
        (Shape("m", sql="SELECT num FROM input ORDER BY num LIMIT 3"), "outputs.m.sql", "Limit in the query"),
        (Shape("m", sql="SELECT row_number() OVER () AS r FROM input"), "outputs.m.sql", "WindowExpr in the"),
        (Shape("m", sql="SELECT num FROM input WHERE num > (SELECT avg(num) FROM input)"), "outputs.m.sql", "Subquery"),
        (Shape("m", sql="SELECT x.num FROM input x JOIN input y ON x.num = y.den"), "outputs.m.sql", "Join in the"),
        (Shape("m", sql="SELECT num FROM input UNION ALL SELECT den FROM input"), "outputs.m.sql", "Union in the"),
        (Shape("m", sql="SELECT * FROM (SELECT num FROM input) s"), "outputs.m.sql", "not from a subquery"),
        (Shape("m", sql="SELECT num AS _mine FROM input"), "outputs.m.sql", "'_mine'"),
        (Shape("m", sql="SELECT NULL AS nothing FROM input"), "outputs.m.sql", "no type"),
        (Shape("m", sql="WITH t AS (SELECT * FROM input) SELECT num FROM t"), "outputs.m.sql", "one SELECT"),
        (Shape("m"), "outputs.m.sql", "exactly one"),
        (Shape("x", input="missing", sql="SELECT num FROM input"), "outputs.x.from", "no output 'missing'"),
        (Shape("x", input=ERRORS, sql="SELECT kind FROM input"), "outputs.x.from", "no output '_errors'"),
        (Shape("_x", input="m", sql="SELECT num FROM input"), "outputs._x", "identifier"),
        (Shape("m", function=lambda b: b.select(["num"])), "outputs.m.function", "'_partition'"),
    ],
)
def test_definitions_are_checked_against_the_source_before_anything_runs(shape, field, message):
    with pytest.raises(ConfigError) as caught:
        route(shape)
    assert caught.value.field == field and message in caught.value.reason
    assert "\n" not in str(caught.value)


def test_row_by_row_queries_may_alias_input_and_select_everything():
    resolved, _ = route(Shape("m", sql="SELECT *, i.num * 2 AS twice FROM input i WHERE i.den IS NOT NULL"))
    assert resolved["m"].schema.names == ["num", "den", "twice"]


def test_only_append_outputs_are_shaped():
    keyed = {"k": Output("k", FRACTIONS, key=("num",), envelope="upsert")}
    with pytest.raises(ConfigError, match="only append outputs"):
        route(Shape("k", sql="SELECT num FROM input"), outputs=keyed)


def test_routes_keep_the_source_output_unless_it_is_shaped_in_place():
    resolved, routes = route(Shape("big", input="m", sql="SELECT num FROM input WHERE num > 9"))
    assert [r.output for r in routes["m"]] == ["m", "big"] and routes["m"][0].shape is None
    assert resolved["big"].schema == pa.schema([("num", pa.int64())]) and resolved["m"].schema == FRACTIONS
    resolved, routes = route(Shape("m", sql=RATIO), Shape("big", input="m", sql="SELECT num FROM input"))
    assert [r.output for r in routes["m"]] == ["m", "big"] and all(r.shape for r in routes["m"])
    assert resolved["m"].schema == pa.schema([("num", pa.int64()), ("ratio", pa.int64())])


# -- a batch through a transform -----------------------------------------------------------------


def test_rows_that_fail_go_to_the_error_port_and_the_others_land():
    outcome = apply_route(shaped(), batch([6, 7, -1, 8, 9, -2], [3, 0, 0, 2, 0, 1]))
    assert outcome.rows.column("ratio").to_pylist() == [2, 4]
    assert outcome.rows.column(OFFSET).to_pylist() == [0, 3]
    assert outcome.errors.column(OFFSET).to_pylist() == [1, 4]
    assert set(outcome.errors.column("kind").to_pylist()) == {TRANSFORM_ERROR}
    assert all("output 'm'" in m and "ivide by zero" in m for m in outcome.errors.column("message").to_pylist())
    assert [json.loads(r) for r in outcome.errors.column("raw").to_pylist()] == [
        {"num": 7, "den": 0},
        {"num": 9, "den": 0},
    ]
    assert outcome.filtered.column(OFFSET).to_pylist() == [2, 5]


def test_a_failed_cast_is_a_row_error_too():
    outcome = apply_route(shaped("SELECT CAST(CAST(num AS VARCHAR) || 'x' AS INT) AS n FROM input"), batch([1], [1]))
    assert outcome.rows.num_rows == 0 and outcome.errors.num_rows == 1 and "ast" in outcome.errors["message"][0].as_py()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-3, 20), st.integers(0, 3)), min_size=1, max_size=60),
    st.lists(st.integers(1, 7), min_size=1, max_size=10),
)
def test_the_outcome_does_not_depend_on_how_rows_are_grouped(rows, cuts):
    """Bisection isolates exactly the rows that fail alone: any grouping gives the same three sets."""
    r = shaped()
    whole = batch([n for n, _ in rows], [d for _, d in rows])
    pieces, start = [], 0
    for cut in cuts * len(rows):
        if start >= whole.num_rows:
            break
        pieces.append(apply_route(r, whole.slice(start, cut)))
        start += cut
    one = apply_route(r, whole)
    for part in ("rows", "errors", "filtered"):
        assert pa.concat_tables([getattr(p, part) for p in pieces]).equals(getattr(one, part)), part
    assert one.rows.num_rows + one.errors.num_rows + one.filtered.num_rows == whole.num_rows
    assert one.errors.column(OFFSET).to_pylist() == [i for i, (n, d) in enumerate(rows) if n >= 0 and d == 0]


def test_lineage_comes_from_the_record_whatever_the_sql_selects():
    r = shaped("SELECT num, den, _offset * 0 AS _offset, 5 AS _into_ts, 'x' AS _partition FROM input")
    out = apply_route(r, batch([1, 2], [1, 1], into=4_000)).rows
    assert out.schema.names == ["num", "den", PARTITION, OFFSET, INTO_TS]
    assert out.column(OFFSET).to_pylist() == [0, 1] and out.column(INTO_TS).to_pylist() == [4_000, 4_000]
    assert out.column(PARTITION).to_pylist() == ["p0", "p0"]


def test_a_source_batch_without_a_declared_column_fails_the_batch_instead_of_erroring_every_row():
    with pytest.raises(ContractError, match="lacks column 'den'"):
        apply_route(shaped(), batch([1, 2], [1, 1]).drop_columns(["den"]))


def test_a_python_transform_that_rewrites_lineage_is_refused():
    def shift(b: pa.RecordBatch) -> pa.RecordBatch:
        return b.set_column(b.schema.get_field_index(OFFSET), OFFSET, pc.add(b.column(OFFSET), 100))

    _, routes = route(Shape("m", function=shift))
    with pytest.raises(ContractError, match="matching a record"):
        apply_route(routes["m"][0], batch([1, 2], [1, 1]))


def test_a_python_transform_may_not_return_two_rows_for_one_record():
    _, routes = route(Shape("m", function=lambda b: pa.concat_tables([pa.table(b), pa.table(b)])))
    with pytest.raises(ContractError, match="at most one row per record"):
        apply_route(routes["m"][0], batch([1], [1]))


def test_a_python_transform_filters_computes_and_rejects_rows_like_sql():
    def ratio(b: pa.RecordBatch) -> pa.RecordBatch:
        if 0 in b.column("den").to_pylist():
            raise ZeroDivisionError("den is zero")
        kept = b.filter(pc.greater_equal(b.column("num"), 0))
        return kept.append_column("ratio", pc.divide(kept.column("num"), kept.column("den")))

    _, routes = route(Shape("m", function=ratio))
    outcome = apply_route(routes["m"][0], batch([6, 7, -1, 8], [3, 0, 1, 2]))
    assert outcome.rows.select(["num", "ratio", OFFSET]).to_pylist() == [
        {"num": 6, "ratio": 2, OFFSET: 0},
        {"num": 8, "ratio": 4, OFFSET: 3},
    ]
    assert outcome.errors.column("message").to_pylist() == ["output 'm': den is zero"]
    assert outcome.filtered.column(OFFSET).to_pylist() == [2]


# -- in a pipeline -------------------------------------------------------------------------------


def land(tmp_path, shapes, rows, *, crash: CrashAt | None = None):
    source = MemorySource({"m": FRACTIONS})
    for partition, part in rows.items():
        source.append(partition, "m", part)
    source.finish()
    clock = FakeClock()
    filtered = 0
    for hook in (crash, None):
        pipeline = Pipeline("p", tmp_path / "lake", source, now=clock, shapes=shapes, on_step=hook)
        try:
            while not pipeline.finished:
                filtered += sum(r.filtered for r in pipeline.step().results)
                clock.advance(10)
        except SimulatedCrash:
            continue
    lake = Lake.at(tmp_path / "lake")
    tables = {o: DeltaTable(str(lake.output_path("p", o))).to_pyarrow_table() for o in lake.outputs("p")}
    return tables, filtered


def test_one_record_routes_into_two_outputs_each_through_its_own_transform(tmp_path):
    shapes = [
        Shape("m", sql=RATIO),
        Shape("negatives", input="m", sql="SELECT num FROM input WHERE num < 0"),
    ]
    rows = {0: [{"num": n, "den": d} for n, d in [(4, 2), (-3, 1), (5, 0), (-8, 0)]]}
    tables, filtered = land(tmp_path, shapes, rows)
    assert sorted(tables) == ["_errors", "m", "negatives"]
    assert tables["m"].select(["num", "ratio", OFFSET]).to_pylist() == [{"num": 4, "ratio": 2, OFFSET: 0}]
    assert sorted(tables["negatives"].select(["num", OFFSET]).to_pylist(), key=lambda r: r[OFFSET]) == [
        {"num": -3, OFFSET: 1},
        {"num": -8, OFFSET: 3},
    ]
    assert tables["_errors"].select([OFFSET, "kind"]).to_pylist() == [{OFFSET: 2, "kind": TRANSFORM_ERROR}]
    assert filtered == 2 + 2  # m drops the two negatives, negatives the two others
    into = {r[OFFSET]: r[INTO_TS] for t in tables.values() for r in t.select([OFFSET, INTO_TS]).to_pylist()}
    for t in tables.values():  # the same record has the same into time in every output
        assert all(into[r[OFFSET]] == r[INTO_TS] for r in t.select([OFFSET, INTO_TS]).to_pylist())


@pytest.mark.parametrize("step", ["written", "committed:_errors", "committed:m", "committed:big"])
def test_a_crash_anywhere_replays_to_the_same_rows_and_errors_once(tmp_path, step):
    shapes = [Shape("m", sql=RATIO), Shape("big", input="m", sql="SELECT num * 10 AS n FROM input WHERE num > 2")]
    rows = {p: [{"num": (i * 7 + p) % 11 - 2, "den": i % 4} for i in range(40)] for p in (0, 1)}
    crashed, _ = land(tmp_path / "a", shapes, rows, crash=CrashAt(step))
    clean, _ = land(tmp_path / "b", shapes, rows)
    for name, table in clean.items():
        order = [(PARTITION, "ascending"), (OFFSET, "ascending")]
        assert crashed[name].sort_by(order).equals(table.sort_by(order)), name
    assert clean["_errors"].num_rows == sum(1 for p in rows.values() for r in p if r["num"] >= 0 and r["den"] == 0)


@pytest.mark.parametrize("step", ["committed:m", "committed:_errors"])
def test_a_batch_replayed_after_a_crash_between_commits_counts_everything_it_filtered(tmp_path, step):
    """The replay's status row is the batch's only one, so its ``filtered`` must count the rows
    of outputs the crashed attempt committed too: produced = output + filtered + errors."""
    shapes = [Shape("m", sql=RATIO), Shape("big", input="m", sql="SELECT num * 10 AS n FROM input WHERE num > 2")]
    rows = {p: [{"num": (i * 7 + p) % 11 - 2, "den": i % 4} for i in range(40)] for p in (0, 1)}
    _, replayed = land(tmp_path / "a", shapes, rows, crash=CrashAt(step))
    _, clean = land(tmp_path / "b", shapes, rows)
    records = [r for p in rows.values() for r in p]
    dropped = sum(r["num"] < 0 for r in records) + sum(r["num"] <= 2 for r in records)  # m's WHERE, big's WHERE
    assert replayed == clean == dropped


DAY = 86_400_000
MIDNIGHT = 1_795_046_400_000  # 2026-11-19 00:00 UTC


@pytest.mark.parametrize("crash", [None, "committed:big"])
def test_shaped_and_routed_outputs_partitioned_by_into_date_land_in_day_folders_once(tmp_path, crash):
    """``_into_date`` is derived from the stamp for a transform's rows as for rows landed as read:
    an output shaped in place and one routed from it, both partitioned by day, across midnight."""
    shapes = [Shape("m", sql="SELECT num, num * 2 AS twice FROM input"), Shape("big", input="m", sql=BIG)]
    layouts = {name: OutputLayout((INTO_DATE,)) for name in ("m", "big")}
    source = MemorySource({"m": FRACTIONS})
    clock, hook, times = FakeClock(), CrashAt(crash) if crash else None, {}
    for batch_ms, nums in ((MIDNIGHT - 1, range(0, 6)), (MIDNIGHT, range(6, 9)), (MIDNIGHT + DAY, range(9, 12))):
        source.append(0, "m", [{"num": n, "den": 1} for n in nums])
        times.update(dict.fromkeys(nums, batch_ms))
        clock.ms = batch_ms
        try:
            Pipeline("p", tmp_path, source, now=clock, shapes=shapes, layouts=layouts, on_step=hook).step()
        except SimulatedCrash:
            hook = None
            Pipeline("p", tmp_path, source, now=clock, shapes=shapes, layouts=layouts).step()
    day = {n: datetime.fromtimestamp(ms / 1000, UTC).date().isoformat() for n, ms in times.items()}
    lake = Lake.at(tmp_path)
    for output, kept in (("m", range(12)), ("big", range(3, 12))):
        state = replay(lake.output_path("p", output))
        assert state.partition_columns == [INTO_DATE]
        assert INTO_DATE in state.column_names
        for path, add in state.files.items():
            assert path.startswith(f"{INTO_DATE}={add['partitionValues'][INTO_DATE]}/"), path
        rows = state.rows()
        assert sorted(r[OFFSET] for r in rows) == list(kept)  # every record once, none twice
        assert all(r[INTO_DATE] == day[r["num"]] and r[INTO_TS] == times[r["num"]] for r in rows)
        assert {r[INTO_DATE] for r in rows} == {"2026-11-18", "2026-11-19", "2026-11-20"}


GENERATOR = """
[pipeline]
name = "orders"
lake = "lake"
engine = "local"

[source]
kind = "generator"
limit = 100
"""


@pytest.mark.parametrize(
    ("outputs", "says"),
    [
        ('[outputs.big]\nfrom = "bid"\nsql = "SELECT price FROM input"', "outputs.big.from: the source has no output"),
        ('[outputs.big]\nfrom = "bids"\nsql = "SELECT nope FROM input"', "outputs.big.sql: "),
        ('[outputs.big]\nfrom = "bids"\nsql = "SELECT now() AS t FROM input"', "outputs.big.sql: now() is not"),
        ("[outputs.big]\nfrom = 'bids'\nsql = 'SELECT \"now\"() AS t FROM input'", "outputs.big.sql: now() is not"),
        (
            "[outputs.big]\nfrom = 'bids'\nsql = 'SELECT random/**/() AS r FROM input'",
            "outputs.big.sql: random() is not",
        ),
    ],
)
def test_create_reports_a_bad_shaped_output_in_one_line_and_stores_nothing(tmp_path, capsys, outputs, says):
    path = tmp_path / "p.toml"
    path.write_text(GENERATOR + outputs)
    assert main(["create", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: {says}" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "lake" / "orders").exists()


def test_the_shaping_guide_keeps_its_runnable_examples_marked():
    from tests.unit.test_docs_examples import EXAMPLES

    assert {"shaping.md::toml", "shaping.md::python-api"} <= set(EXAMPLES)


# -- timestamps a transform yields ---------------------------------------------------------------

STAMPS = ["2024-03-01T10:00:00.123456789+02:00", "1969-12-31T23:59:59.999999999Z", "2000-01-01T00:00:00Z", None]


def _floor_to_micros(text: str | None) -> datetime | None:
    """The instant ``text`` names, floored to its microsecond, worked out without pyarrow."""
    if text is None:
        return None
    nanos = int(np.datetime64(text.replace("Z", "").split("+")[0], "ns").astype(np.int64))
    nanos -= (2 * 3600 * 10**9) if text.endswith("+02:00") else 0
    return datetime(1970, 1, 1) + timedelta(microseconds=nanos // 1000)


def test_timestamps_a_transform_yields_are_microseconds_so_polars_and_duckdb_read_the_table(tmp_path):
    source = MemorySource({"m": pa.schema([("s", pa.string())])})
    source.append(0, "m", [{"s": s} for s in STAMPS])
    source.finish()
    sql = (
        "SELECT CAST(s AS TIMESTAMP) AS naive, "
        "arrow_cast(s, 'Timestamp(Nanosecond, Some(\"Europe/Paris\"))') AS zoned, "
        "named_struct('at', to_timestamp(s)) AS nested, make_array(to_timestamp(s)) AS listed FROM input"
    )
    clock = FakeClock()
    pipeline = Pipeline("p", tmp_path / "lake", source, now=clock, shapes=[Shape("m", sql=sql)])
    while not pipeline.finished:
        pipeline.step()
        clock.advance(10)
    path = Lake.at(tmp_path / "lake").output_path("p", "m")
    log = replay(path)
    assert "timestampNanos" not in json.dumps(log.commits)  # no reader feature a reader may refuse
    expected = [_floor_to_micros(s) for s in STAMPS]
    utc = [None if e is None else e.replace(tzinfo=UTC) for e in expected]

    by_polars = pl.read_delta(str(path)).sort(OFFSET)
    assert by_polars.schema["naive"] == pl.Datetime("us") and by_polars.schema["zoned"] == pl.Datetime("us", "UTC")
    assert by_polars["naive"].to_list() == expected and by_polars["zoned"].to_list() == utc
    assert [n["at"] for n in by_polars["nested"].to_list()] == expected
    assert by_polars["listed"].to_list() == [[e] for e in expected]

    con = duckdb.connect()
    package = Path(duckdb_extension_delta.__file__).parent
    con.load_extension(str(next(package.glob("extensions/*/*.duckdb_extension"))))
    con.execute("SET TimeZone = 'UTC'")
    query = f"SELECT naive, zoned, nested.at AS at FROM delta_scan('{path}') ORDER BY _offset"
    by_duckdb = con.sql(query).fetchall()
    assert [row[0] for row in by_duckdb] == expected and [row[2] for row in by_duckdb] == expected
    assert [row[1] for row in by_duckdb] == utc


def test_a_python_transform_returning_nanoseconds_is_stored_in_microseconds_floored():
    def stamped(b: pa.RecordBatch) -> pa.RecordBatch:
        nanos = pa.array([-1_500, 2_999, None][: b.num_rows], pa.int64()).cast(pa.timestamp("ns", "Asia/Tokyo"))
        return pa.RecordBatch.from_arrays([b.column(PARTITION), b.column(OFFSET), nanos], [PARTITION, OFFSET, "at"])

    resolved, routes = route(Shape("m", function=stamped))
    assert resolved["m"].schema == pa.schema([("at", pa.timestamp("us", "UTC"))])
    outcome = apply_route(routes["m"][0], batch([1, 2, 3], [1, 1, 1]))
    assert outcome.rows.column("at").cast(pa.int64()).to_pylist() == [-2, 2, None]
