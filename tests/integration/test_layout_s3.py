"""A partitioned output that gains a column, in an S3 lake (a real S3-compatible server): the
partition folders, the merged schema and the rows are in the store, read back by replaying the
mirrored ``_delta_log`` by hand and through the as-of API."""

from __future__ import annotations

import os

from reclock.job.lifecycle import file_states
from reclock.persist.asof import read_as_of, readable_upper
from reclock.persist.lake import Lake
from tests.cli import reclock_in_process
from tests.delta_log import replay
from tests.integration.helpers import files_pipeline_config
from tests.integration.s3 import mirror
from tests.waiting import run_until


def test_a_partitioned_output_gains_a_column_in_an_s3_lake(s3_server, tmp_path, monkeypatch):
    bucket = s3_server.bucket()
    lake_uri = f"s3://{bucket}/lake"
    env = {**os.environ, **s3_server.environ}
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("id,name\n1,a\n2,b\n")
    config = files_pipeline_config(tmp_path / "files.toml", folder, pipeline={"lake": lake_uri, "batch_interval": 0.05})
    config.write_text(config.read_text() + '[outputs.rows]\npartition_by = ["name"]\nschema_evolution = "add"\n')
    assert reclock_in_process("create", str(config), env=env).returncode == 0
    for key, value in s3_server.environ.items():  # the job runs in this process, until its file is loaded
        monkeypatch.setenv(key, value)

    def loaded(path: str) -> bool:  # the files source never finishes
        return any(f.path == path and f.state == "Loaded" for f in file_states(Lake.at(lake_uri), "ingest"))

    run_until(Lake.at(lake_uri), "ingest", lambda: loaded("a.csv"), "a.csv Loaded")
    (folder / "b.csv").write_text("id,name,color\n3,a,red\n4,c,\n")
    run_until(Lake.at(lake_uri), "ingest", lambda: loaded("b.csv"), "b.csv Loaded")

    copy = mirror(s3_server, bucket, "lake/ingest", tmp_path / "mirror")
    state = replay(copy / "outputs" / "rows")
    assert state.partition_columns == ["name"]
    assert {path.split("/")[0] for path in state.files} == {"name=a", "name=b", "name=c"}
    assert sorted((r["id"], r["name"], r["color"]) for r in state.rows()) == [
        (1, "a", None),
        (2, "b", None),
        (3, "a", "red"),
        (4, "c", None),
    ]
    upper = readable_upper(lake_uri, "ingest", storage_options=s3_server.storage_options)
    cut = read_as_of(lake_uri, "ingest", upper - 1, storage_options=s3_server.storage_options)["rows"]
    assert sorted(zip(cut["id"].to_pylist(), cut["name"].to_pylist(), cut["color"].to_pylist(), strict=True)) == [
        (1, "a", None),
        (2, "b", None),
        (3, "a", "red"),
        (4, "c", None),
    ]
