"""Event-time windows: a watermark derived from durable rows only, late rows kept exactly once.

The oracle here is written from the definition in ``docs/windows.md``: rows in into-time order,
``M`` before a row the greatest event time of rows with a smaller ``_into_ts``, a row late when
its window's end is at most ``M - allowed_lateness`` (or it has no event time), a window closing
one past the into time of the first row at or above ``end + lateness``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reclock.errors import ConfigError
from reclock.runtime.windows import Window, check_windows
from reclock.sources.base import Output
from reclock.testing import CrashAt
from tests.unit.test_window_kinds import same, steps
from tests.unit.test_windows import SCHEMA, SCRIPT, STEPS, _aggregate, output_rows, run_windows
from tests.unit.test_windows import window_table as read_window

#: Crash-anywhere recomputations: CPU-bound with nothing to wait on, run beside the Spark tests,
#: whose session ends minutes before the pool's (scripts/test).
pytestmark = pytest.mark.beside_spark

AGGS = {"n": "count(*)", "total": "sum(x)", "first_v": "first(v)", "last_g": "last(g)"}
EVENTS = Window("w", "bids", 4, AGGS, ("g",), time_column="v", allowed_lateness_ms=2)


def oracle(rows: list[dict], w: Window, final_upper: int, finished: bool) -> tuple[list[dict], list[dict]]:
    """The window rows and the late rows the definition gives for ``rows``."""
    ordered = sorted(rows, key=lambda r: (r["_into_ts"], r["_partition"], r["_offset"]))
    size, lateness = w.size_ms, w.allowed_lateness_ms
    late, kept = [], []
    for r in ordered:
        earlier = [o["v"] for o in ordered if o["_into_ts"] < r["_into_ts"] and o["v"] is not None]
        end = None if r["v"] is None else (r["v"] // size + 1) * size
        if end is None or (earlier and end <= max(earlier) - lateness):
            late.append(r)
        else:
            kept.append(r)
    windows: dict[tuple, list[dict]] = {}
    for r in kept:
        start = r["v"] // size * size
        windows.setdefault((start, *(r[c] for c in w.group_by)), []).append(r)
    out = []
    for (start, *key), members in windows.items():
        end = start + size
        pushed = [r["_into_ts"] for r in ordered if r["v"] is not None and r["v"] >= end + lateness]
        if not pushed and not finished:
            continue
        closes = min(pushed) + 1 if pushed else final_upper
        members = [m for m in members if m["_into_ts"] < closes]
        row = {"_window_start": start, "_window_end": end, **dict(zip(w.group_by, key, strict=True))}
        for agg in w.parsed:
            values = [m[agg.column] for m in members] if agg.column else [1] * len(members)
            row[agg.name] = _aggregate(agg.function, values)
        row["_into_ts"] = closes - 1
        out.append(row)
    return out, late


def test_event_time_settings_are_checked_in_one_line():
    with pytest.raises(ConfigError, match="needs time_column"):
        Window("w", "bids", 4, AGGS, allowed_lateness_ms=5)
    with pytest.raises(ConfigError, match="tumbling windows over an output"):
        Window("w", "bids", 4, AGGS, kind="hop", slide_ms=2, time_column="v")
    with pytest.raises(ConfigError, match="epoch milliseconds or a timestamp"):
        check_windows([Window("w", "bids", 4, AGGS, time_column="g")], [Output("bids", SCHEMA)])
    coarse = Window("c", None, 8, {"n": "sum(n)"}, from_window="w")
    with pytest.raises(ConfigError, match="of into time without having"):
        check_windows([EVENTS, coarse], [Output("bids", SCHEMA)])
    clash = Window("w_late", "bids", 4, {"n": "count(*)"})
    with pytest.raises(ConfigError, match="rename that window"):
        check_windows([EVENTS, clash], [Output("bids", SCHEMA)])


def test_a_window_closes_when_the_watermark_of_bound_rows_passes_its_end_and_later_rows_are_late(tmp_path: Path):
    w = Window(
        "w", "bids", 1000, {"n": "count(*)", "total": "sum(x)"}, ("g",), time_column="v", allowed_lateness_ms=200
    )
    ticks = {
        1000: [(0, {"g": "a", "v": 500, "x": 1.0}), (0, {"g": "a", "v": 900, "x": 2.0})],
        1100: [(0, {"g": "a", "v": 1300})],  # the watermark reaches 1100: [0, 1000) closes at 1101
        1200: [(0, {"g": "a", "v": 950}), (1, {"g": "b", "v": None})],  # late: its window closed; no time
        1300: [(0, {"g": "a", "v": 2500})],
        1400: [(0, {"g": "a", "v": 1900})],
    }
    steps(tmp_path, [w], ticks)
    rows, label, _ = read_window(tmp_path)
    assert label == 1400  # event-time windows move with every pass over new into times
    got = sorted((r["_window_start"], r["n"], r["_into_ts"]) for r in rows)
    assert got == [(0, 2, 1100), (1000, 1, 1300)]
    late, late_label, _ = read_window(tmp_path, "w_late")
    assert late_label == 1400
    assert sorted((r["v"] or 0, r["_into_ts"], r["_offset"]) for r in late) == [
        (0, 1200, 0),
        (950, 1200, 3),
        (1900, 1400, 5),
    ]
    want, want_late = oracle(output_rows(tmp_path), w, 1401, finished=False)
    same(rows, want)
    assert sorted(r["_offset"] for r in late) == sorted(r["_offset"] for r in want_late)


@settings(max_examples=25, deadline=None)
@given(
    script=SCRIPT,
    lateness=st.sampled_from([0, 2, 7]),
    step=st.sampled_from([*STEPS, "windowed:w_late"]),
    nth=st.integers(1, 3),
)
def test_crash_anywhere_then_restart_gives_the_same_windows_and_late_rows_each_row_once(
    tmp_path_factory, script, lateness, step, nth
):
    w = dataclasses.replace(EVENTS, allowed_lateness_ms=lateness)
    clean, crashed = tmp_path_factory.mktemp("clean"), tmp_path_factory.mktemp("crashed")
    run_windows(clean, script, w)
    assume(run_windows(crashed, script, w, crash=CrashAt(step, nth)) > 0)
    for name in ("w", "w_late"):
        want, want_label, _ = read_window(clean, name)
        got, label, _ = read_window(crashed, name)
        assert label == want_label, name
        key = (
            (lambda r: (r["_partition"], r["_offset"]))
            if name == "w_late"
            else (lambda r: (r["_window_start"], str(r["g"])))
        )
        assert sorted(map(key, got)) == sorted(map(key, want)), name
    rows = output_rows(crashed)
    upper = max(r["_into_ts"] for r in rows) + 1 if rows else 0
    got, label, _ = read_window(crashed)
    late, _, _ = read_window(crashed, "w_late")
    final = label  # the finished pass is labelled with the output's upper: it used hi = label
    want, want_late = oracle(rows, w, final, finished=True)
    same(got, want)
    assert sorted((r["_partition"], r["_offset"]) for r in late) == sorted(
        (r["_partition"], r["_offset"]) for r in want_late
    )
    assert sum(r["n"] for r in got) + len(late) == len(rows), "a row in no window and not late, or in both"
    assert upper <= final


def test_a_crash_between_the_late_and_the_window_commit_redoes_exactly_that_pass(tmp_path: Path):
    from reclock.testing import FakeClock, MemorySource, SimulatedCrash
    from tests.unit.test_windows import start

    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    w = Window("w", "bids", 1000, {"n": "count(*)"}, ("g",), time_column="v")
    crashing = start(tmp_path, source, clock, windows=[w], on_step=CrashAt("windowed:w_late", 2))
    source.append(0, "bids", [{"g": "a", "v": 100}])
    crashing.step()
    clock.ms = 1100
    source.append(0, "bids", [{"g": "a", "v": 2000}, {"g": "a", "v": 50}])
    with pytest.raises(SimulatedCrash):
        crashing.step()  # the late table holds the pass to 1101; the window table does not
    assert read_window(tmp_path, "w_late")[1] == 1100 and read_window(tmp_path)[1] == 1000
    clock.ms = 1200  # the output moves on before windows run again
    source.append(0, "bids", [{"g": "a", "v": 60}])
    start(tmp_path, source, clock, windows=[]).step()
    start(tmp_path, source, clock, windows=[w]).close_windows()
    rows, label, _ = read_window(tmp_path)
    late, late_label, _ = read_window(tmp_path, "w_late")
    assert label == late_label == 1200
    # 50 is bound with 2000, in the binding that moves the watermark: on time, like 100.
    assert [(r["_window_start"], r["n"], r["_into_ts"]) for r in rows] == [(0, 2, 1100)]
    assert [r["v"] for r in late] == [60]
