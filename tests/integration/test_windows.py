"""Acceptance 2 of issue 11: window outputs equal a batch recomputation, across a SIGKILL.

Real ``reclock start`` processes (in-driver data plane: windows are closed by the driver whatever
the plane) are SIGKILLed at a random moment and restarted. Everything is checked from outside:
the tables are read from their ``_delta_log`` by the independent reader of ``tests/faults``, the
expected windows are recomputed with polars (``group by floor(_into_ts / size)``), and each
window commit's label is read from the log's ``txn`` actions.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from reclock.job.status import read_status
from reclock.persist.lake import Lake
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Settings
from reclock.runtime.windows import Window
from reclock.testing import FakeClock, MemorySource
from tests import zygote
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, label_of, read_rows
from tests.integration.helpers import files_pipeline_config, write_config, write_numbered_csvs
from tests.integration.s3 import mirror
from tests.waiting import PATIENCE_S, run_until

BY_AUCTION = {
    "name": "by_auction",
    "output": "bids",
    "size_ms": 1000,
    "group_by": ["auction"],
    "aggregates": {
        "bids": "count(*)",
        "total": "sum(price)",
        "low": "min(price)",
        "high": "max(price)",
        "mean": "avg(price)",
        "first_bidder": "first(bidder)",
        "last_bidder": "last(bidder)",
    },
}
BY_CHANNEL = {
    "name": "by_channel",
    "output": "bids",
    "size_ms": 700,
    "group_by": ["channel"],
    "aggregates": {"bids": "count(*)", "last_price": "last(price)"},
}
POLARS = {
    "count": lambda c: pl.len(),
    "sum": lambda c: pl.col(c).sum(),
    "min": lambda c: pl.col(c).min(),
    "max": lambda c: pl.col(c).max(),
    "avg": lambda c: pl.col(c).mean(),
    "first": lambda c: pl.col(c).first(),
    "last": lambda c: pl.col(c).last(),
}


def with_windows(config: Path, *windows: dict) -> Path:
    """Append ``[[windows]]`` tables to a TOML file written by ``write_config``."""
    text = config.read_text()
    for w in windows:
        text += "\n[[windows]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in w.items() if k != "aggregates")
        text += "[windows.aggregates]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in w["aggregates"].items())
    config.write_text(text)
    return config


def start_job(lake: Path, name: str) -> subprocess.Popen:
    return zygote.popen(
        ["--lake", str(lake), "start", name],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def window_commits(table: Path, app_id: str) -> list[tuple[int, list[dict]]]:
    """Per commit of a window table that carries its label, in log order: the label and the rows
    of the files it added (read by hand from the JSON commits and the parquet files)."""
    import pyarrow.parquet as pq

    out = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
        labels = [a["txn"]["version"] for a in actions if "txn" in a and a["txn"]["appId"] == app_id]
        if labels:
            files = [table / a["add"]["path"] for a in actions if "add" in a]
            out.append((labels[0], [row for f in files for row in pq.read_table(f).to_pylist()]))
    return out


def recompute(output_rows: pl.DataFrame, window: dict, upper: int) -> list[dict]:
    """The batch recomputation: group by floor(_into_ts / size) and the group columns, in
    (_into_ts, _partition, _offset) order, of every window ending at or below ``upper``."""
    size = window["size_ms"]
    aggregates = []
    for name, text in window["aggregates"].items():
        function, column = text.rstrip(")").split("(")
        aggregates.append(POLARS[function](column).alias(name))
    start = (pl.col("_into_ts") // size * size).alias("_window_start")
    frame = (
        output_rows.sort(["_into_ts", "_partition", "_offset"])
        .with_columns(start)
        .filter(pl.col("_window_start") + size <= upper)
        .group_by(["_window_start", *window["group_by"]], maintain_order=True)
        .agg(aggregates)
    )
    return frame.to_dicts()


def assert_windows_equal(got: list[dict], want: list[dict], window: dict) -> None:
    key = ["_window_start", *window["group_by"]]

    def by_key(rows: list[dict]) -> dict[tuple, dict]:
        return {tuple(r[k] for k in key): r for r in rows}

    got_by, want_by = by_key(got), by_key(want)
    assert len(got_by) == len(got), f"{window['name']}: a window and group emitted twice"
    assert got_by.keys() == want_by.keys(), f"{window['name']}: {len(got_by.keys() ^ want_by.keys())} groups differ"
    for k, row in want_by.items():
        for name, value in row.items():
            mine = got_by[k][name]
            ok = math.isclose(mine, value, rel_tol=1e-12) if isinstance(value, float) else mine == value
            assert ok, f"{window['name']} {k}: {name} is {mine}, the recomputation says {value}"


def check_windows(lake: Path, pipeline: str, output: str, windows: list[dict], *, finished: bool = False) -> int:
    """Every window closed by the output's final upper is in its table once, as recomputed; once
    the pipeline is ``finished``, the window holding its last into time too."""
    output_log = DeltaLog(lake / pipeline / "outputs" / output).refresh()
    upper = label_of(output_log, f"reclock/{pipeline}/{output}") + 1
    rows = pl.from_arrow(read_rows(output_log))
    for window in windows:
        table = lake / pipeline / "windows" / window["name"]
        app_id = f"reclock/{pipeline}/windows/{window['name']}"
        size = window["size_ms"]
        closed = ((upper - 1) // size + 1) * size if finished else upper // size * size
        assert label_of(DeltaLog(table).refresh(), app_id) + 1 == closed, "a closed window was not emitted"
        commits = window_commits(table, app_id)
        previous = 0
        for label, added in commits:  # each commit holds exactly the windows it closed, once
            assert label + 1 > previous, "a label did not move forward"
            assert all(
                previous < r["_window_end"] <= label + 1 and r["_into_ts"] == r["_window_end"] - 1 for r in added
            )
            previous = label + 1
        got = [{k: v for k, v in r.items() if k not in ("_window_end", "_into_ts")} for _, a in commits for r in a]
        assert_windows_equal(got, recompute(rows, window, closed), window)
    return upper


@pytest.mark.usefixtures("reclock_processes")
def test_window_outputs_equal_a_batch_recomputation_across_a_sigkill_and_restart(tmp_path):
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "auctions", "lake": "lake", "engine": "local", "batch_interval": 0.1, "idle_interval": 0.5},
        source={"kind": "generator", "partitions": 3, "rate": 4000},
    )
    assert reclock_in_process("create", str(with_windows(config, BY_AUCTION, BY_CHANNEL))).returncode == 0
    job = start_job(lake, "auctions")
    labels = lake / "auctions" / "windows" / "by_auction"
    wait_for(lambda: len(window_commits(labels, "reclock/auctions/windows/by_auction")) >= 2, 120, "windows")
    time.sleep(random.uniform(0, 1.5))
    os.killpg(job.pid, signal.SIGKILL)  # anywhere: mid-batch, mid-window, between two commits
    job.wait(timeout=PATIENCE_S)

    def output_upper() -> int:
        return label_of(DeltaLog(lake / "auctions" / "outputs" / "bids").refresh(), "reclock/auctions/bids") or 0

    killed_at = output_upper()
    run_until(  # an endless source: the restart runs until it covered two more windows of each size
        Lake.at(str(lake)),
        "auctions",
        lambda: output_upper() > max(3000, killed_at + 2000),
        "two windows after the kill",
    )
    upper = check_windows(lake, "auctions", "bids", [BY_AUCTION, BY_CHANNEL])
    assert upper > 3000  # the run covered several windows of each size


@pytest.mark.usefixtures("reclock_processes")
def test_an_idle_files_pipeline_still_emits_its_last_window_once_the_frontier_passes_its_end(tmp_path):
    lake = tmp_path / "lake"
    window = {
        "name": "by_name",
        "output": "rows",
        "size_ms": 2000,
        "group_by": ["name"],
        "aggregates": {"n": "count(*)", "ids": "sum(id)", "first_id": "first(id)"},
    }
    write_numbered_csvs(tmp_path / "in", 3, lambda f: 50 + f)
    config = files_pipeline_config(
        tmp_path / "p.toml", tmp_path / "in", pipeline={"batch_interval": 0.1, "idle_interval": 0.5}
    )
    assert reclock_in_process("create", str(with_windows(config, window))).returncode == 0
    job = start_job(lake, "ingest")
    output = lake / "ingest" / "outputs" / "rows"
    table = lake / "ingest" / "windows" / "by_name"

    def loaded() -> bool:
        rows = read_rows(DeltaLog(output).refresh())
        return rows is not None and rows.num_rows == 50 + 51 + 52

    wait_for(loaded, 120, "the files to land")
    last = max(read_rows(DeltaLog(output).refresh()).column("_into_ts").to_pylist())
    end = last // 2000 * 2000 + 2000
    # No file arrives any more: only time-only bindings move the output's upper past the window's end.
    wait_for(
        lambda: (label_of(DeltaLog(table).refresh(), "reclock/ingest/windows/by_name") or 0) + 1 >= end, 60, "idle"
    )
    assert job.poll() is None, "the files source never finishes: the window closed while the job ran"
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=PATIENCE_S)

    batches = read_status(Lake.at(str(lake)), "ingest")["batches"]
    run_until(  # the files source never finishes: the restart runs until it bound time again
        Lake.at(str(lake)), "ingest", lambda: read_status(Lake.at(str(lake)), "ingest")["batches"] > batches, "a batch"
    )
    check_windows(lake, "ingest", "rows", [window])
    rows = [r for _, added in window_commits(table, "reclock/ingest/windows/by_name") for r in added]
    assert sum(r["n"] for r in rows) == 50 + 51 + 52  # every row in exactly one emitted window


def test_windows_of_a_pipeline_in_an_s3_lake_are_read_and_committed_through_the_store(s3_server, tmp_path):
    import pyarrow as pa

    bucket = s3_server.bucket()
    lake = Lake.at(f"s3://{bucket}/lake", s3_server.storage_options)
    aggregates = {"n": "count(*)", "top": "max(v)"}
    window = {"name": "per_g", "output": "rows", "size_ms": 1000, "group_by": ["g"], "aggregates": aggregates}
    source = MemorySource({"rows": pa.schema([("g", pa.string()), ("v", pa.int64())])})
    clock = FakeClock(1000)
    spec = Window("per_g", "rows", 1000, aggregates, ("g",))
    pipeline = Pipeline("p", lake, source, now=clock, settings=Settings(idle_interval=0.1), windows=[spec])
    for ms in (1000, 1500, 2200, 3100):
        clock.ms = ms
        source.append(ms % 2, "rows", [{"g": "a", "v": ms}, {"g": "b", "v": -ms}])
        pipeline.step()
    mirror(s3_server, bucket, "lake/p", tmp_path / "p")
    assert check_windows(tmp_path, "p", "rows", [window]) == 3101  # closed: [1000, 2000) and [2000, 3000)


def test_a_bounded_generator_that_finishes_emits_its_last_partial_window_too(tmp_path):
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "bounded", "lake": "lake", "engine": "local", "batch_interval": 0.1, "idle_interval": 0.5},
        source={"kind": "generator", "partitions": 2, "rate": 3000, "limit": 6000},
    )
    assert reclock_in_process("create", str(with_windows(config, BY_AUCTION))).returncode == 0
    done = reclock_in_process("--lake", str(lake), "start", "bounded")  # ends by itself, finished
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((lake / "bounded" / "status.json").read_text())["finished"]
    check_windows(lake, "bounded", "bids", [BY_AUCTION], finished=True)
    rows = [
        r
        for _, added in window_commits(
            lake / "bounded" / "windows" / "by_auction", "reclock/bounded/windows/by_auction"
        )
        for r in added
    ]
    assert sum(r["bids"] for r in rows) == 6000 * 46 // 50  # every bid of the generator, in exactly one window
