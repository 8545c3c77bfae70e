"""Tumbling windows closed by the frontier: definitions, emission, crash safety, the group bound.

Window tables are read with the independent Delta log reader of ``tests/faults`` and compared
with an oracle written here from the definition in ``docs/windows.md``: rows grouped by
``floor(_into_ts / size)`` and the group columns, in ``(_into_ts, _partition, _offset)`` order.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reclock.cli.main import main
from reclock.errors import ConfigError
from reclock.job.config import parse_config
from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Settings
from reclock.runtime.windowing import MaxGroupsExceeded
from reclock.runtime.windows import Window, check_windows, parse_windows
from reclock.sources.base import Output
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from tests.faults.reader import DeltaLog, label_of, read_rows

#: Crash-anywhere recomputations: CPU-bound with nothing to wait on, run beside the Spark tests,
#: whose session ends minutes before the pool's (scripts/test).
pytestmark = pytest.mark.beside_spark

SCHEMA = pa.schema([("g", pa.string()), ("v", pa.int64()), ("x", pa.float64())])
AGGREGATES = {
    "n": "count(*)",
    "nv": "count(v)",
    "total": "sum(v)",
    "lo": "min(v)",
    "hi": "max(g)",
    "mean": "avg(v)",
    "fsum": "sum(x)",
    "first_v": "first(v)",
    "last_g": "last(g)",
}


def window(size: int = 1000, **kwargs) -> Window:
    return Window("w", "bids", size, kwargs.pop("aggregates", AGGREGATES), kwargs.pop("group_by", ("g",)), **kwargs)


def output_rows(lake: Path) -> list[dict]:
    return (read_rows(DeltaLog(lake / "pipe" / "outputs" / "bids").refresh()) or pa.table({})).to_pylist()


def window_table(lake: Path, name: str = "w") -> tuple[list[dict], int | None, int]:
    """The window table's rows, its label and its number of commits, from the log alone."""
    log = DeltaLog(lake / "pipe" / "windows" / name).refresh()
    rows = (read_rows(log) or pa.table({})).to_pylist()
    commits = len(list((lake / "pipe" / "windows" / name / "_delta_log").glob("*.json")))
    return rows, label_of(log, f"reclock/pipe/windows/{name}"), commits


def oracle(rows: list[dict], w: Window, upper: int) -> list[dict]:
    """Every window ending at or below ``upper``, as the definition says, one row per group."""
    groups: dict[tuple, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["_into_ts"], r["_partition"], r["_offset"])):
        start = r["_into_ts"] // w.size_ms * w.size_ms
        if start + w.size_ms <= upper:
            groups.setdefault((start, *(r[c] for c in w.group_by)), []).append(r)
    out = []
    for (start, *key), members in groups.items():
        row = {"_window_start": start, "_window_end": start + w.size_ms, **dict(zip(w.group_by, key, strict=True))}
        for agg in w.parsed:
            values = [m[agg.column] for m in members] if agg.column else [1] * len(members)
            row[agg.name] = _aggregate(agg.function, values)
        row["_into_ts"] = start + w.size_ms - 1
        out.append(row)
    return sorted(out, key=_order)


def _aggregate(function: str, values: list) -> object:
    present = [v for v in values if v is not None]
    if function == "count":
        return len(present)
    if function in ("first", "last"):
        return values[0] if function == "first" else values[-1]
    if not present:
        return None
    return {"sum": sum, "min": min, "max": max, "avg": lambda p: sum(p) / len(p)}[function](present)


def _order(row: dict) -> tuple:
    return (row["_window_start"], *((v is None, v or "") for k, v in row.items() if k == "g"))


def same(got: list[dict], want: list[dict]) -> bool:
    """Equal rows; float sums may differ in the last bits with the order of addition."""
    got, want = sorted(got, key=_order), sorted(want, key=_order)
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a.keys() != b.keys():
            return False
        for k in a:
            if isinstance(b[k], float) and a[k] is not None:
                if not math.isclose(a[k], b[k], rel_tol=1e-12, abs_tol=1e-9):
                    return False
            elif a[k] != b[k]:
                return False
    return True


def start(lake, source, clock, windows=None, **kwargs) -> Pipeline:
    settings = kwargs.pop("settings", Settings(idle_interval=0.5))
    windows = [window()] if windows is None else windows
    return Pipeline("pipe", lake, source, now=clock, settings=settings, windows=windows, **kwargs)


# -- definitions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        (
            {"name": "w", "output": "bids", "size_ms": 10, "aggregates": {"n": "count(*)"}, "every": 1},
            "w.every",
            "unknown",
        ),
        ({"name": "w", "output": "bids", "aggregates": {"n": "count(*)"}}, "windows.w.size_ms", "missing"),
        ({"name": "w", "output": "bids", "size_ms": 0, "aggregates": {"n": "count(*)"}}, "w.size_ms", ">= 1"),
        ({"name": "w", "output": "bids", "size_ms": 9, "aggregates": {"n": "median(v)"}}, "w.aggregates.n", "unknown"),
        ({"name": "w", "output": "bids", "size_ms": 9, "aggregates": {"n": "sum(*)"}}, "w.aggregates.n", "count(*)"),
        ({"name": "w", "output": "bids", "size_ms": 9, "aggregates": {"n": "v"}}, "w.aggregates.n", "function(column)"),
        ({"name": "w", "output": "bids", "size_ms": 9, "aggregates": {}}, "w.aggregates", "at least one"),
        ({"name": "1w", "output": "bids", "size_ms": 9, "aggregates": {"n": "count(*)"}}, "windows.name", "identifier"),
    ],
)
def test_a_bad_window_definition_is_one_line_naming_its_field(raw, field, says):
    with pytest.raises(ConfigError) as caught:
        parse_windows([raw], file="p.toml")
    assert caught.value.field.endswith(field) and says in caught.value.reason
    assert str(caught.value).startswith("p.toml: ") and "\n" not in str(caught.value)


def test_two_windows_with_one_name_are_refused():
    raw = {"name": "w", "output": "bids", "size_ms": 9, "aggregates": {"n": "count(*)"}}
    with pytest.raises(ConfigError, match="defined twice"):
        parse_windows([raw, raw])


@pytest.mark.parametrize(
    ("w", "says"),
    [
        (Window("w", "nope", 10, {"n": "count(*)"}), "no output 'nope'"),
        (Window("w", "keyed", 10, {"n": "count(*)"}), "append outputs only"),
        (Window("w", "bids", 10, {"n": "count(*)"}, ("missing",)), "no column 'missing'"),
        (Window("w", "bids", 10, {"s": "sum(g)"}), "cannot aggregate column 'g'"),
    ],
)
def test_a_window_must_read_an_append_output_with_its_columns(w, says):
    outputs = [Output("bids", SCHEMA), Output("keyed", SCHEMA, key=("g",), envelope="upsert")]
    with pytest.raises(ConfigError, match=says):
        check_windows([w], outputs)


def shaped_pipeline(tmp_path: Path, outputs: str, window: str) -> Path:
    path = tmp_path / "p.toml"
    lake = tmp_path / "lake"
    head = (
        f'[pipeline]\nname = "orders"\nlake = "{lake}"\nengine = "local"\n[source]\nkind = "generator"\nlimit = 3000\n'
    )
    path.write_text(f'{head}{outputs}\n[[windows]]\nname = "w"\nsize_ms = 60000\n{window}')
    return path


def test_a_window_over_a_routed_output_is_created_and_emitted_from_its_shaped_rows(tmp_path):
    routed = '[outputs.big]\nfrom = "bids"\nsql = "SELECT auction, price * 2 AS doubled FROM input WHERE price > 1000"'
    window = 'output = "big"\ngroup_by = ["auction"]\n[windows.aggregates]\nn = "count(*)"\ntotal = "sum(doubled)"'
    assert main(["create", str(shaped_pipeline(tmp_path, routed, window))]) == 0
    assert main(["--lake", str(tmp_path / "lake"), "start", "orders"]) == 0
    big = read_rows(DeltaLog(tmp_path / "lake" / "orders" / "outputs" / "big").refresh()).to_pylist()
    assert big and all(set(r) >= {"auction", "doubled"} and "price" not in r for r in big)
    want: dict[tuple, list] = {}
    for r in big:
        want.setdefault((r["_into_ts"] // 60_000 * 60_000, r["auction"]), []).append(r["doubled"])
    got = read_rows(DeltaLog(tmp_path / "lake" / "orders" / "windows" / "w").refresh()).to_pylist()
    assert {(r["_window_start"], r["auction"]): (r["n"], r["total"]) for r in got} == {
        key: (len(values), sum(values)) for key, values in want.items()
    }


def test_a_window_over_a_column_its_outputs_sql_dropped_is_refused_at_create_in_one_line(tmp_path, capsys):
    in_place = '[outputs.bids]\nsql = "SELECT auction, bidder FROM input"'
    window = 'output = "bids"\n[windows.aggregates]\ntotal = "sum(price)"'
    path = shaped_pipeline(tmp_path, in_place, window)
    assert main(["create", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: windows.w: output 'bids' has no column 'price'" in err[0], err
    assert not (tmp_path / "lake" / "orders").exists()


def test_windows_in_toml_round_trip_through_the_stored_definition():
    raw = {
        "pipeline": {"name": "p", "lake": "lake"},
        "source": {"kind": "generator", "rate": 10},
        "windows": [
            {"name": "w", "output": "bids", "size_ms": 5000, "group_by": ["auction"], "aggregates": AGGREGATES}
        ],
    }
    config = parse_config(raw)
    assert config.windows == (Window("w", "bids", 5000, AGGREGATES, ("auction",)),)
    assert parse_config(config.to_dict()) == config
    without = parse_config({k: v for k, v in raw.items() if k != "windows"})
    assert "windows" not in without.to_dict()  # definitions stored before windows existed stay equal


# -- emission ----------------------------------------------------------------------------------


def test_the_window_closes_at_the_step_whose_commit_reaches_its_end_and_not_before(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    pipeline = start(tmp_path, source, clock)
    for ms, v in ((1000, 1), (1400, 2), (1998, 3)):
        clock.ms = ms
        source.append(0, "bids", [{"g": "a", "v": v, "x": 1.0}])
        pipeline.step()
        rows, label, _ = window_table(tmp_path)
        assert rows == [] and label == 999, f"emitted at {ms}, before the output reached 2000"
    clock.ms = 1999  # a binding at 1999: the output's upper becomes 2000, the window's end
    source.append(0, "bids", [{"g": "b", "v": 4, "x": 1.0}])
    pipeline.step()
    rows, label, _ = window_table(tmp_path)
    assert label == 1999
    assert same(rows, oracle(output_rows(tmp_path), window(), 2000))
    assert {r["g"]: r["n"] for r in rows} == {"a": 3, "b": 1}


def test_an_idle_source_still_closes_its_last_window_as_time_only_bindings_pass_its_end(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    pipeline = start(tmp_path, source, clock, settings=Settings(idle_interval=10))
    source.append(0, "bids", [{"g": "a", "v": 1, "x": 1.0}, {"g": "a", "v": 2, "x": 1.0}])
    pipeline.step()
    for ms in range(2000, 11_000, 1000):  # nothing new, and younger than idle_interval: no binding
        clock.ms = ms
        assert pipeline.step().idle
    assert window_table(tmp_path)[:2] == ([], 999)  # [1000, 2000) waits while the output stays at 1001
    clock.ms = 11_000  # idle_interval since the last binding: a time-only one, which closes [1000, 2000)
    assert pipeline.step().binding_ts == 11_000
    rows, label, _ = window_table(tmp_path)
    assert label == 10_999  # every window up to 11000 is closed; only [1000, 2000) had rows
    assert [(r["_window_start"], r["g"], r["n"], r["total"]) for r in rows] == [(1000, "a", 2, 3)]
    assert not pipeline.finished


def test_aggregates_follow_the_definition_with_nulls_ties_and_several_files(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    pipeline = start(tmp_path, source, clock)
    rows_at = {
        1000: [(1, {"g": "a", "v": 5, "x": 0.1}), (0, {"g": "a", "v": None, "x": None}), (0, {"g": None, "v": 2})],
        1300: [(0, {"g": "a", "v": 3, "x": 0.2}), (1, {"g": None, "v": None, "x": 3.0})],
        2100: [(0, {"g": "b", "v": 9, "x": 1.0})],
        3000: [],
    }
    for ms, rows in rows_at.items():
        clock.ms = ms
        for partition, row in rows:
            source.append(partition, "bids", [{"x": None, **row}])
        pipeline.step()
    got, label, _ = window_table(tmp_path)
    assert label == 2999
    assert same(got, oracle(output_rows(tmp_path), window(), 3000))
    a = next(r for r in got if r["g"] == "a" and r["_window_start"] == 1000)
    # Into time 1000 holds partition 0's rows before partition 1's ("0" < "1"): the null v is first.
    assert (a["n"], a["nv"], a["total"], a["lo"], a["mean"], a["first_v"]) == (3, 2, 8, 3, 4.0, None)


def test_a_window_without_groups_has_one_row_and_empty_windows_none(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    w = window(size=500, group_by=(), aggregates={"n": "count(*)", "last_v": "last(v)"})
    pipeline = start(tmp_path, source, clock, windows=[w])
    source.append(0, "bids", [{"g": "a", "v": 1}, {"g": "b", "v": 2}])
    pipeline.step()
    clock.ms = 3000
    pipeline.step()
    rows, label, _ = window_table(tmp_path)
    assert label == 2999
    assert rows == [{"_window_start": 1000, "_window_end": 1500, "n": 2, "last_v": 2, "_into_ts": 1499}]


def test_a_finished_pipeline_closes_the_window_of_its_last_binding(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    pipeline = start(tmp_path, source, clock, windows=[window(size=10_000)])
    source.append(0, "bids", [{"g": "a", "v": 1}])
    pipeline.step()
    source.finish()
    clock.ms = 1500
    pipeline.run()
    assert pipeline.finished and pipeline.windows_current
    rows, label, _ = window_table(tmp_path)
    assert label == 9_999  # the source is closed: nothing can reach [0, 10000) any more
    assert [(r["_window_start"], r["n"]) for r in rows] == [(0, 1)]


# -- crash safety ----------------------------------------------------------------------------

ROWS = st.fixed_dictionaries(
    {"g": st.sampled_from(["a", "b", None]), "v": st.none() | st.integers(-5, 5), "x": st.floats(-1e3, 1e3)}
)
SCRIPT = st.lists(st.lists(st.tuples(st.sampled_from([0, 1]), ROWS), max_size=4), min_size=1, max_size=6)
STEPS = ["minted", "written", "committed:bids", "resumed", "windowed:w"]


def run_windows(lake: Path, script, w: Window, crash: CrashAt | None = None) -> int:
    """One tick of 400 ms per script entry, then the source finishes; restart on every crash."""
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    crashes = 0

    def begin() -> Pipeline:
        return start(lake, source, clock, windows=[w], on_step=crash, settings=Settings(idle_interval=0.3))

    pipeline = begin()
    for tick in range(len(script) + 30):
        if pipeline.finished and pipeline.windows_current:
            break
        if tick < len(script):
            for partition, row in script[tick]:
                source.append(partition, "bids", [row])
        elif tick == len(script):
            source.finish()
        clock.ms = 1000 + 400 * tick
        try:
            pipeline.step()
        except SimulatedCrash:  # restart and catch up what the crashed tick left pending, as a job does
            crashes += 1
            pipeline = begin()
            while pipeline.pending:
                try:
                    pipeline.step()
                except SimulatedCrash:
                    crashes += 1
                    pipeline = begin()
    assert pipeline.finished and pipeline.windows_current
    return crashes


@settings(max_examples=25, deadline=None)
@given(
    script=SCRIPT,
    size=st.sampled_from([300, 1000, 2500]),
    step=st.sampled_from(STEPS),
    nth=st.integers(1, 3),
    max_groups=st.sampled_from([3, 1000]),
)
def test_crash_anywhere_then_restart_emits_every_window_once_as_a_batch_recomputation(
    tmp_path_factory, script, size, step, nth, max_groups
):
    w = window(size=size, max_groups=max_groups)
    clean, crashed = tmp_path_factory.mktemp("clean"), tmp_path_factory.mktemp("crashed")
    run_windows(clean, script, w)
    assume(run_windows(crashed, script, w, crash=CrashAt(step, nth)) > 0)
    want, want_label, _ = window_table(clean)
    got, label, _ = window_table(crashed)
    assert label == want_label
    assert same(got, want)
    keys = [(r["_window_start"], r["g"]) for r in got]
    assert len(keys) == len(set(keys)), "a window emitted twice"
    assert same(got, oracle(output_rows(crashed), w, label + 1))


def test_a_long_catch_up_commits_in_chunks_of_at_most_max_groups_rows(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    plain = start(tmp_path, source, clock, windows=[])
    for ms in range(1000, 6000, 100):  # 50 bindings over 10 windows, before any window is defined
        clock.ms = ms
        source.append(0, "bids", [{"g": "a", "v": ms}, {"g": "b", "v": 1}])
        plain.step()
    clock.ms = 7000
    assert plain.step().binding_ts == 7000  # time-only: the output now holds everything below 7001
    w = window(size=500, max_groups=3)
    pipeline = start(tmp_path, source, clock, windows=[w])
    assert pipeline.close_windows() == 10
    rows, label, commits = window_table(tmp_path)
    assert label == 6999 and len(rows) == 20
    assert commits >= 1 + 20 // 3 and same(rows, oracle(output_rows(tmp_path), w, 6000))


# -- the group bound ---------------------------------------------------------------------------


def test_more_groups_than_max_groups_fails_the_pipeline_and_a_higher_bound_then_emits_it_whole(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    source.append(0, "bids", [{"g": str(i), "v": i} for i in range(5)])
    source.finish()
    tight = start(tmp_path, source, clock, windows=[window(max_groups=4)])
    with pytest.raises(MaxGroupsExceeded, match=r"window 'w' \[1000, 2000\) has more than max_groups=4"):
        tight.run()
    assert tight.health is Health.FAILED and "raise max_groups" in tight.last_error
    assert window_table(tmp_path)[:2] == ([], 999)  # nothing of [1000, 2000) was emitted
    roomy = start(tmp_path, source, clock, windows=[window(max_groups=5)])
    roomy.run()
    rows, _, _ = window_table(tmp_path)
    assert sorted(r["g"] for r in rows) == ["0", "1", "2", "3", "4"]


def test_a_changed_window_definition_cannot_continue_its_table(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    start(tmp_path, source, clock).step()
    with pytest.raises(ConfigError, match="another definition"):
        start(tmp_path, source, clock, windows=[window(size=2000)])


def test_the_jobs_maintenance_compacts_window_tables_without_changing_a_row(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    pipeline = start(tmp_path, source, clock, windows=[window(size=200)])
    for ms in range(1000, 3000, 250):
        clock.ms = ms
        source.append(0, "bids", [{"g": "a", "v": ms}])
        pipeline.step()
    before, label, _ = window_table(tmp_path)
    assert len(before) > 3
    report = pipeline.maintain()
    assert report.optimized["windows/w"] > 0
    after, label_after, _ = window_table(tmp_path)
    assert label_after == label and same(after, before)
    assert len(DeltaLog(tmp_path / "pipe" / "windows" / "w").refresh().uris()) == 1


def test_a_window_reads_only_the_row_groups_of_its_into_times_from_a_merged_file(tmp_path):
    """After optimize merges many batches into one file, a window reads only its part of it."""
    import pyarrow.parquet as pq

    from reclock.persist.windows import _row_groups

    path = tmp_path / "merged.parquet"
    nested = pa.array([{"a": i, "b": [i]} for i in range(10_000)])  # leaves before _into_ts's
    pq.write_table(pa.table({"n": nested, "_into_ts": pa.array(range(10_000), pa.int64())}), path, row_group_size=1000)
    assert _row_groups(pq.ParquetFile(path), 2500, 3500) == [2, 3]
    assert _row_groups(pq.ParquetFile(path), 3000, 3001) == [3]
    assert _row_groups(pq.ParquetFile(path), 10_000, 20_000) == []
