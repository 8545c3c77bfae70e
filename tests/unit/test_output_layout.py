"""Partitioned outputs (issue 12, acceptance 1): as-of reads and sink labels stay exact, also
across a crash and its replay; checked by replaying the ``_delta_log`` by hand (tests.delta_log)."""

from __future__ import annotations

import datetime as dt
import json

import polars as pl
import pyarrow as pa
import pytest

from reclock.errors import ConfigError
from reclock.job.config import parse_config
from reclock.persist.asof import read_as_of, readable_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.layout import OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.shaping import Shape
from reclock.sources.base import Output
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from tests.delta_log import replay

SCHEMAS = {"clicks": pa.schema([("user", pa.int64())]), "views": pa.schema([("page", pa.string())])}
LAYOUTS = {"clicks": OutputLayout(("_into_date",)), "views": OutputLayout(("page",))}
DAY = 86_400_000
START = 1_795_000_000_000  # 2026-11-18 09:46:40 UTC
# Batch i: its clock, and records per (partition, output). The batches cross two midnights.
BATCHES = [
    (START, [(0, "clicks", 3), (1, "views", 2)]),
    (START + DAY // 2, [(0, "clicks", 2), (1, "clicks", 1), (0, "views", 2)]),
    (START + DAY, [(1, "views", 3), (0, "clicks", 1)]),
    (START + 2 * DAY, [(0, "clicks", 2), (1, "views", 1)]),
]


def utc_day(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms // 1000, dt.UTC).date().isoformat()


def feed(source: MemorySource, appends, truth: dict, counter: list[int], clock_ms: int) -> None:
    """Append records, and record the ground truth: which row each is, and its batch's time."""
    for partition, output, count in appends:
        for _ in range(count):
            counter[0] += 1
            row = {"user": counter[0]} if output == "clicks" else {"page": f"p{counter[0] % 3}"}
            truth.setdefault(output, []).append((counter[0], row, clock_ms))
            source.append(partition, output, [row])


def run(lake, crash: CrashAt | None) -> tuple[bool, dict, list[int]]:
    """The batches, crashing once where ``crash`` says and restarting the driver after it."""
    source = MemorySource(SCHEMAS)
    clock = FakeClock(0)
    truth: dict = {}
    counter = [0]
    times = []
    crashed = False
    for now, appends in BATCHES:
        clock.ms = now
        feed(source, appends, truth, counter, now)
        try:
            Pipeline("pipe", lake, source, now=clock, layouts=LAYOUTS, on_step=crash).step()
        except SimulatedCrash:
            crash, crashed = None, True
            Pipeline("pipe", lake, source, now=clock, layouts=LAYOUTS).step()  # the restart catches up
        times.append(now)
    return crashed, truth, times


@pytest.mark.parametrize("crash", [None, "written", "committed:clicks", "committed:views", "resumed"])
@pytest.mark.parametrize("nth", [1, 3])
def test_partitioned_outputs_keep_as_of_reads_and_labels_exact_across_a_crash(tmp_path, crash, nth):
    crashed, truth, times = run(tmp_path, CrashAt(crash, nth) if crash else None)
    assert crashed == (crash is not None)
    lake = Lake.at(tmp_path)
    for output, partition_by in (("clicks", ["_into_date"]), ("views", ["page"])):
        state = replay(lake.output_path("pipe", output))
        # The table is partitioned, every commit labelled, the last label the last batch's.
        assert state.partition_columns == partition_by
        assert state.labels[sink_id("pipe", output)] == times[-1]
        rows = state.rows()
        # Exactly once: one row per record (no replay duplicated one), stamped with its batch.
        expected = sorted((r.get("user") or r["page"], ms) for _, r, ms in truth[output])
        got = sorted((r.get("user") or r["page"], r["_into_ts"]) for r in rows)
        assert got == expected
        for row in rows:
            folder_value = row["_into_date"] if output == "clicks" else row["page"]
            assert folder_value == (utc_day(row["_into_ts"]) if output == "clicks" else row["page"])
        for path, add in state.files.items():
            assert path.startswith(f"{partition_by[0]}={add['partitionValues'][partition_by[0]]}/")
        if output == "clicks":
            assert {r["_into_date"] for r in rows} == {utc_day(t) for t in times}
    # As of each batch time (and just before it), every output holds exactly the rows stamped at or below it.
    assert readable_upper(tmp_path, "pipe") == times[-1] + 1
    for as_of in [t + d for t in times for d in (-1, 0)][1:]:
        read = read_as_of(tmp_path, "pipe", as_of)
        clicks = sorted(read["clicks"].column("user").to_pylist())
        assert clicks == sorted(r["user"] for _, r, ms in truth["clicks"] if ms <= as_of)
        assert {str(d) for d in read["clicks"].column("_into_date").to_pylist()} == {
            utc_day(ms) for _, _, ms in truth["clicks"] if ms <= as_of
        }
        views = sorted(read["views"].column("page").to_pylist())
        assert views == sorted(r["page"] for _, r, ms in truth["views"] if ms <= as_of)


def test_a_replayed_batch_adds_no_file_to_a_partitioned_output(tmp_path):
    source = MemorySource(SCHEMAS)
    clock = FakeClock(START)
    source.append(0, "clicks", [{"user": 1}, {"user": 2}])
    with pytest.raises(SimulatedCrash):
        Pipeline("pipe", tmp_path, source, now=clock, layouts=LAYOUTS, on_step=CrashAt("committed:clicks")).step()
    path = Lake.at(tmp_path).output_path("pipe", "clicks")
    before = replay(path)
    Pipeline("pipe", tmp_path, source, now=clock, layouts=LAYOUTS).step()
    after = replay(path)
    assert after.files.keys() == before.files.keys()
    assert len(after.commits) == len(before.commits)  # the label skipped the replay before any write
    assert sorted(r["user"] for r in after.rows()) == [1, 2]


def test_the_partitioning_of_an_existing_output_cannot_change(tmp_path):
    source = MemorySource(SCHEMAS)
    Pipeline("pipe", tmp_path, source, layouts=LAYOUTS)
    with pytest.raises(ConfigError, match=r"outputs.clicks.partition_by: the table is partitioned by \['_into_date'\]"):
        Pipeline("pipe", tmp_path, source, layouts={"clicks": OutputLayout(("user",))})


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ({"nope": {"partition_by": ["_into_date"]}}, "outputs.nope: the source has no output 'nope'"),
        ({"clicks": {"partition_by": ["page"]}}, "outputs.clicks.partition_by: 'page' is neither"),
        ({"clicks": {"partition_by": "_into_date", "colour": 1}}, "outputs.clicks.colour: unknown key"),
        ({"clicks": {"schema_evolution": "merge"}}, "outputs.clicks.schema_evolution: must be one of"),
        ({"clicks": {"partition_by": [1]}}, "outputs.clicks.partition_by: must be a list of column names"),
    ],
)
def test_layout_mistakes_are_one_line_naming_the_field(tmp_path, outputs, message):
    with pytest.raises(ConfigError, match=message) as caught:
        config = parse_config(
            {"pipeline": {"name": "pipe", "lake": str(tmp_path)}, "source": {"kind": "generator"}, "outputs": outputs}
        )
        Pipeline("pipe", tmp_path, MemorySource(SCHEMAS), layouts=config.layouts)
    assert "\n" not in str(caught.value)


def test_layouts_round_trip_through_the_stored_definition(tmp_path):
    raw = {
        "pipeline": {"name": "pipe", "lake": str(tmp_path)},
        "source": {"kind": "generator"},
        "outputs": {"bids": {"partition_by": ["_into_date"], "schema_evolution": "none"}},
    }
    config = parse_config(raw)
    assert config.layouts == {"bids": OutputLayout(("_into_date",), "none")}
    assert parse_config(config.to_dict()).layouts == config.layouts


def test_a_partitioned_upsert_output_merges_across_days_and_reads_as_of_each(tmp_path):
    source = MemorySource({"kv": Output("kv", pa.schema([("k", pa.string()), ("v", pa.int64())]), ("k",), "upsert")})
    clock = FakeClock(START)
    layouts = {"kv": OutputLayout(("_into_date",))}
    source.append(0, "kv", [{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    Pipeline("pipe", tmp_path, source, now=clock, layouts=layouts).step()
    clock.ms = START + DAY
    source.append(0, "kv", [{"k": "a", "v": 3}])
    Pipeline("pipe", tmp_path, source, now=clock, layouts=layouts).step()
    state = replay(Lake.at(tmp_path).output_path("pipe", "kv"))
    assert state.partition_columns == ["_into_date"]
    assert sorted((r["k"], r["v"], r["_into_date"]) for r in state.rows()) == [
        ("a", 3, utc_day(START + DAY)),
        ("b", 2, utc_day(START)),
    ]
    first = read_as_of(tmp_path, "pipe", START)["kv"]
    assert sorted(zip(first.column("k").to_pylist(), first.column("v").to_pylist(), strict=True)) == [
        ("a", 1),
        ("b", 2),
    ]


def test_partition_values_that_need_escaping_read_back_through_every_reader(tmp_path):
    source = MemorySource(SCHEMAS)
    pages = ["a/b", "x y%", "=?", "", None, "plain"]
    source.append(0, "views", [{"page": p} for p in pages])
    Pipeline("pipe", tmp_path, source, now=FakeClock(START), layouts=LAYOUTS).step()
    path = Lake.at(tmp_path).output_path("pipe", "views")
    expected = [*sorted(["a/b", "x y%", "=?", "plain"]), None]  # "" would read back as null: in _errors
    by_log = [r["page"] for r in replay(path).rows()]
    by_api = read_as_of(tmp_path, "pipe", START)["views"].column("page").to_pylist()
    by_polars = pl.read_delta(str(path))["page"].to_list()
    for got in (by_log, by_api, by_polars):
        assert sorted(got, key=lambda p: (p is None, p or "")) == expected
    errors = replay(Lake.at(tmp_path).output_path("pipe", "_errors")).rows()
    assert [(r["_offset"], r["kind"]) for r in errors] == [(pages.index(""), "partition")]


# Values no partition folder holds faithfully, and values just inside the limit (the column is
# "page": a folder "page=<escaped>" of at most 255 bytes).
UNFIT = ["a" * 251, "\N{GRINNING FACE}" * 21, "__HIVE_DEFAULT_PARTITION__", ""]
FIT = ["a" * 250, "\N{GRINNING FACE}" * 20, "__hive_default_partition__", " ", None, "home"]


@pytest.mark.parametrize("crash", [None, "written", "committed:views", "committed:_errors"])
def test_a_value_no_partition_folder_holds_goes_to_errors_alone_and_the_rest_of_the_batch_lands(tmp_path, crash):
    source = MemorySource(SCHEMAS)
    truth = {0: [*FIT[:3], *UNFIT[:2], *FIT[3:], *UNFIT[2:]], 1: ["home", UNFIT[0], "away"]}
    for partition, pages in truth.items():
        source.append(partition, "views", [{"page": p} for p in pages])
    source.append(0, "clicks", [{"user": 7}])
    clock = FakeClock(START)
    try:
        Pipeline("pipe", tmp_path, source, now=clock, layouts=LAYOUTS, on_step=crash and CrashAt(crash)).step()
    except SimulatedCrash:
        Pipeline("pipe", tmp_path, source, now=clock, layouts=LAYOUTS).step()  # the restart replays
    lake = Lake.at(tmp_path)
    landed = pl.read_delta(str(lake.output_path("pipe", "views")))
    assert sorted(landed.select("_partition", "_offset", "page").rows(), key=str) == sorted(
        ((str(p), o, page) for p, pages in truth.items() for o, page in enumerate(pages) if page not in UNFIT), key=str
    )
    assert sorted(r["page"] for r in replay(lake.output_path("pipe", "views")).rows() if r["page"]) == sorted(
        page for pages in truth.values() for page in pages if page is not None and page not in UNFIT
    )
    errors = pl.read_delta(str(lake.output_path("pipe", "_errors"))).sort("_partition", "_offset")
    assert errors.select("_partition", "_offset", "kind").rows() == [
        (str(p), o, "partition") for p, pages in sorted(truth.items()) for o, page in enumerate(pages) if page in UNFIT
    ]  # each exactly once, with its coordinates, also after a crash between the two commits
    assert [json.loads(raw)["page"] for raw in errors["raw"].to_list()] == [
        page for _, pages in sorted(truth.items()) for page in pages if page in UNFIT
    ]
    assert all(m.startswith("partition column 'page': ") and "\n" not in m for m in errors["message"].to_list())
    assert replay(lake.output_path("pipe", "clicks")).rows()[0]["user"] == 7


def test_a_shaped_partitioned_output_sends_its_unfit_values_to_errors_too(tmp_path):
    source = MemorySource(SCHEMAS)
    source.append(0, "views", [{"page": p} for p in ["home", "a" * 300, "b"]])
    shapes = [Shape("views", sql="SELECT upper(page) AS page FROM input")]
    Pipeline("pipe", tmp_path, source, now=FakeClock(START), layouts=LAYOUTS, shapes=shapes).step()
    lake = Lake.at(tmp_path)
    assert sorted(pl.read_delta(str(lake.output_path("pipe", "views")))["page"].to_list()) == ["B", "HOME"]
    errors = pl.read_delta(str(lake.output_path("pipe", "_errors")))
    assert errors.select("_offset", "kind").rows() == [(1, "partition")]
