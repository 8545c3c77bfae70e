"""Schema evolution (issue 12, acceptance 2) on the in-driver plane: a files stream gains a field
mid-run; ``add`` lands it as a new column (earlier rows null), ``rescue`` in ``_rescued``, ``fail``
stops with one line naming it and commits nothing. Checked by replaying the ``_delta_log`` by hand
(tests.delta_log) and with polars, against what the test wrote."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from reclock.cli.main import main
from reclock.errors import ConfigError
from reclock.persist.evolution import SchemaEvolutionError
from reclock.persist.lake import Lake, sink_id
from reclock.persist.layout import OutputLayout
from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.sources.base import Output
from reclock.sources.files import FilesSource
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from reclock.timeline.frontier import UNKNOWN_FIELDS
from tests.delta_log import replay
from tests.waiting import run_until

COLUMNS = {"id": "int64", "name": "string"}
T1, T2, T3 = 1_000_000, 2_000_000, 3_000_000


def jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


OLD = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
NEW = [{"id": 3, "name": "c", "color": "red"}, {"id": 4, "name": "d", "color": 7, "size": {"w": 1}}, {"id": 5}]


def pipeline(tmp_path: Path, mode: str, clock: FakeClock, fmt: str = "jsonl", **kwargs) -> Pipeline:
    source = FilesSource(path=str(tmp_path / "in"), format=fmt, columns=COLUMNS, now=clock)
    return Pipeline(
        "pipe", tmp_path / "lake", source, now=clock, layouts={"rows": OutputLayout(schema_evolution=mode)}, **kwargs
    )


def table_path(tmp_path: Path) -> Path:
    return Lake.at(tmp_path / "lake").output_path("pipe", "rows")


def two_batches(tmp_path: Path, mode: str, **kwargs) -> FakeClock:
    """Batch T1 reads a file of the declared fields; batch T2 a file whose records bring more."""
    clock = FakeClock(T1)
    jsonl(tmp_path / "in" / "1.jsonl", OLD)
    pipeline(tmp_path, mode, clock).step()
    clock.ms = T2
    jsonl(tmp_path / "in" / "2.jsonl", NEW)
    pipeline(tmp_path, mode, clock, **kwargs).step()
    return clock


def test_add_lands_a_new_field_as_a_nullable_string_column_and_earlier_rows_read_null(tmp_path):
    two_batches(tmp_path, "add")
    state = replay(table_path(tmp_path))
    fields = {f["name"]: f for f in state.schema}
    assert fields["color"]["type"] == "string" and fields["color"]["nullable"]
    assert fields["size"]["type"] == "string"
    rows = {r["id"]: r for r in state.rows()}
    assert [(rows[i]["color"], rows[i]["size"]) for i in (1, 2)] == [(None, None), (None, None)]
    assert rows[3]["color"] == "red" and rows[4]["color"] == "7" and json.loads(rows[4]["size"]) == {"w": 1}
    assert rows[5]["color"] is None and rows[5]["name"] is None
    assert state.labels[sink_id("pipe", "rows")] == T2
    # The schema change is in the batch's own labelled commit, with all of its rows.
    [commit] = [c for c in state.commits if any("metaData" in a for a in c) and any("txn" in a for a in c)]
    assert [a["txn"]["version"] for a in commit if "txn" in a] == [T2]
    assert sum(json.loads(a["add"]["stats"])["numRecords"] for a in commit if "add" in a) == len(NEW)
    # polars, another outside reader, agrees.
    frame = pl.read_delta(str(table_path(tmp_path))).sort("id")
    assert frame.select("id", "color").rows() == [(1, None), (2, None), (3, "red"), (4, "7"), (5, None)]


def test_a_column_added_earlier_is_filled_by_later_batches_without_another_schema_change(tmp_path):
    clock = two_batches(tmp_path, "add")
    clock.ms = T3
    jsonl(tmp_path / "in" / "3.jsonl", [{"id": 6, "name": "e", "color": "blue"}, {"id": 7, "name": "f"}])
    pipeline(tmp_path, "add", clock).step()
    state = replay(table_path(tmp_path))
    [last] = [c for c in state.commits if any(a.get("txn", {}).get("version") == T3 for a in c)]
    assert not any("metaData" in a for a in last)  # the tasks' files, committed as they are
    rows = {r["id"]: r["color"] for r in state.rows()}
    assert rows == {1: None, 2: None, 3: "red", 4: "7", 5: None, 6: "blue", 7: None}


def test_rescue_keeps_unknown_fields_in_the_rescued_column(tmp_path):
    two_batches(tmp_path, "rescue")
    state = replay(table_path(tmp_path))
    assert [f["name"] for f in state.schema][:3] == ["id", "name", "_rescued"]
    assert "color" not in state.column_names
    rows = {r["id"]: r["_rescued"] for r in state.rows()}
    assert rows[1] is None and rows[2] is None and rows[5] is None
    assert json.loads(rows[3]) == {"color": "red"}
    assert json.loads(rows[4]) == {"color": 7, "size": {"w": 1}}


def test_fail_stops_with_one_line_naming_the_field_and_commits_nothing_then_add_lands_it_all(tmp_path):
    clock = FakeClock(T1)
    jsonl(tmp_path / "in" / "1.jsonl", OLD)
    pipeline(tmp_path, "fail", clock).step()
    before = replay(table_path(tmp_path))
    clock.ms = T2
    jsonl(tmp_path / "in" / "2.jsonl", NEW)
    failing = pipeline(tmp_path, "fail", clock)
    with pytest.raises(SchemaEvolutionError) as caught:
        failing.run(threading.Event())
    message = str(caught.value)
    assert "\n" not in message
    assert "output 'rows': new field 'color'" in message and "size" in message
    assert failing.health is Health.FAILED
    after = replay(table_path(tmp_path))
    assert after.labels == before.labels and after.files == before.files and len(after.commits) == len(before.commits)
    assert not [p for p in table_path(tmp_path).rglob("*.parquet") if p.name not in {Path(f).name for f in after.files}]
    # Nothing was lost: with the policy changed, the very same batch lands whole.
    pipeline(tmp_path, "add", clock).step()
    state = replay(table_path(tmp_path))
    assert sorted(r["id"] for r in state.rows()) == [1, 2, 3, 4, 5]
    assert state.labels[sink_id("pipe", "rows")] == T2


@pytest.mark.parametrize("crash", ["written", "committed:rows", "committed:_errors"])
def test_a_crash_around_the_schema_change_neither_loses_nor_duplicates(tmp_path, crash):
    with pytest.raises(SimulatedCrash):
        two_batches(tmp_path, "add", on_step=CrashAt(crash))
    pipeline(tmp_path, "add", FakeClock(T2)).step()
    state = replay(table_path(tmp_path))
    assert sorted(r["id"] for r in state.rows()) == [1, 2, 3, 4, 5]
    changes = [c for c in state.commits if any("metaData" in a for a in c) and any("txn" in a for a in c)]
    assert len(changes) == 1
    assert {r["id"]: r["color"] for r in state.rows()}[3] == "red"


def test_a_csv_header_naming_a_new_column_lands_it_under_add(tmp_path):
    clock = FakeClock(T1)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.csv").write_text("id,name\n1,a\n2,b\n")
    pipeline(tmp_path, "add", clock, fmt="csv").step()
    clock.ms = T2
    (tmp_path / "in" / "2.csv").write_text("id,name,color\n3,c,red\n4,d,\n")
    pipeline(tmp_path, "add", clock, fmt="csv").step()
    rows = {r["id"]: (r["name"], r["color"]) for r in replay(table_path(tmp_path)).rows()}
    assert rows == {1: ("a", None), 2: ("b", None), 3: ("c", "red"), 4: ("d", None)}


def test_without_a_policy_unknown_fields_are_ignored_as_before(tmp_path):
    two_batches(tmp_path, "none")
    state = replay(table_path(tmp_path))
    assert state.column_names == ["id", "name", "_into_ts", "_partition", "_offset"]
    assert sorted(r["id"] for r in state.rows()) == [1, 2, 3, 4, 5]


def test_add_on_a_debezium_output_or_parquet_files_is_refused_naming_the_field(tmp_path):
    (tmp_path / "in").mkdir()
    source = FilesSource(path=str(tmp_path / "in"), format="parquet", columns=COLUMNS)
    add = {"rows": OutputLayout(schema_evolution="add")}
    with pytest.raises(ConfigError, match=r"outputs\.rows\.schema_evolution: parquet files cannot report new fields"):
        Pipeline("pipe", tmp_path / "lake", source, layouts=add)
    debezium = MemorySource({"rows": Output("rows", pa.schema([("id", pa.int64())]), ("id",), "debezium")})
    with pytest.raises(ConfigError, match=r"outputs\.rows\.schema_evolution: 'add' needs an append or upsert output"):
        Pipeline("pipe", tmp_path / "lake", debezium, layouts=add)
    with pytest.raises(ConfigError, match=r"outputs\.rows\.schema_evolution: a MemorySource cannot report"):
        Pipeline("pipe", tmp_path / "lake", MemorySource({"rows": pa.schema([("id", pa.int64())])}), layouts=add)


FILES_PIPELINE = """
[pipeline]
name = "pipe"
lake = "lake"
engine = "local"

[source]
kind = "files"
path = "{inbox}"
format = "jsonl"
columns = {{ id = "int64", name = "string" }}

[outputs.rows]
partition_by = ["_into_date"]
schema_evolution = "{mode}"
"""


def test_reclock_start_under_fail_prints_one_line_naming_the_field_then_add_goes_on(tmp_path, capsys):
    jsonl(tmp_path / "in" / "1.jsonl", OLD + NEW)
    config = tmp_path / "p.toml"
    config.write_text(FILES_PIPELINE.format(mode="fail", inbox=tmp_path / "in"))
    lake = str(tmp_path / "lake")
    assert main(["create", str(config)]) == 0
    capsys.readouterr()
    assert main(["--lake", lake, "start", "pipe", "--max-seconds", "60"]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "output 'rows': new field 'color'" in err[0], err
    assert not replay(table_path(tmp_path)).labels
    config.write_text(FILES_PIPELINE.format(mode="add", inbox=tmp_path / "in"))
    assert main(["create", "--replace", str(config)]) == 0
    run_until(  # files never end: it runs until the five rows landed, then stops
        Lake.at(lake), "pipe", lambda: len(list(replay(table_path(tmp_path)).rows())) >= 5, "the five rows"
    )
    state = replay(table_path(tmp_path))
    assert state.partition_columns == ["_into_date"]
    assert sorted((r["id"], r["color"]) for r in state.rows()) == [
        (1, None),
        (2, None),
        (3, "red"),
        (4, "7"),
        (5, None),
    ]


def test_an_output_may_change_its_policy_and_keeps_every_column_it_had(tmp_path):
    clock = two_batches(tmp_path, "add")  # color and size added
    for i, mode in enumerate(["none", "rescue", "none", "add"], start=3):
        clock.ms = i * 1_000_000
        jsonl(tmp_path / "in" / f"{i}.jsonl", [{"id": 10 * i, "name": mode, "color": f"c{i}", "shape": "round"}])
        pipeline(tmp_path, mode, clock).step()
    state = replay(table_path(tmp_path))
    assert state.column_names[:2] == ["id", "name"]
    rows = {r["id"]: (r["color"], r["_rescued"], r.get("shape")) for r in state.rows()}
    assert rows[3] == ("red", None, None) and rows[1] == (None, None, None)
    assert rows[30] == (None, None, None)  # none: ignored
    assert rows[40][0] is None and json.loads(rows[40][1]) == {"color": "c4", "shape": "round"}  # rescue
    assert rows[50] == (None, None, None)
    assert rows[60] == ("c6", None, "round")  # add again: color fills, shape is new


class FieldsSource(MemorySource):
    """A memory source whose records may bring fields their output lacks, handed on as a decoder
    does (one JSON object per record in ``_unknown_fields``) once the runtime asks."""

    keeping: frozenset[str] = frozenset()

    def keep_unknown_fields(self, outputs):
        self.keeping = frozenset(outputs)

    def read(self, split):
        records = self._log.get(split.partition, [])[split.start : split.end]
        for output, batch in super().read(split):
            if output in self.keeping:
                declared = set(self._schemas[output].names)
                extras = [
                    {k: v for k, v in row.items() if k not in declared} for name, row in records if name == output
                ]
                unknown = pa.array([json.dumps(e) if e else None for e in extras], pa.string())
                batch = batch.append_column(UNKNOWN_FIELDS, unknown)
            yield output, batch


def test_add_on_an_upsert_output_merges_the_new_column_in_the_batchs_commit(tmp_path):
    """An upsert output under ``add``: the MERGE adds the column in its one labelled commit; rows
    it does not write read null; a record whose declared values are null but that brings a new
    field is an upsert, not a delete (a record of nulls only is)."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    source = FieldsSource({"rows": Output("rows", schema, ("id",), "upsert")})
    layouts = {"rows": OutputLayout(schema_evolution="add")}
    clock = FakeClock(T1)
    source.append(0, "rows", [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 4, "name": "d"}])
    Pipeline("pipe", tmp_path / "lake", source, now=clock, layouts=layouts).step()
    clock.ms = T2
    source.append(
        0,
        "rows",
        [
            {"id": 1, "name": None, "color": "red"},
            {"id": 2, "name": "B"},
            {"id": 3, "name": "c", "color": 7},
            {"id": 4, "name": None},
        ],
    )
    Pipeline("pipe", tmp_path / "lake", source, now=clock, layouts=layouts).step()
    state = replay(table_path(tmp_path))
    got = {r["id"]: (r["name"], r["color"]) for r in state.rows()}
    assert got == {1: (None, "red"), 2: ("B", None), 3: ("c", "7")}
    versions = sorted((table_path(tmp_path) / "_delta_log").glob("*.json"))
    last = [json.loads(line) for line in versions[-1].read_text().splitlines()]
    assert any("metaData" in a for a in last) and any("txn" in a and a["txn"]["version"] == T2 for a in last)
