"""A files pipeline end to end: SingleStore's batch semantics on real files, job processes and Delta tables.

No Spark and no broker, but real ``reclock start`` processes (one is SIGKILLed), so these live with
the integration tests and keep the unit suite fast.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from reclock.cli.main import main
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.persist.status_tables import read_status_table
from tests import zygote
from tests.integration.helpers import files_pipeline_config, write_numbered_csvs
from tests.waiting import PATIENCE_S, run_until


def config(tmp_path: Path, *, stop_on_error: bool, files_per_batch: int = 2, **pipeline: object) -> Path:
    return files_pipeline_config(
        tmp_path / "files.toml",
        tmp_path / "in",
        pipeline={
            "max_retries": 2,
            "retry_backoff": 0.0,
            "batch_interval": 0.05,
            "stop_on_error": stop_on_error,
            **pipeline,
        },
        source={"max_files_per_batch": files_per_batch},
    )


def make_inputs(tmp_path: Path, *, corrupt: bool = True) -> dict[str, int]:
    """Good CSV, JSON lines and Parquet files (and a corrupt Parquet one); rows per good file."""
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    (folder / "a.csv").write_text("id,name\n" + "".join(f"{i},a{i}\n" for i in range(5)))
    (folder / "b.jsonl").write_text("".join(json.dumps({"id": 100 + i, "name": f"b{i}"}) + "\n" for i in range(4)))
    pq.write_table(
        pa.table({"id": pa.array(range(200, 203), pa.int64()), "name": ["c0", "c1", "c2"]}), folder / "c.parquet"
    )
    if corrupt:
        (folder / "d.parquet").write_bytes(b"PAR1 this is not a parquet file at all")
    return {"a.csv": 5, "b.jsonl": 4, "c.parquet": 3}


def rows(tmp_path: Path) -> list[dict]:
    lake = Lake.at(tmp_path / "lake")
    return read_table(DeltaTable(str(lake.output_path("ingest", "rows")))).to_pylist()


def per_file(tmp_path: Path) -> Counter:
    return Counter(json.loads(r["_partition"])[0] for r in rows(tmp_path))


def run(tmp_path: Path, *args: str) -> int:
    return main(["--lake", str(tmp_path / "lake"), *args])


def start_until(tmp_path: Path, condition, what: str) -> None:
    """``reclock start ingest`` until ``condition`` holds, then stopped: a files source never
    finishes, and what it lands in N seconds depends on the machine's load."""
    run_until(Lake.at(str(tmp_path / "lake")), "ingest", condition, what)


def file_states(tmp_path: Path) -> dict[str, str]:
    latest = {}
    for row in read_status_table(Lake.at(tmp_path / "lake"), "files", "ingest").to_pylist():
        latest[(row["path"], row["generation"])] = row["state"]
    return {f"{path}#{gen}": state for (path, gen), state in latest.items()}


def test_good_files_load_once_and_a_corrupt_one_is_skipped_and_listed(tmp_path, capsys):
    expected = make_inputs(tmp_path)
    assert main(["create", str(config(tmp_path, stop_on_error=False, idle_interval=0.2))]) == 0
    states = {"a.csv#0": "Loaded", "b.jsonl#0": "Loaded", "c.parquet#0": "Loaded", "d.parquet#0": "Skipped"}
    start_until(tmp_path, lambda: file_states(tmp_path) == states, "three files Loaded and d.parquet Skipped")
    assert per_file(tmp_path) == expected  # every good row exactly once, nothing of d.parquet
    assert file_states(tmp_path) == {
        "a.csv#0": "Loaded",
        "b.jsonl#0": "Loaded",
        "c.parquet#0": "Loaded",
        "d.parquet#0": "Skipped",
    }
    capsys.readouterr()
    assert run(tmp_path, "errors", "ingest", "--json") == 0
    errors = json.loads(capsys.readouterr().out)
    skipped = [e for e in errors if e["kind"] == "skipped"]
    assert len(skipped) == 1 and "d.parquet" in skipped[0]["partition"]
    attempts = [e for e in errors if e["kind"] == "batch data"]
    assert len(attempts) == 3  # the first attempt and max_retries = 2 retries, all recorded


def test_stop_on_error_fails_naming_the_file_with_nothing_of_the_batch_visible(tmp_path, capsys):
    make_inputs(tmp_path)
    assert main(["create", str(config(tmp_path, stop_on_error=True))]) == 0
    assert run(tmp_path, "start", "ingest", "--max-seconds", f"{PATIENCE_S:.0f}") == 1  # it fails, and ends
    err = capsys.readouterr().err
    assert "failed (state Error)" in err and "d.parquet" in err
    states = read_status_table(Lake.at(tmp_path / "lake"), "pipelines", "ingest").column("state").to_pylist()
    assert states[-1] == "Error"
    loaded = per_file(tmp_path)
    assert "d.parquet" not in loaded
    # The failing batch was (c.parquet, d.parquet): files are taken two per batch in discovery order.
    assert "c.parquet" not in loaded


@pytest.mark.usefixtures("reclock_processes")
def test_files_added_while_running_are_picked_up_and_drop_file_reingests_once(tmp_path):
    expected = make_inputs(tmp_path, corrupt=False)
    # One file per batch, and a look for new files every 0.2 s once the folder is drained.
    slow = config(tmp_path, stop_on_error=True, files_per_batch=1, idle_interval=0.2, batch_interval=0.2)
    assert main(["create", str(slow)]) == 0
    lake = str(tmp_path / "lake")
    job = zygote.popen(
        ["--lake", lake, "start", "ingest"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: per_file(tmp_path) == expected)
        (tmp_path / "in" / "e.csv").write_text("id,name\n900,late\n901,later\n")
        wait_for(lambda: per_file(tmp_path).get("e.csv") == 2)
    finally:
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=60) == 0
    assert run(tmp_path, "drop-file", "ingest", "a.csv") == 0
    start_until(tmp_path, lambda: file_states(tmp_path).get("a.csv#1") == "Loaded", "a.csv's generation 1 Loaded")
    assert per_file(tmp_path) == {**expected, "e.csv": 2, "a.csv": 10}  # a.csv once more, as generation 1
    assert file_states(tmp_path)["a.csv#1"] == "Loaded"


@pytest.mark.usefixtures("reclock_processes")
def test_a_file_is_all_in_or_all_out_at_every_moment_even_across_sigkill(tmp_path):
    """The job runs in slices of a few milliseconds and is looked at, and at last SIGKILLed, while
    SIGSTOPped: it lands two files in about 20 ms, and when it ran on during a look it landed all
    60 while one read of the observer's took 2 s under the suite's load, so the kill found nothing
    left to interrupt."""
    folder = tmp_path / "in"
    sizes = write_numbered_csvs(folder, 60, lambda f: 3_000 + 137 * f)
    assert main(["create", str(config(tmp_path, stop_on_error=True, idle_interval=0.2))]) == 0
    lake = str(tmp_path / "lake")
    job = zygote.popen(
        ["--lake", lake, "start", "ingest"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    observations = 0
    deadline = time.monotonic() + 60
    seen: Counter = Counter()
    while time.monotonic() < deadline and len(seen) < 5 and job.poll() is None:
        time.sleep(0.01)
        os.killpg(job.pid, signal.SIGSTOP)
        seen = per_file_safe(tmp_path)
        assert all(count == sizes[name] for name, count in seen.items()), seen  # never a part of a file
        observations += seen.total() > 0
        if len(seen) < 5:
            os.killpg(job.pid, signal.SIGCONT)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=PATIENCE_S)
    after = per_file_safe(tmp_path)
    assert observations > 0 and len(after) < len(sizes), (observations, len(after))
    assert all(count == sizes[name] for name, count in after.items()), after
    # Its file states, not its output, are read while it runs: a read of the output (400,000 rows)
    # every quarter second cost 87 CPU-s of the suite; the output is compared whole once, after.
    loaded = {f"{name}#0": "Loaded" for name in sizes}
    start_until(tmp_path, lambda: file_states(tmp_path) == loaded, "every file Loaded")
    assert per_file(tmp_path) == sizes


def per_file_safe(tmp_path: Path) -> Counter:
    try:
        return per_file(tmp_path)
    except TableNotFoundError:  # not yet created; any other failure of a read is the test's failure
        return Counter()


def wait_for(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def committed_rows_per_file(lake: Path, pipeline: str, output: str) -> Counter:
    """Rows per file in ``output``, read with pyarrow from the parquet files its ``_delta_log`` lists.

    Independent of reclock's (and delta-rs's) readers: the JSON commits are replayed in version
    order (``add`` minus ``remove``), so what counts is exactly what a Delta reader would see.
    """
    table = lake / pipeline / "outputs" / output
    log = table / "_delta_log"
    if not log.is_dir():
        return Counter()
    live: set[str] = set()
    for commit in sorted(log.glob("*.json"), key=lambda p: int(p.stem)):
        for line in commit.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                live.add(unquote(action["add"]["path"]))
            elif "remove" in action:
                live.discard(unquote(action["remove"]["path"]))
    counts: Counter = Counter()
    for name in live:
        partitions = pq.read_table(table / name, columns=["_partition"]).column("_partition").to_pylist()
        counts.update(json.loads(p)[0] for p in partitions)
    return counts


def commits(lake: Path) -> int:
    """Commits of the ``rows`` output so far: cheap to poll, unlike its rows."""
    return len(list((lake / "ingest" / "outputs" / "rows" / "_delta_log").glob("*.json")))


def cli_file_states(tmp_path: Path, capsys) -> dict[tuple[str, int], dict]:
    capsys.readouterr()
    assert run(tmp_path, "files", "ingest", "--json", "--limit", "0") == 0
    return {(r["path"], r["generation"]): r for r in json.loads(capsys.readouterr().out)}


@pytest.mark.usefixtures("reclock_processes")
def test_file_states_follow_the_lake_across_repeated_sigkills_and_drop_file_accepts_every_loaded_file(
    tmp_path, capsys, long_lane
):
    """A job SIGKILLed six times (with ``--long``, until every file is in), each at a random moment
    after it landed a batch: after every kill ``reclock files`` says Loaded for exactly the files
    whose rows are in the output (read from the parquet files the ``_delta_log`` lists), and
    ``drop-file`` then accepts every one of them. A last run catches the ``files`` history log up
    with what the kills cut off."""
    folder = tmp_path / "in"
    sizes = write_numbered_csvs(folder, 60, lambda f: 2_000 + 97 * f)
    definition = config(tmp_path, stop_on_error=True, files_per_batch=1, idle_interval=0.2)
    assert main(["create", str(definition)]) == 0
    lake = tmp_path / "lake"
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    kills = 0
    while kills < (len(sizes) if long_lane else 6):
        before = commits(lake)
        job = zygote.popen(
            ["--lake", str(lake), "start", "ingest"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:  # kill at a random moment soon after this run landed its first batch
            wait_for(lambda b=before: commits(lake) > b, timeout=60)
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=PATIENCE_S)
        kills += 1
        in_output = committed_rows_per_file(lake, "ingest", "rows")
        assert all(n == sizes[name] for name, n in in_output.items()), (seed, in_output)  # whole files only
        states = cli_file_states(tmp_path, capsys)
        loaded = {path for (path, generation), r in states.items() if r["state"] == "Loaded"}
        assert loaded == set(in_output), (seed, kills, sorted(set(in_output) - loaded), sorted(loaded - set(in_output)))
        assert {path for path, _ in states} == set(sizes), seed  # every listed file has a state
        if len(in_output) == len(sizes):
            break
    assert in_output, seed
    for path in sorted(in_output):
        assert run(tmp_path, "drop-file", "ingest", path) == 0, (seed, path, capsys.readouterr().err)
    states = cli_file_states(tmp_path, capsys)
    assert {k for k, r in states.items() if r["state"] == "Loaded"} == {(p, 0) for p in in_output}
    assert {k for k, r in states.items() if r["state"] == "Unloaded"} == {(p, 1) for p in in_output} | {
        (p, 0) for p in set(sizes) - set(in_output)
    }
    unloaded = {f"{p}#{g}" for (p, g), r in states.items() if r["state"] == "Unloaded"}
    start_until(
        tmp_path, lambda: all(file_states(tmp_path).get(k) == "Loaded" for k in unloaded), "the dropped files again"
    )
    loaded = {f"{p}#{g}" for (p, g), r in cli_file_states(tmp_path, capsys).items() if r["state"] == "Loaded"}
    history = file_states(tmp_path)
    assert {k for k in loaded if history.get(k) != "Loaded"} == set(), seed


def test_many_small_files_land_once_on_spark_one_parquet_file_per_task(tmp_path, spark):
    """Spark tasks read their files as one stream (``read_group``): every row once, checked with
    pyarrow over the Delta log, and a task's files land as one parquet file, not one per file."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from reclock.runtime.pipeline import Pipeline
    from reclock.runtime.planes import SparkDataPlane
    from reclock.sources.files import FilesSource

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(200):
        (folder / f"{i:03d}.csv").write_text("id,name\n" + "".join(f"{i * 20 + j},n{j}\n" for j in range(20)))
    (folder / "bad.csv").write_text("id,name\nnot a number,x\n")
    source = FilesSource(path=folder, columns={"id": "int64", "name": "string"})
    pipeline = Pipeline("small", tmp_path / "lake", source, data_plane=SparkDataPlane(spark))
    while not pipeline.step().idle:
        pass
    table = DeltaTable(str(pipeline.sinks["rows"].path))
    uris = table.file_uris()
    ids = pq.ParquetDataset(uris).read(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(200 * 20))
    assert len(uris) <= 2 * spark.sparkContext.defaultParallelism  # one file per task, not per file
    errors = pq.ParquetDataset(DeltaTable(str(pipeline.sinks["_errors"].path)).file_uris()).read()
    assert errors.column("_partition").to_pylist() == ['["bad.csv",0]']
