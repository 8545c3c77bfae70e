"""Schema evolution on the Spark plane (issue 12, acceptance 2): executors write the parquet
files, the driver's one labelled commit carries the merged schema. A partitioned output, so the
Spark as-of read finds the partition column too. Checked by replaying the ``_delta_log`` by hand."""

from __future__ import annotations

import json

from reclock.persist.asof import read_as_of_spark
from reclock.persist.lake import Lake, sink_id
from reclock.persist.layout import OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import SparkDataPlane
from reclock.sources.files import FilesSource
from reclock.testing import FakeClock
from tests.delta_log import replay

T1, T2 = 1_795_000_000_000, 1_795_086_400_000  # two UTC days


def test_add_on_the_spark_plane_commits_the_merged_schema_with_the_rows(spark, tmp_path):
    layouts = {"rows": OutputLayout(("_into_date",), "add")}
    clock = FakeClock(T1)

    def step() -> None:
        source = FilesSource(path=str(tmp_path / "in"), format="jsonl", columns={"id": "int64"}, now=clock)
        Pipeline("p", tmp_path / "lake", source, data_plane=SparkDataPlane(spark), now=clock, layouts=layouts).step()

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(3)))
    step()
    clock.ms = T2
    (tmp_path / "in" / "2.jsonl").write_text('{"id": 3, "color": "red"}\n{"id": 4, "color": ["x"]}\n')
    step()
    state = replay(Lake.at(tmp_path / "lake").output_path("p", "rows"))
    assert state.partition_columns == ["_into_date"]
    assert {f["name"]: f["type"] for f in state.schema}["color"] == "string"
    [change] = [c for c in state.commits if any("metaData" in a for a in c) and any("txn" in a for a in c)]
    assert [a["txn"]["version"] for a in change if "txn" in a] == [T2]
    assert state.labels[sink_id("p", "rows")] == T2
    rows = {r["id"]: (r["color"], r["_into_date"]) for r in state.rows()}
    assert rows == {
        0: (None, "2026-11-18"),
        1: (None, "2026-11-18"),
        2: (None, "2026-11-18"),
        3: ("red", "2026-11-19"),
        4: ('["x"]', "2026-11-19"),
    }
    frame = read_as_of_spark(spark, tmp_path / "lake", "p", T2)["rows"]
    got = {r["id"]: (r["color"], str(r["_into_date"])) for r in frame.collect()}
    assert got == rows
