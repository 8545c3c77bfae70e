"""Postgres freshness: commit-to-visible latency of the Postgres source at 5,000 changes/s.

A child process (``python -m benchmarks.postgres_load steady``) inserts rows into two tables at a
steady 5,000 rows a second, in transactions of 10 (5 rows in each table); each row carries
``ts``, the wall-clock millisecond just before its transaction's commit. A real job
(:func:`reclock.job.lifecycle.run`, the code behind ``reclock start``) with ``batch_interval`` 0.5 s
and the default data plane (``engine = "spark"``, small batches in the driver) streams both
tables into upsert outputs. A row is visible when the Delta commit that adds its file exists; its
latency is that log file's mtime minus ``ts`` (one machine, one clock; the method of the
``freshness`` scenario). Target (issue 22, acceptance 5): p50 <= ``batch_interval`` + 1 s,
reported as p50 / (``batch_interval`` + 1 s), lower is better.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.fixtures import running_job, spark, wait_until, workdir
from benchmarks.harness import Ratio, ScenarioResult
from benchmarks.measure import load_average, median, percentile
from benchmarks.postgres_load import TABLES, create_tables, execute, flush_lsn, server
from benchmarks.readback import delta_commits

__all__ = ["run"]

BATCH_INTERVAL = 0.5
RATE = 5_000


def run(full: bool = False) -> ScenarioResult:
    from reclock.job import lifecycle
    from reclock.job.config import parse_config
    from reclock.job.status import read_status
    from reclock.persist.lake import Lake
    from reclock.sources.postgres.source import WAL
    from reclock.timeline.frontier import Frontier

    seconds = 60 if full else 30
    result = ScenarioResult("postgres_freshness")
    spark()  # the JVM is warm, as for a job that has been running
    pg = server()
    database = f"fresh_{int(time.time())}"
    dsn = pg.create_database(database)
    create_tables(dsn)
    with workdir("pg-fresh") as root:
        lake = Lake.at(root / "lake")
        config = parse_config(
            {
                "pipeline": {"name": "fresh", "lake": str(lake.root), "batch_interval": BATCH_INTERVAL},
                "spark": {"master": "local[2]"},
                "source": {"kind": "postgres", "dsn": dsn, "tables": list(TABLES)},
            }
        )
        lifecycle.create(config)
        with running_job(lake, "fresh", "pg-freshness-job"):
            writer = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.postgres_load", "steady", dsn, str(RATE), str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert writer.stdout is not None
            if writer.stdout.readline().strip() != "ready":
                writer.kill()
                raise RuntimeError("the steady writer did not start")
            done = writer.stdout.readline().split()
            writer.wait(timeout=30)
            sent = int(done[1])
            achieved = sent / seconds
            end = flush_lsn(dsn)
            wait_until(
                lambda: Frontier.from_json((read_status(lake, "fresh") or {}).get("resume_frontier", "{}")).covers(
                    WAL, end - 1
                ),
                120,
                what="every row in every output",
            )
        latencies, intervals, per_batch = _first_visible([lake.output_path("fresh", f"public_{t}") for t in TABLES])
    execute(dsn, "SELECT pg_drop_replication_slot('reclock_fresh')")
    execute(pg.dsn(), f'DROP DATABASE "{database}" WITH (FORCE)')
    assert len(latencies) == sent, f"{len(latencies)} rows landed of {sent} written"
    p50 = percentile(latencies, 50)
    result.ratios.append(
        Ratio(
            "p50 commit-to-visible / (batch_interval + 1 s), Postgres at 5,000 changes/s",
            p50 / 1000 / (BATCH_INTERVAL + 1),
            1.0,
            lower_is_better=True,
            detail=f"p50 {p50:.0f} ms, p99 {percentile(latencies, 99):.0f} ms, {sent:,} rows at {achieved:,.0f}/s; "
            f"a batch every {median(intervals):.0f} ms",
        )
    )
    result.measurements.update(
        rows=sent,
        rate_asked=RATE,
        rate_achieved=round(achieved),
        seconds=seconds,
        batch_interval=BATCH_INTERVAL,
        p50_ms=p50,
        p90_ms=percentile(latencies, 90),
        p99_ms=percentile(latencies, 99),
        max_ms=float(np.max(latencies)),
        commit_interval_ms=median(intervals),
        rows_per_batch_median=median(per_batch),
        load_average=load_average(),
    )
    return result


def _first_visible(tables: list[Any]) -> tuple[np.ndarray, list[float], list[int]]:
    """Per row: the mtime of the first commit whose files hold its key, minus its ``ts``. An
    upsert output's MERGE rewrites files that hold earlier rows, so a row is counted once, at
    the commit that first showed it. Also the intervals between commits and rows new per commit."""
    latencies, intervals, per_batch = [], [], []
    for table in tables:
        seen: set[int] = set()
        previous = None
        for commit in delta_commits(table):
            if not commit.files:
                continue
            rows = pa.concat_tables([pq.read_table(Path(table) / f, columns=["id", "ts"]) for f in commit.files])
            ids, ts = rows["id"].to_numpy(), rows["ts"].to_numpy()
            new = np.fromiter((i not in seen for i in ids.tolist()), bool, len(ids))
            seen.update(ids[new].tolist())
            if new.any():
                latencies.append(commit.visible_s * 1000 - ts[new])
                per_batch.append(int(new.sum()))
                if previous is not None:
                    intervals.append((commit.visible_s - previous) * 1000)
                previous = commit.visible_s
    return np.concatenate(latencies), intervals, per_batch
