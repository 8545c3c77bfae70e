"""Window sums and averages over integers are exact, whatever the values (issue 21, items 1 and 2).

A window's ``avg`` over int64 used to convert its sum to float64 and fail once the sum passed
2^53 (the pipeline failed, and every restart failed the same way); its ``sum`` wrapped past
2^63 without a word. Every check here reads the tables from outside (the Delta log by hand,
``tests/faults/reader.py``) and compares with a recomputation in Python integers: a sum is the
exact integer, an average the correctly rounded quotient ``sum / count``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Settings
from reclock.runtime.windowing import SumOutOfRange
from reclock.runtime.windows import Window
from reclock.sources.generator import GeneratorSource
from reclock.testing import FakeClock, MemorySource
from tests.faults.reader import DeltaLog, label_of, read_rows

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SCHEMA = pa.schema([("g", pa.string()), ("v", pa.int64()), ("u", pa.uint64())])
EXACT = {"n": "count(*)", "total": "sum(v)", "mean": "avg(v)", "utotal": "sum(u)", "umean": "avg(u)"}


def table_rows(path: Path) -> list[dict]:
    return (read_rows(DeltaLog(path).refresh()) or pa.table({})).to_pylist()


def column_types(path: Path) -> dict[str, str]:
    """The table's column types as its newest ``metaData`` action states them (the log, by hand)."""
    schema = None
    for entry in sorted((path / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "metaData" in action:
                schema = json.loads(action["metaData"]["schemaString"])
    assert schema is not None
    return {f["name"]: f["type"] for f in schema["fields"]}


def recompute(rows: list[dict], window: Window, upper: int) -> dict[tuple, dict]:
    """Every window ending at or below ``upper`` by (start, group): exact integer sums and the
    correctly rounded average (Python's ``int / int``), from the output's rows."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        start = r["_into_ts"] // window.size_ms * window.size_ms
        if start + window.size_ms <= upper:
            groups.setdefault((start, *(r[c] for c in window.group_by)), []).append(r)
    out = {}
    for key, members in groups.items():
        row: dict = {}
        for agg in window.parsed:
            present = [m for m in members if agg.column is None or m[agg.column] is not None]
            values = [m[agg.column] if agg.column else 1 for m in present]
            if agg.function == "count":
                row[agg.name] = len(values)
            elif agg.function == "sum":
                row[agg.name] = sum(values) if values else None
            elif agg.function == "avg":
                row[agg.name] = sum(values) / len(values) if values else None
        out[key] = row
    return out


def emitted(path: Path, window: Window) -> dict[tuple, dict]:
    got = {}
    for r in table_rows(path):
        key = (r["_window_start"], *(r[c] for c in window.group_by))
        assert key not in got, f"window {key} emitted twice"
        got[key] = {agg.name: r[agg.name] for agg in window.parsed}
    return got


def exactly(got: dict[tuple, dict], want: dict[tuple, dict]) -> None:
    """Equal, with no tolerance: a sum is the exact integer, an average the correctly rounded quotient."""
    assert got.keys() == want.keys()
    for key, row in want.items():
        for name, value in row.items():
            mine = got[key][name]
            assert mine == value and (type(mine) is float) == (type(value) is float), (key, name, mine, value)


def test_sums_past_2_53_and_2_63_are_exact_and_ingestion_goes_on(tmp_path):
    """2^53 + 1 once, then 2^62 + 2^62 (which wrapped to -2^63) and sums below int64's least value:
    the windows hold the exact sums and averages, and later batches keep landing."""
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    w = Window("w", "bids", 1000, EXACT, ("g",))
    pipeline = Pipeline("pipe", tmp_path, source, now=clock, settings=Settings(idle_interval=0.5), windows=[w])
    batches = {
        1000: [{"g": "poison", "v": 2**53 + 1, "u": 2**64 - 1}, {"g": "poison", "v": 2, "u": 2**64 - 1}],
        1400: [{"g": "wrap", "v": 2**62}, {"g": "wrap", "v": 2**62}, {"g": "low", "v": INT64_MIN}],
        1700: [{"g": "low", "v": INT64_MIN}, {"g": "low", "v": INT64_MAX}, {"g": "nulls", "v": None}],
        2200: [{"g": "after", "v": INT64_MAX}, {"g": "after", "v": INT64_MAX}, {"g": "after", "v": 1}],
        3100: [{"g": "later", "v": 7}],
        4500: [],
    }
    for ms, rows in batches.items():
        clock.ms = ms
        source.append(0, "bids", [{"u": None, **row} for row in rows])
        pipeline.step()
    assert pipeline.health is not Health.FAILED and pipeline.last_error is None
    output = tmp_path / "pipe" / "outputs" / "bids"
    assert len(table_rows(output)) == 12  # every record landed, the ones after the poison too
    window_table = tmp_path / "pipe" / "windows" / "w"
    assert label_of(DeltaLog(window_table).refresh(), "reclock/pipe/windows/w") == 3999
    want = recompute(table_rows(output), w, 4000)
    got = emitted(window_table, w)
    exactly(got, want)
    assert got[(1000, "wrap")]["total"] == 2**63 and got[(1000, "poison")]["mean"] == (2**53 + 3) / 2
    assert got[(1000, "poison")]["utotal"] == 2**65 - 2 and got[(2000, "after")]["total"] == 2**64 - 1
    assert column_types(window_table)["total"] == "decimal(38,0)"


def test_the_generators_date_time_averages_over_thousands_of_bids_per_channel(tmp_path):
    """The report's case: ~9,000 bids per channel in one window, their date_time summing past 2^53."""
    source = GeneratorSource(partitions=1, limit=40_000)
    w = Window(
        "per_channel",
        "bids",
        60_000,
        {"bids": "count(*)", "at": "avg(date_time)", "all": "sum(date_time)"},
        ("channel",),
    )
    pipeline = Pipeline("pipe", tmp_path, source, now=FakeClock(1000), windows=[w])
    pipeline.run()
    assert pipeline.finished and pipeline.windows_current and pipeline.health is Health.STOPPED
    want = recompute(table_rows(tmp_path / "pipe" / "outputs" / "bids"), w, 60_000)
    assert min(row["bids"] for row in want.values()) > 7_000 and min(r["all"] for r in want.values()) > 2**53
    exactly(emitted(tmp_path / "pipe" / "windows" / "per_channel", w), want)


def legacy_table(lake: Path, window: Window) -> Path:
    """A window table as reclock made it before exact sums: ``sum`` over int64 stored as int64."""
    path = lake / "pipe" / "windows" / window.name
    schema = pa.schema(
        [
            ("_window_start", pa.int64(), False),
            ("_window_end", pa.int64(), False),
            ("g", pa.string()),
            ("n", pa.int64()),
            ("total", pa.int64()),
            ("mean", pa.float64()),
            ("_into_ts", pa.int64(), False),
        ]
    )
    definition = {k: v for k, v in window.to_dict().items() if k != "max_groups"}
    stored = {"reclock.window": json.dumps(definition, sort_keys=True)}
    DeltaTable.create(str(path), schema).alter.set_table_properties(stored, raise_if_not_exists=False)
    return path


def test_a_window_table_made_before_keeps_its_int64_sums_and_one_that_no_longer_fits_fails_in_one_line(tmp_path):
    source = MemorySource({"bids": SCHEMA})
    clock = FakeClock(1000)
    w = Window("w", "bids", 1000, {"n": "count(*)", "total": "sum(v)", "mean": "avg(v)"}, ("g",))
    path = legacy_table(tmp_path, w)
    pipeline = Pipeline("pipe", tmp_path, source, now=clock, settings=Settings(idle_interval=0.5), windows=[w])
    source.append(0, "bids", [{"g": "a", "v": INT64_MAX}, {"g": "a", "v": -5}, {"g": "b", "v": 2**53 + 1}])
    pipeline.step()
    clock.ms = 2500
    pipeline.step()
    assert column_types(path)["total"] == "long"  # appended to as it is, no new column type
    rows = sorted(table_rows(path), key=lambda r: r["g"])
    assert [(r["g"], r["total"], r["mean"]) for r in rows] == [
        ("a", INT64_MAX - 5, (INT64_MAX - 5) / 2),
        ("b", 2**53 + 1, float(2**53 + 1)),
    ]
    source.append(0, "bids", [{"g": "a", "v": INT64_MAX}, {"g": "a", "v": 1}])
    source.finish()
    clock.ms = 2800
    with pytest.raises(SumOutOfRange) as failure:
        pipeline.run()
    message = str(failure.value)
    assert "\n" not in message and "window 'w' [2000, 3000)" in message and "'total'" in message
    assert "9223372036854775808" in message and "new name" in message
    assert pipeline.health is Health.FAILED
    assert len(table_rows(tmp_path / "pipe" / "outputs" / "bids")) == 5  # the output holds every record
    assert label_of(DeltaLog(path).refresh(), "reclock/pipe/windows/w") == 1999  # nothing wrapped landed
