"""Acceptance 1 of issue 11: a transform that divides by a column that is zero on some rows.

A real ``reclock start`` process over CSV files, on the in-driver plane and on Spark (every batch
in Spark tasks). Good rows land, rows whose division fails are in ``_errors`` at their coordinates,
rows the ``WHERE`` drops are counted in the ``batches`` status table, and produced = output +
filtered + errors exactly. Everything is checked from outside (``tests.faults.reader``: the Delta
logs and pyarrow) against ground truth this test computes from the files it wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane, SparkDataPlane
from reclock.runtime.shaping import Shape
from reclock.sources.generator import BIDS, GeneratorSource
from reclock.testing import FakeClock
from tests import zygote
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import expected_generator_offsets, reclock_cli, write_config
from tests.waiting import PATIENCE_S

SQL = "SELECT num, num / den AS ratio FROM input WHERE num >= 0"


def write_fractions(folder: Path, files: int = 3, rows: int = 300) -> dict[tuple[str, int], tuple[int, int]]:
    """CSV files of ``num,den``; ``den`` is zero on every seventh row, ``num`` negative on some.
    Returns ``(file, byte offset) -> (num, den)``: a CSV record's offset is where its line starts."""
    folder.mkdir()
    truth = {}
    for f in range(files):
        name = f"f{f}.csv"
        text = "num,den\n"
        for i in range(rows):
            num, den = (i * 37 + f) % 50 - 10, i % 7
            truth[(name, len(text.encode()))] = (num, den)
            text += f"{num},{den}\n"
        (folder / name).write_text(text)
    return truth


def outside(lake: Path, *parts: str) -> list[dict]:
    table = read_rows(DeltaLog(lake.joinpath(*parts)).refresh())
    return table.to_pylist() if table is not None else []


def coordinates(row: dict) -> tuple[str, int]:
    return json.loads(row["_partition"])[0], row["_offset"]


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.spark)])
@pytest.mark.usefixtures("reclock_processes")
def test_a_division_by_zero_lands_good_rows_and_sends_bad_ones_to_errors_exactly(tmp_path, engine):
    truth = write_fractions(tmp_path / "in")
    good = {k: num // den for k, (num, den) in truth.items() if num >= 0 and den != 0}
    bad = {k for k, (num, den) in truth.items() if num >= 0 and den == 0}
    dropped = sum(1 for num, _ in truth.values() if num < 0)
    assert good and bad and dropped  # the files exercise all three ways
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "frac", "lake": "lake", "engine": engine, "batch_interval": 0.1},
        spark={"master": "local[1]", "background_start": False, "small_batch_offsets": 0},
        source={
            "kind": "files",
            "path": str(tmp_path / "in"),
            "max_files_per_batch": 1,
            "columns": {"num": "int64", "den": "int64"},
        },
        outputs={"rows": {"sql": SQL}},
    )
    created = reclock_in_process("create", str(config))
    assert created.returncode == 0, created.stderr
    job = zygote.popen(
        ["--lake", str(lake), "start", "frac"],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 480
        landed = 0
        while time.monotonic() < deadline and job.poll() is None and landed < len(good) + len(bad):
            time.sleep(0.5)
            landed = len(outside(lake, "frac", "outputs", "rows")) + len(outside(lake, "frac", "outputs", "_errors"))
        assert reclock_in_process("--lake", str(lake), "stop", "frac", "--wait", "120").returncode == 0
        _, stderr = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr[-3000:]

    rows = outside(lake, "frac", "outputs", "rows")
    errors = outside(lake, "frac", "outputs", "_errors")
    assert {coordinates(r): r["ratio"] for r in rows} == good
    assert len(rows) == len(good)  # no duplicates
    assert {coordinates(r) for r in errors} == bad and len(errors) == len(bad)
    assert {r["kind"] for r in errors} == {"transform"}
    assert all("Divide by zero" in r["message"] and "'rows'" in r["message"] for r in errors)
    assert all(json.loads(r["raw"])["den"] == 0 for r in errors)
    remap = Remap.read(lake / "frac" / "remap")
    assert all(remap.stamp_holds(r["_partition"], r["_offset"], r["_into_ts"]) for r in rows + errors)

    batches = [r for r in outside(lake, "_status", "batches") if r["pipeline"] == "frac" and r["state"] == "Succeeded"]
    filtered = sum(r["filtered"] or 0 for r in batches)
    assert filtered == dropped
    assert len(truth) == len(rows) + filtered + len(errors)  # produced = output + filtered + errors


@pytest.mark.usefixtures("reclock_processes")  # a job left running by a failed wait is killed
def test_produced_equals_output_plus_filtered_plus_errors_after_a_sigkill(tmp_path):
    """The job is killed right after a batch's commits, before its status rows are flushed (about
    once a second): the next start rebuilds them from the lake, ``filtered`` included."""
    truth = write_fractions(tmp_path / "in", files=6, rows=200)
    dropped = sum(1 for num, _ in truth.values() if num < 0)
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "frac", "lake": "lake", "engine": "local", "batch_interval": 0.1},
        source={
            "kind": "files",
            "path": str(tmp_path / "in"),
            "max_files_per_batch": 1,
            "columns": {"num": "int64", "den": "int64"},
        },
        outputs={"rows": {"sql": SQL}},
    )
    assert reclock_cli("create", str(config)).returncode == 0
    job = zygote.popen(
        ["--lake", str(lake), "start", "frac"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        output = DeltaLog(lake / "frac" / "outputs" / "rows")
        deadline = time.monotonic() + 120
        while output.refresh().version < 2 and time.monotonic() < deadline:  # created, then a batch
            time.sleep(0.01)
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        job.wait(timeout=PATIENCE_S)
    # The next start runs until every file has landed (one a batch; under the suite's load five
    # seconds were not always enough), then stops cleanly; a duplicate ends the wait too, and fails.
    stderr = tmp_path / "restart.stderr"
    with open(stderr, "wb") as err:
        job = zygote.popen(
            ["--lake", str(lake), "start", "frac"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    landed = 0
    while landed < len(truth):
        assert job.poll() is None, stderr.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{landed} of {len(truth)} rows landed in 120 s"
        time.sleep(0.2)
        landed = sum(len(outside(lake, "frac", "outputs", o)) for o in ("rows", "_errors")) + dropped
    assert reclock_cli("--lake", str(lake), "stop", "frac", "--wait", "60").returncode == 0
    assert job.wait(timeout=60) == 0, stderr.read_text()[-3000:]

    rows = outside(lake, "frac", "outputs", "rows")
    errors = outside(lake, "frac", "outputs", "_errors")
    assert len(rows) + len(errors) + dropped == len(truth)
    batches = [r for r in outside(lake, "_status", "batches") if r["pipeline"] == "frac" and r["state"] == "Succeeded"]
    assert sum(r["filtered"] or 0 for r in batches) == dropped  # produced = output + filtered + errors


def cheap(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A Python transform shipped to Spark's workers: the bids under 10.00, with their lineage."""
    return batch.filter(pc.less(batch.column("price"), 1_000)).select(["_partition", "_offset", "price"])


def shaped_run(lake: Path, plane) -> tuple[dict[str, list[dict]], int]:
    shapes = [
        Shape("bids", sql="SELECT auction, price / (bidder % 5) AS share FROM input WHERE price > 5000"),
        Shape("cheap_bids", input="bids", function=cheap),
    ]
    source = GeneratorSource(partitions=2, limit=6_000, max_split_offsets=1_000)
    clock = FakeClock(0)
    pipeline = Pipeline("gen", lake, source, data_plane=plane, now=clock, shapes=shapes)
    filtered = 0
    while not pipeline.finished:
        clock.advance(1_000)
        filtered += sum(r.filtered for r in pipeline.step().results)
    tables = {}
    for output in ("bids", "cheap_bids", "_errors"):
        rows = outside(lake, "gen", "outputs", output)
        tables[output] = sorted(rows, key=lambda r: (r["_partition"], r["_offset"]))
    return tables, filtered


@pytest.mark.spark
def test_transforms_and_routes_land_the_same_rows_on_spark_as_in_the_driver(spark, tmp_path):
    """SQL and a Python function, one record routed into two outputs: Spark tasks and the driver
    write identical rows, errors and filtered counts (the function is pickled to the workers)."""
    on_spark, filtered = shaped_run(tmp_path / "spark", SparkDataPlane(spark, tasks_per_core=2))
    in_driver, filtered_locally = shaped_run(tmp_path / "local", LocalDataPlane())
    assert on_spark == in_driver and filtered == filtered_locally
    assert all(on_spark[name] for name in on_spark)  # every way was exercised
    bids = {(r["_partition"], r["_offset"]): r for r in on_spark["bids"]}
    errors = {(r["_partition"], r["_offset"]) for r in on_spark["_errors"]}
    cheap_rows = {(r["_partition"], r["_offset"]) for r in on_spark["cheap_bids"]}
    assert not bids.keys() & errors and not cheap_rows & bids.keys()  # price > 5000 vs < 1000
    assert all(json.loads(r["raw"])["bidder"] % 5 == 0 for r in on_spark["_errors"])
    produced = expected_generator_offsets(2, 6_000)[BIDS]  # each bid is produced once per route
    assert bids.keys() | errors | cheap_rows <= produced
    assert len(bids) + len(errors) + len(cheap_rows) + filtered == 2 * len(produced)
