"""Status tables and metrics of a real job run: they add up to what the outputs hold."""

from __future__ import annotations

import os
import urllib.request
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families as parse

from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.job.metrics import Metrics
from reclock.job.status import read_status
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.persist.status_tables import read_status_table
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.sources.base import ERRORS
from reclock.testing import FakeClock, MemorySource
from tests.waiting import PATIENCE_S


def run_generator_job(tmp_path, outputs=None, **pipeline):
    config = parse_config(
        {
            "pipeline": {
                "name": "auctions",
                "lake": str(tmp_path / "lake"),
                "engine": "local",
                "max_batch": 7_000,
                **pipeline,
            },
            "source": {"kind": "generator", "partitions": 3, "limit": 30_000, "max_split_offsets": 4_000},
            **({"outputs": outputs} if outputs else {}),
        }
    )
    lifecycle.create(config)
    lake = Lake.at(tmp_path / "lake")
    return lake, lifecycle.run(lake, "auctions")


def test_batch_rows_add_up_to_the_output_rows_and_offsets_match_lineage(tmp_path):
    lake, _ = run_generator_job(tmp_path)
    batches = read_status_table(lake, "batches", "auctions")
    assert set(batches.column("state").to_pylist()) <= {"In Progress", "Succeeded", "No Data"}
    batches = batches.filter(pc.field("state") != "In Progress")  # announced at plan time: no rows yet
    outputs = [o for o in lake.outputs("auctions") if o != ERRORS]
    tables = [read_table(DeltaTable(str(lake.output_path("auctions", o)))) for o in outputs]
    assert pc.sum(batches.column("rows")).as_py() == sum(t.num_rows for t in tables) == 30_000
    lineage = pa.concat_tables([t.select(["_partition", "_offset"]) for t in tables])
    spans = defaultdict(list)
    for row in batches.to_pylist():
        if row["partition"]:
            spans[row["partition"]].append((row["earliest_offset"], row["latest_offset"]))
    for partition, ranges in spans.items():
        offsets = sorted(lineage.filter(pc.equal(lineage["_partition"], partition))["_offset"].to_pylist())
        assert min(lo for lo, _ in ranges) == offsets[0] and max(hi for _, hi in ranges) == offsets[-1]
        assert sum(hi - lo + 1 for lo, hi in ranges) == len(offsets)  # batches tile the partition, no overlap


def test_pipelines_table_records_running_then_stopped(tmp_path):
    lake, _ = run_generator_job(tmp_path)
    states = read_status_table(lake, "pipelines", "auctions").column("state").to_pylist()
    assert states[0] == "Running" and states[-1] == "Stopped"


def test_offsets_table_shows_everything_loaded_at_the_end(tmp_path):
    lake, _ = run_generator_job(tmp_path)
    latest = {}
    for row in read_status_table(lake, "offsets", "auctions").to_pylist():
        latest[row["partition"]] = row
    assert {p: (r["earliest"], r["latest"], r["latest_loaded"]) for p, r in latest.items()} == {
        "gen-0": (0, 10_000, 10_000),
        "gen-1": (0, 10_000, 10_000),
        "gen-2": (0, 10_000, 10_000),
    }


def test_secrets_in_the_definition_never_reach_the_status_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("DEMO_TOKEN", "hunter2-secret-value")
    config = parse_config(
        {
            "pipeline": {"name": "p", "lake": str(tmp_path / "lake"), "engine": "local"},
            "source": {"kind": "generator", "limit": 100, "seed": 1},
        }
    )
    lifecycle.create(config)
    lifecycle.run(Lake.at(tmp_path / "lake"), "p")
    from reclock.job.secrets import redacted

    assert redacted({"sasl_plain_password": "x", "nested": {"api_token": "y"}, "rate": 5}) == {
        "sasl_plain_password": "***",
        "nested": {"api_token": "***"},
        "rate": 5,
    }
    status = read_status_table(Lake.at(tmp_path / "lake"), "pipelines", "p")
    assert "hunter2" not in str(status.to_pylist())


def test_metrics_endpoint_serves_prometheus_text(tmp_path):
    source = MemorySource({"clicks": pa.schema([("user", pa.int64())])})
    source.append(0, "clicks", [{"user": 1}, {"user": 2}])
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000))
    metrics = Metrics(pipeline)
    metrics.observe(pipeline.step())
    port = metrics.serve(0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S).read().decode()
    finally:
        metrics.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in parse(body) for s in f.samples}
    assert samples[("reclock_rows_total", (("output", "clicks"), ("pipeline", "p")))] == 2
    assert samples[("reclock_batches_total", (("pipeline", "p"), ("state", "Succeeded")))] == 1
    assert samples[("reclock_lag_offsets", (("pipeline", "p"),))] == 0


def test_batch_rows_a_killed_job_never_flushed_are_restored_from_the_lake_on_start(tmp_path):
    """A SIGKILL loses the status rows of the last second; the next start derives them again."""
    lake, _ = run_generator_job(tmp_path)
    recorded = read_status_table(lake, "batches", "auctions").to_pylist()

    def spans(rows, ids):
        out = defaultdict(lambda: [None, None])
        for r in rows:
            if r["batch_id"] in ids and r["partition"] is not None:
                span = out[(r["batch_id"], r["partition"])]
                span[0] = r["earliest_offset"] if span[0] is None else min(span[0], r["earliest_offset"])
                span[1] = r["latest_offset"] if span[1] is None else max(span[1], r["latest_offset"])
        return dict(out)

    ids = sorted({r["batch_id"] for r in recorded})
    lost = set(ids[:1] + ids[-2:])  # the very first batch, and the last two as a kill would lose them
    DeltaTable(str(lake.root / "_status" / "batches")).delete(f"batch_id IN ({', '.join(map(str, lost))})")
    assert not spans(read_status_table(lake, "batches", "auctions").to_pylist(), lost)

    lifecycle.run(lake, "auctions")  # finished already: it only starts, restores and stops

    restored = [r for r in read_status_table(lake, "batches", "auctions").to_pylist() if r["batch_id"] in lost]
    assert spans(restored, lost) == spans(recorded, lost)
    states = {(r["batch_id"], r["state"]) for r in restored}
    ended = {(r["batch_id"], r["state"]) for r in recorded if r["batch_id"] in lost and r["state"] != "In Progress"}
    assert states == ended  # outcomes are restored; that a finished batch was once in progress is not
    assert all(r["rows"] is None and r["duration_ms"] is None for r in restored)  # never measured: not made up
    again = read_status_table(lake, "batches", "auctions").num_rows
    lifecycle.run(lake, "auctions")
    assert read_status_table(lake, "batches", "auctions").num_rows == again  # nothing restored twice


def test_a_restored_batch_row_says_how_many_rows_its_transforms_filtered(tmp_path):
    """produced = output + filtered + errors holds after a SIGKILL too: the rows a killed job never
    flushed are restored with ``filtered`` from the batch's commits, also where only the batch's
    In Progress row had reached the table."""
    outputs = {"bids": {"sql": "SELECT auction, price FROM input WHERE price > 5000"}}
    lake, _ = run_generator_job(tmp_path, outputs=outputs)
    recorded = read_status_table(lake, "batches", "auctions").to_pylist()
    finished = [r for r in recorded if r["state"] != "In Progress"]
    total = sum(r["filtered"] or 0 for r in finished)
    bids = read_table(DeltaTable(str(lake.output_path("auctions", "bids"))))
    assert total > 0 and bids.num_rows + total == 30_000 * 46 // 50  # every bid landed or filtered
    ids = sorted({r["batch_id"] for r in recorded})
    lost = set(ids[1:3] + ids[-2:])
    ended = ", ".join(map(str, sorted(lost)))
    DeltaTable(str(lake.root / "_status" / "batches")).delete(f"batch_id IN ({ended}) AND state <> 'In Progress'")

    lifecycle.run(lake, "auctions")  # finished already: it only starts, restores and stops

    rows = [r for r in read_status_table(lake, "batches", "auctions").to_pylist() if r["state"] != "In Progress"]
    assert {r["batch_id"] for r in rows} == {r["batch_id"] for r in finished}  # In Progress is not an end
    by_batch = defaultdict(int)
    for r in rows:
        by_batch[r["batch_id"]] += r["filtered"] or 0
    assert all(by_batch[b] == sum(r["filtered"] or 0 for r in finished if r["batch_id"] == b) for b in lost)
    assert sum(by_batch.values()) == total


def test_a_starting_job_says_starting_before_its_data_plane_is_up(tmp_path, monkeypatch):
    """A killed run's ``running`` snapshot must not be what readers see while Spark starts."""
    lake, _ = run_generator_job(tmp_path)
    lake.status_path("auctions").write_text('{"pipeline": "auctions", "health": "running", "updated_ms": 0}')
    seen = []

    def data_plane(config, source):
        seen.append(read_status(lake, "auctions"))
        return LocalDataPlane()

    monkeypatch.setattr(lifecycle, "data_plane", data_plane)
    lifecycle.run(lake, "auctions")
    assert seen[0]["health"] == "starting" and seen[0]["pid"] == os.getpid()


def test_offsets_rows_carry_the_sources_upper_at_the_probe_so_lag_has_a_history(tmp_path):
    """``source_latest`` is how far the source was when the batch was probed: with max_batch
    capping each binding at 7,000 of the 30,000 offsets, the first batch leaves 23,000 behind."""
    lake, _ = run_generator_job(tmp_path)
    rows = read_status_table(lake, "offsets", "auctions").to_pylist()
    first = [r for r in rows if r["time_ms"] == rows[0]["time_ms"]]
    assert {r["partition"]: r["source_latest"] for r in first} == {"gen-0": 10_000, "gen-1": 10_000, "gen-2": 10_000}
    assert sum(r["source_latest"] - r["latest_loaded"] for r in first) == 30_000 - 7_000
    last = {r["partition"]: r for r in rows}
    assert all(r["source_latest"] in (None, r["latest_loaded"]) for r in last.values())  # none left at the end


def test_a_batch_that_maintained_the_tables_says_how_long_it_took(tmp_path):
    """``maintenance_ms``: the page stacks it on the batch's phases; it is the pass status.json reports."""
    config = parse_config(
        {
            "pipeline": {"name": "kept", "lake": str(tmp_path / "lake"), "engine": "local", "max_batch": 7_000},
            "source": {"kind": "generator", "partitions": 3, "limit": 30_000},
            "maintenance": {"every": 2},
        }
    )
    lifecycle.create(config)
    lake = Lake.at(tmp_path / "lake")
    lifecycle.run(lake, "kept")
    batches = read_status_table(lake, "batches", "kept").to_pylist()
    maintained = [r for r in batches if r["maintenance_ms"] is not None]
    assert maintained and {r["state"] for r in maintained} <= {"Succeeded", "No Data"}
    assert (
        len({r["batch_id"] for r in maintained})
        == len({r["batch_id"] for r in batches if r["state"] != "In Progress"}) // 2
    )
    assert maintained[-1]["maintenance_ms"] == read_status(lake, "kept")["last_maintenance"]["duration_ms"]
