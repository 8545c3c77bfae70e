"""Every table reclock creates on a local disk checkpoints every 10 versions (``reclock.persist.post_commit``).

delta-rs replays every log entry since the last checkpoint on each commit and each read-back, so
at its default interval of 100 a commit's CPU grew from one checkpoint to the next (3.5 ms to
17.6 ms); the interval is a table property, written in the table's first commit. Read here from
the ``_delta_log`` itself (JSON and the checkpoint files on disk), not through delta-rs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from reclock.persist.lake import Lake
from reclock.persist.maintenance import set_retention
from reclock.persist.post_commit import table_properties
from reclock.persist.status_tables import StatusTables
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Maintenance
from reclock.testing import FakeClock, MemorySource


def _configuration(table: Path, version: int = 0) -> dict[str, str]:
    """The table properties of the ``metaData`` action that ``version``'s commit file holds."""
    lines = (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    (meta,) = [json.loads(line)["metaData"] for line in lines if "metaData" in json.loads(line)]
    return meta["configuration"]


def _checkpoints(table: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (table / "_delta_log").glob("*.checkpoint.parquet"))


def test_every_table_of_a_pipeline_and_its_status_is_created_with_a_checkpoint_every_ten_versions(tmp_path):
    lake = Lake.at(tmp_path)
    source = MemorySource({"clicks": pa.schema([("user", pa.int64())])})
    clock = FakeClock(1_000)
    pipeline = Pipeline("pipe", lake, source, now=clock, maintenance=Maintenance(every=0))
    for i in range(25):
        clock.ms += 1_000
        source.append(i % 2, "clicks", [{"user": i}])
        pipeline.step()
    status = StatusTables(lake, flush_interval=3600)
    status.append("batches", [{"pipeline": "pipe", "batch_id": 1, "state": "Succeeded"}])
    status.close()

    tables = {
        "remap": lake.remap_path("pipe"),
        **{name: lake.output_path("pipe", name) for name in pipeline.sinks},
        "status batches": lake.status_table_path("batches"),
    }
    assert set(tables) >= {"remap", "clicks", "_errors", "status batches"}
    for name, path in tables.items():
        assert _configuration(Path(path)).get("delta.checkpointInterval") == "10", name
    # the batches' own commits checkpoint at versions 9 and 19 (delta-rs's rule at an interval of 10)
    for name in ("remap", "clicks"):
        assert _checkpoints(Path(tables[name]))[:2] == [9, 19], name


def test_maintenance_gives_an_older_table_the_interval_and_keeps_one_a_table_has(tmp_path):
    older, own = tmp_path / "older", tmp_path / "own"
    schema = pa.schema([("n", pa.int64())])
    DeltaTable.create(str(older), schema=schema)  # as reclock created tables before: no interval
    DeltaTable.create(str(own), schema=schema, configuration={"delta.checkpointInterval": "50"})

    assert set_retention(DeltaTable(str(older)), 30)
    assert set_retention(DeltaTable(str(own)), 30)
    assert not set_retention(DeltaTable(str(older)), 30), "a second pass wrote another metadata commit"
    assert _configuration(older, 1)["delta.checkpointInterval"] == "10"
    assert _configuration(own, 1)["delta.checkpointInterval"] == "50"
    assert _configuration(older, 1)["delta.logRetentionDuration"] == "interval 30 minutes"


def test_a_table_on_an_object_store_keeps_delta_rs_interval_where_checkpoints_cost_requests():
    """On S3 each checkpoint is requests (billed, 10-50 ms each): a batch of five tables listed
    their logs 15.5 times instead of 15 at an interval of 10 (``test_s3_requests.py`` bounds it)."""
    assert table_properties("s3://bucket/lake/pipe/remap") == {}
    assert table_properties("/lake/pipe/remap") == {"delta.checkpointInterval": "10"}
    assert table_properties("file:///lake/pipe/remap") == {"delta.checkpointInterval": "10"}
