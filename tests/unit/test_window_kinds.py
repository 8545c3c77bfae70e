"""Hop and cumulate windows, ``having``, and tilt frames (``from``): definitions and emission.

Window tables are read with the independent Delta log reader of ``tests/faults`` and compared
with a brute-force oracle written here from ``docs/windows.md``: every span of the kind is listed
from its formula, and each span's rows are filtered from the output by ``start <= _into_ts < end``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reclock.errors import ConfigError
from reclock.job.config import parse_config
from reclock.runtime.windows import MAX_LENGTH_MS, Window, check_windows, parse_windows
from reclock.sources.base import Output
from reclock.testing import CrashAt, FakeClock, MemorySource
from tests.unit.test_windows import AGGREGATES, SCHEMA, SCRIPT, STEPS, _aggregate, output_rows, run_windows, start
from tests.unit.test_windows import window_table as read_window

#: Crash-anywhere recomputations: CPU-bound with nothing to wait on, run beside the Spark tests,
#: whose session ends minutes before the pool's (scripts/test).
pytestmark = pytest.mark.beside_spark

OUTPUTS = [Output("bids", SCHEMA)]


def spans(w: Window, upper: int) -> list[tuple[int, int]]:
    """Every span of ``w`` with an end in ``(0, upper]``, straight from the kind's formula."""
    if w.kind == "tumbling":
        return [(k * w.size_ms, (k + 1) * w.size_ms) for k in range(upper // w.size_ms + 1)]
    if w.kind == "hop":
        starts = range(-w.size_ms // w.slide_ms - 1, upper // w.slide_ms + 1)
        return [(k * w.slide_ms, k * w.slide_ms + w.size_ms) for k in starts]
    base = range(0, upper + w.max_size_ms, w.max_size_ms)
    return [(b, b + j * w.step_ms) for b in base for j in range(1, w.max_size_ms // w.step_ms + 1)]


def oracle(rows: list[dict], w: Window, upper: int, keep=lambda row: True) -> list[dict]:
    """Each span ending at or below ``upper``: its rows grouped and aggregated; no rows, no row."""
    ordered = sorted(rows, key=lambda r: (r["_into_ts"], r["_partition"], r["_offset"]))
    out = []
    if w.kind == "session":
        return [row for row in sessions(ordered, w, upper) if keep(row)]
    for lo, end in spans(w, upper):
        if not 0 < end <= upper:
            continue
        groups: dict[tuple, list[dict]] = {}
        for r in ordered:
            if lo <= r["_into_ts"] < end:
                groups.setdefault(tuple(r[c] for c in w.group_by), []).append(r)
        for key, members in groups.items():
            row = {"_window_start": lo, "_window_end": end, **dict(zip(w.group_by, key, strict=True))}
            for agg in w.parsed:
                values = [m[agg.column] for m in members] if agg.column else [1] * len(members)
                row[agg.name] = _aggregate(agg.function, values)
            row["_into_ts"] = end - 1
            if keep(row):
                out.append(row)
    return out


def sessions(ordered: list[dict], w: Window, upper: int) -> list[dict]:
    """Per group, runs of rows each less than ``gap`` after the one before; those ended by ``upper``."""
    runs: dict[tuple, list[list[dict]]] = {}
    for r in ordered:
        group = runs.setdefault(tuple(r[c] for c in w.group_by), [])
        if group and r["_into_ts"] - group[-1][-1]["_into_ts"] < w.gap_ms:
            group[-1].append(r)
        else:
            group.append([r])
    out = []
    for key, members_of in runs.items():
        for members in members_of:
            end = members[-1]["_into_ts"] + w.gap_ms
            if end > upper:
                continue
            row = {
                "_window_start": members[0]["_into_ts"],
                "_window_end": end,
                **dict(zip(w.group_by, key, strict=True)),
            }
            for agg in w.parsed:
                values = [m[agg.column] for m in members] if agg.column else [1] * len(members)
                row[agg.name] = _aggregate(agg.function, values)
            row["_into_ts"] = end - 1
            out.append(row)
    return out


def same(got: list[dict], want: list[dict]) -> None:
    """Equal rows, one per (span, group); float sums may differ in their last bits."""

    def by_key(rows: list[dict]) -> dict[tuple, dict]:
        keyed = {
            (r["_window_start"], r["_window_end"], r.get("g"), r.get("_last_partition"), r.get("_last_offset")): r
            for r in rows
        }
        assert len(keyed) == len(rows), "a window and group emitted twice"
        return keyed

    got_by, want_by = by_key(got), by_key(want)
    assert got_by.keys() == want_by.keys(), sorted(got_by.keys() ^ want_by.keys(), key=str)[:5]
    for k, row in want_by.items():
        assert got_by[k].keys() == row.keys()
        for name, value in row.items():
            mine = got_by[k][name]
            if isinstance(value, float) and mine is not None:
                assert math.isclose(mine, value, rel_tol=1e-12, abs_tol=1e-9), (k, name, mine, value)
            else:
                assert mine == value, (k, name, mine, value)


HOP = Window("w", "bids", 1000, AGGREGATES, ("g",), kind="hop", slide_ms=400)
SESSION = Window("w", "bids", None, AGGREGATES, ("g",), kind="session", gap_ms=500)
CUMULATE = Window("w", "bids", None, AGGREGATES, ("g",), kind="cumulate", step_ms=300, max_size_ms=1200)


# -- definitions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        ({"kind": "hop", "size_ms": 10}, "w.slide_ms", "missing"),
        ({"kind": "hop", "size_ms": 10, "slide_ms": 20}, "w.slide_ms", "at most size_ms=10"),
        ({"kind": "cumulate", "step_ms": 3, "max_size_ms": 10}, "w.max_size_ms", "multiple of step_ms=3"),
        ({"kind": "cumulate", "size_ms": 9, "step_ms": 3, "max_size_ms": 9}, "w.size_ms", "not a setting"),
        ({"kind": "sliding", "size_ms": 9}, "w.kind", "unknown kind 'sliding'"),
        ({"size_ms": 9, "having": " "}, "w.having", "SQL predicate"),
    ],
)
def test_a_bad_window_kind_is_one_line_naming_its_field(raw, field, says):
    with pytest.raises(ConfigError) as caught:
        parse_windows([{"name": "w", "output": "bids", "aggregates": {"n": "count(*)"}, **raw}], file="p.toml")
    assert caught.value.field.endswith(field) and says in caught.value.reason, caught.value
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("having", "says"),
    [
        ("n > 1 AND random() < 0.5", "calls random"),
        ("now() > to_timestamp(0)", "calls now"),
        ("nope > 1", "does not plan"),
        ("n > (SELECT max(n) FROM input)", "each row alone"),
    ],
)
def test_a_having_a_replay_could_not_repeat_is_refused_on_its_plan(having, says):
    w = Window("w", "bids", 1000, {"n": "count(*)"}, ("g",), having=having)
    with pytest.raises(ConfigError, match=says) as caught:
        check_windows([w], OUTPUTS)
    assert caught.value.field == "windows.w.having"


@pytest.mark.parametrize(
    ("second", "says"),
    [
        (Window("c", None, 3000, {"n": "sum(n)"}, ("g",), from_window="nope"), "no window 'nope'"),
        (Window("c", None, 2500, {"n": "sum(n)"}, ("g",), from_window="f"), "multiples of 'f'"),
        (Window("c", None, 3000, {"v": "last(n)"}, (), from_window="f"), "need its group_by"),
        (Window("c", None, 3000, {"n": "sum(g)"}, ("g",), from_window="f"), "cannot aggregate"),
    ],
)
def test_a_tilt_frame_must_read_an_earlier_tumbling_window_that_tiles_it(second, says):
    fine = Window("f", "bids", 1000, {"n": "count(*)"}, ("g",))
    with pytest.raises(ConfigError, match=says):
        check_windows([fine, second], OUTPUTS)
    with pytest.raises(ConfigError, match="give either the output"):
        Window("c", "bids", 3000, {"n": "sum(n)"}, from_window="f")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"kind": "session", "gap_ms": 2**63 - 1}, "w.gap_ms"),
        ({"size_ms": 2**63 - 1}, "w.size_ms"),
        ({"kind": "hop", "size_ms": 2**62, "slide_ms": 1000}, "w.size_ms"),
        ({"kind": "cumulate", "step_ms": 1000, "max_size_ms": MAX_LENGTH_MS + 1000}, "w.max_size_ms"),
    ],
)
def test_a_window_length_past_what_a_64_bit_into_time_holds_is_refused_at_create(raw, field):
    with pytest.raises(ConfigError) as caught:
        parse_windows([{"name": "w", "output": "bids", "aggregates": {"n": "count(*)"}, **raw}], file="p.toml")
    assert caught.value.field.endswith(field) and "at most 31557600000000" in caught.value.reason, caught.value
    longest = parse_windows(
        [{"name": "w", "output": "bids", "aggregates": {"n": "count(*)"}, "size_ms": MAX_LENGTH_MS}]
    )
    assert longest[0].size_ms == MAX_LENGTH_MS


def test_a_tilt_frame_refuses_an_avg_of_the_finer_windows_avg():
    fine = Window("f", "bids", 1000, {"n": "count(*)", "mean": "avg(v)", "total": "sum(v)"}, ())
    with pytest.raises(ConfigError, match="mean of means") as caught:
        check_windows([fine, Window("c", None, 3000, {"mean": "avg(mean)"}, (), from_window="f")], OUTPUTS)
    assert caught.value.field == "windows.c.aggregates.mean"
    check_windows(
        [fine, Window("c", None, 3000, {"mean": "avg(total)", "hi": "max(mean)"}, (), from_window="f")], OUTPUTS
    )


def test_every_kind_round_trips_through_toml_and_a_tumbling_window_stores_what_it_always_did():
    windows = [
        {"name": "t", "output": "bids", "size_ms": 1000, "aggregates": {"n": "count(*)"}},
        {"name": "h", "kind": "hop", "output": "bids", "size_ms": 1000, "slide_ms": 250, "aggregates": AGGREGATES},
        {"name": "c", "kind": "cumulate", "output": "bids", "step_ms": 10, "max_size_ms": 60, "aggregates": AGGREGATES},
        {"name": "r", "from": "t", "size_ms": 5000, "aggregates": {"n": "sum(n)"}, "having": "n > 2"},
    ]
    config = parse_config(
        {"pipeline": {"name": "p", "lake": "lake"}, "source": {"kind": "generator"}, "windows": windows}
    )
    assert parse_config(config.to_dict()) == config
    assert config.windows[0].to_dict() == {
        "name": "t",
        "output": "bids",
        "size_ms": 1000,
        "group_by": [],
        "aggregates": {"n": "count(*)"},
        "max_groups": 100_000,
    }
    assert config.windows[3].input == "windows/t" and config.windows[3].having == "n > 2"


# -- emission ----------------------------------------------------------------------------------


def steps(lake: Path, windows: list[Window], ticks: dict[int, list[tuple[int, dict]]], clock: FakeClock | None = None):
    source = MemorySource({"bids": SCHEMA})
    clock = clock or FakeClock(1000)
    pipeline = start(lake, source, clock, windows=windows)
    for ms, rows in ticks.items():
        clock.ms = ms
        for partition, row in rows:
            source.append(partition, "bids", [{"x": 1.0, **row}])
        pipeline.step()
    return pipeline


def test_a_hop_window_is_emitted_when_the_output_passes_its_end_each_row_in_every_window_holding_it(tmp_path):
    ticks = {1000: [(0, {"g": "a", "v": 1})], 1300: [(1, {"g": "a", "v": 2})], 1999: [(0, {"g": "b", "v": 3})]}
    steps(tmp_path, [HOP], ticks)
    rows, label, _ = read_window(tmp_path)
    # The output's upper is 2000; hop ends are 400 * k + 1000, so [800, 1800) is the last closed.
    assert label == 1799
    assert [(r["_window_start"], r["_window_end"], r["g"], r["n"]) for r in rows] == [
        (400, 1400, "a", 2),
        (800, 1800, "a", 2),
    ]
    same(rows, oracle(output_rows(tmp_path), HOP, label + 1))


def test_a_cumulate_window_emits_each_prefix_as_the_output_passes_its_step(tmp_path):
    ticks = {1000: [(0, {"g": "a", "v": 1})], 1250: [(0, {"g": "a", "v": 2})], 1700: [(0, {"g": "a", "v": 4})]}
    steps(tmp_path, [CUMULATE], {**ticks, 2500: []})
    rows, label, _ = read_window(tmp_path)
    assert label == 2399  # cumulate ends are multiples of step_ms=300
    got = [(r["_window_start"], r["_window_end"], r["n"], r["total"]) for r in rows]
    # [1200, 2400) grows by 300: 1250 is in every prefix, 1700 from [1200, 1800) on.
    assert sorted(got) == [
        (0, 1200, 1, 1),
        (1200, 1500, 1, 2),
        (1200, 1800, 2, 6),
        (1200, 2100, 2, 6),
        (1200, 2400, 2, 6),
    ]
    same(rows, oracle(output_rows(tmp_path), CUMULATE, label + 1))


def test_having_keeps_the_rows_its_predicate_holds_for_and_still_moves_the_label(tmp_path):
    w = Window("w", "bids", 500, {"n": "count(*)", "total": "sum(v)"}, ("g",), having="n >= 2 AND total > 2")
    ticks = {
        1000: [(0, {"g": "a", "v": 1}), (0, {"g": "a", "v": 5}), (1, {"g": "b", "v": 9})],
        1600: [(0, {"g": "a", "v": 1}), (0, {"g": "a", "v": 1})],
        2600: [],
    }
    steps(tmp_path, [w], ticks)
    rows, label, _ = read_window(tmp_path)
    assert label == 2499
    assert [(r["_window_start"], r["g"], r["n"], r["total"]) for r in rows] == [(1000, "a", 2, 6)]
    same(rows, oracle(output_rows(tmp_path), w, 2500, keep=lambda r: r["n"] >= 2 and r["total"] > 2))


def test_a_tilt_chain_of_three_resolutions_equals_each_computed_from_the_raw_output(tmp_path):
    aggs = {
        "n": "count(*)",
        "total": "sum(v)",
        "lo": "min(v)",
        "hi": "max(v)",
        "first_v": "first(v)",
        "last_v": "last(v)",
    }
    roll = {"n": "sum(n)", "total": "sum(total)", "lo": "min(lo)", "hi": "max(hi)", "first_v": "first(first_v)"}
    roll["last_v"] = "last(last_v)"
    fine = Window("s10", "bids", 100, aggs, ("g",))
    minute = Window("m1", None, 600, roll, ("g",), from_window="s10")
    hour = Window("h1", None, 3600, roll, ("g",), from_window="m1")
    ticks = {ms: [(ms % 3 % 2, {"g": "ab"[ms % 7 % 2], "v": ms % 11 - 5})] for ms in range(1000, 12_000, 37)}
    steps(tmp_path, [fine, minute, hour], ticks)
    raw = output_rows(tmp_path)
    for w, direct in (
        (fine, fine),
        (minute, Window("m1", "bids", 600, aggs, ("g",))),
        (hour, Window("h1", "bids", 3600, aggs, ("g",))),
    ):
        rows, label, _ = read_window(tmp_path, w.name)
        assert label + 1 == 11_971 // direct.size_ms * direct.size_ms, w.name
        same(rows, oracle(raw, direct, label + 1))
    assert len(read_window(tmp_path, "h1")[0]) == 6  # [0, 3600), [3600, 7200), [7200, 10800): both groups


def test_a_session_closes_when_the_output_passes_its_last_row_plus_gap_and_is_read_back_whole(tmp_path):
    # Group a: rows every 400 ms from 1000 to 4200, one session [1000, 4700); b: two sessions.
    ticks = {ms: [(0, {"g": "a", "v": ms})] for ms in range(1000, 4300, 400)}
    ticks[1100] = [(1, {"g": "b", "v": 1})]
    ticks[3000] = [*ticks.get(3000, []), (1, {"g": "b", "v": 2})]
    clock = FakeClock(1000)
    pipeline = steps(tmp_path, [SESSION], dict(sorted(ticks.items())), clock)
    rows, label, _ = read_window(tmp_path)
    assert label == 3999  # upper 4201: the label moves in steps of gap; a's session is still open
    assert sorted((r["_window_start"], r["_window_end"], r["g"], r["n"]) for r in rows) == [
        (1100, 1600, "b", 1),
        (3000, 3500, "b", 1),
    ]
    clock.ms = 5000
    pipeline.step()  # a time-only binding at 5000: a's session [1000, 4700) closes, read back whole
    rows, label, _ = read_window(tmp_path)
    assert label == 4999
    assert (1000, 4700, "a", 9) in [(r["_window_start"], r["_window_end"], r["g"], r["n"]) for r in rows]
    same(rows, oracle(output_rows(tmp_path), SESSION, label + 1))


@settings(max_examples=20, deadline=None)
@given(
    script=SCRIPT,
    kind=st.sampled_from(
        [HOP, CUMULATE, SESSION, Window("w", "bids", 700, AGGREGATES, ("g",), having="n > 1 OR g = 'a'")]
    ),
    step=st.sampled_from(STEPS),
    nth=st.integers(1, 3),
    max_groups=st.sampled_from([3, 1000]),
)
def test_crash_anywhere_then_restart_emits_every_hop_cumulate_session_and_having_window_once(
    tmp_path_factory, script, kind, step, nth, max_groups
):
    import dataclasses

    w = dataclasses.replace(kind, max_groups=max_groups)
    clean, crashed = tmp_path_factory.mktemp("clean"), tmp_path_factory.mktemp("crashed")
    run_windows(clean, script, w)
    assume(run_windows(crashed, script, w, crash=CrashAt(step, nth)) > 0)
    want, want_label, _ = read_window(clean)
    got, label, _ = read_window(crashed)
    assert label == want_label
    same(got, want)
    keep = (lambda r: r["n"] > 1 or r["g"] == "a") if w.having else (lambda r: True)
    same(got, oracle(output_rows(crashed), w, label + 1, keep=keep))


def test_a_tilt_frame_adds_the_finer_windows_exact_sums_exactly(tmp_path):
    fine = Window("f", "bids", 100, {"total": "sum(v)"}, ("g",))
    coarse = Window("c", None, 300, {"total": "sum(total)", "mean": "avg(total)"}, ("g",), from_window="f")
    steps(
        tmp_path,
        [fine, coarse],
        {
            1000: [(0, {"g": "a", "v": 2**62}), (0, {"g": "a", "v": 2**62})],
            1150: [(0, {"g": "a", "v": 2**62})],
            1400: [(0, {"g": "b", "v": 1})],
        },
    )
    rows, label, _ = read_window(tmp_path, "c")
    assert label == 1199 and len(rows) == 1
    assert rows[0]["total"] == 3 * 2**62 and rows[0]["mean"] == 1.5 * 2**62
    assert pa.types.is_decimal(pa.scalar(rows[0]["total"]).type)


def test_sessions_past_max_groups_fail_the_pipeline_and_a_higher_bound_then_emits_them_whole(tmp_path):
    from reclock.runtime.windowing import MaxGroupsExceeded

    ticks = {1000: [(0, {"g": g, "v": 1}) for g in "abc"], 2000: [(0, {"g": "a", "v": 2})], 2100: []}
    tight = Window("w", "bids", None, {"n": "count(*)"}, ("g",), 2, kind="session", gap_ms=500)
    with pytest.raises(MaxGroupsExceeded, match="more than max_groups=2 sessions"):
        steps(tmp_path, [tight], ticks)
    assert read_window(tmp_path)[0] == []  # nothing half-emitted
    roomy = Window("w", "bids", None, {"n": "count(*)"}, ("g",), 3, kind="session", gap_ms=500)
    clock = FakeClock(2600)
    source = MemorySource({"bids": SCHEMA})
    start(tmp_path, source, clock, windows=[roomy]).close_windows()
    rows, label, _ = read_window(tmp_path)
    assert label == 1999
    assert sorted((r["g"], r["n"]) for r in rows) == [("a", 1), ("b", 1), ("c", 1)]


def test_empty_windows_are_emitted_with_zero_counts_from_the_first_row_on_as_the_frontier_passes_them(tmp_path):
    aggs = {"n": "count(*)", "total": "sum(v)", "last_v": "last(v)"}
    tumbling = Window("w", "bids", 500, aggs, empty=True)
    hop = Window("h", "bids", 1000, aggs, kind="hop", slide_ms=500, empty=True, having="n = 0 OR total > 1")
    ticks = {1200: [(0, {"g": "a", "v": 2})], 1300: [(1, {"g": "b", "v": 1})], 2000: [], 2600: [], 3100: []}
    steps(tmp_path, [tumbling, hop], ticks, FakeClock(1200))
    rows, label, _ = read_window(tmp_path)
    assert label == 2999  # time-only bindings every 0.5 s carried the upper to 3101
    got = sorted((r["_window_start"], r["n"], r["total"], r["last_v"]) for r in rows)
    assert got == [(1000, 2, 3, 1), (1500, 0, None, None), (2000, 0, None, None), (2500, 0, None, None)]
    hops, label, _ = read_window(tmp_path, "h")
    assert label == 2999
    # [500, 1500) and [1000, 2000) hold both rows (total 3); the rest are empty; none before 1200.
    assert sorted((r["_window_start"], r["n"]) for r in hops) == [(500, 2), (1000, 2), (1500, 0), (2000, 0)]
    with pytest.raises(ConfigError, match="without group_by"):
        Window("w", "bids", 500, aggs, ("g",), empty=True)


COUNT = Window("w", "bids", None, AGGREGATES, ("g",), kind="count", size=3)


def counted(rows: list[dict], w: Window, upper: int) -> list[dict]:
    """Per group, every ``size`` rows in (_into_ts, _partition, _offset) order, the last one below ``upper``."""
    groups: dict[tuple, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["_into_ts"], r["_partition"], r["_offset"])):
        groups.setdefault(tuple(r[c] for c in w.group_by), []).append(r)
    out = []
    for key, members_of in groups.items():
        for i in range(0, len(members_of) - w.size + 1, w.size):
            members = members_of[i : i + w.size]
            if members[-1]["_into_ts"] >= upper:
                continue
            row = {"_window_start": members[0]["_into_ts"], "_window_end": members[-1]["_into_ts"] + 1}
            row |= dict(zip(w.group_by, key, strict=True))
            for agg in w.parsed:
                values = [m[agg.column] for m in members] if agg.column else [1] * len(members)
                row[agg.name] = _aggregate(agg.function, values)
            row |= {"_into_ts": members[-1]["_into_ts"], "_last_partition": members[-1]["_partition"]}
            row["_last_offset"] = members[-1]["_offset"]
            out.append(row)
    return out


def test_count_windows_are_every_size_rows_of_a_group_in_source_order_emitted_once_complete(tmp_path):
    ticks = {1000: [(1, {"g": "a", "v": 1}), (0, {"g": "a", "v": 2}), (0, {"g": "b", "v": 3})]}
    ticks |= {1400: [(0, {"g": "a", "v": 4}), (1, {"g": "a", "v": 5})], 1800: [(0, {"g": "b", "v": 6})]}
    ticks |= {ms: [(0, {"g": "a", "v": ms})] for ms in range(2200, 6000, 400)}
    steps(tmp_path, [COUNT], ticks)
    rows, label, _ = read_window(tmp_path)
    assert label == 5800
    # a: into time 1000 holds partition 0's row before partition 1's: 2, 1, then 4 at 1400.
    first = min((r for r in rows if r["g"] == "a"), key=lambda r: r["_window_start"])
    assert (first["_window_start"], first["_window_end"], first["first_v"], first["n"]) == (1000, 1401, 2, 3)
    assert not [r for r in rows if r["g"] == "b"], "b has two rows: its window is not complete"
    same(rows, counted(output_rows(tmp_path), COUNT, label + 1))


@settings(max_examples=20, deadline=None)
@given(script=SCRIPT, size=st.sampled_from([1, 2, 3]), step=st.sampled_from(STEPS), nth=st.integers(1, 3))
def test_crash_anywhere_then_restart_emits_every_count_window_once(tmp_path_factory, script, size, step, nth):
    import dataclasses

    w = dataclasses.replace(COUNT, size=size)
    clean, crashed = tmp_path_factory.mktemp("clean"), tmp_path_factory.mktemp("crashed")
    run_windows(clean, script, w)
    assume(run_windows(crashed, script, w, crash=CrashAt(step, nth)) > 0)
    want, want_label, _ = read_window(clean)
    got, label, _ = read_window(crashed)
    assert label == want_label
    same(got, want)
    same(got, counted(output_rows(crashed), w, label + 1))
