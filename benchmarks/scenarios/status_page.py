"""The status page's own cost: every endpoint of ``reclock ui`` over a lake of 50 pipelines and
100,000 batches.

The lake is built directly and cheaply, as the jobs would have left it: 50 generator pipelines
(definition, ``status.json``, one binding in the remap table, two output tables carrying their
commit label), and the status tables written in one go: 100,000 batches of two splits each in
``batches`` (200,000 rows), as many ``offsets`` rows, 2,000 ``errors`` rows. The page's server
then runs in this process, and each endpoint is asked ``runs`` times over HTTP on loopback.

Target (issues 24 and 41): every endpoint answers in under 200 ms: the ratio is 200 ms over an
endpoint's slowest answer, at least 1. The refresh that reads the lake runs apart from the
requests, once per ``refresh_s`` whatever the number of viewers; its time is recorded too, cold
(first read of every table), warm (nothing changed) and after one more batch of status rows.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from benchmarks.harness import Ratio, ScenarioResult
from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.job.status import Status
from reclock.persist import conditional
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import RemapTable
from reclock.persist.status_tables import STATUS_SCHEMAS
from reclock.timeline.frontier import Frontier, wall_clock_ms
from reclock.ui.server import StatusPage

__all__ = ["run"]

PIPELINES = 50
BATCHES = 100_000
TARGET_MS = 200.0


def run(full: bool = False) -> ScenarioResult:
    runs = 50 if full else 20
    result = ScenarioResult("status_page")
    with tempfile.TemporaryDirectory(prefix="reclock-bench-ui-") as folder:
        lake = Lake.at(Path(folder) / "lake")
        started = time.perf_counter()
        now = _build(lake)
        result.measurements["build_seconds"] = round(time.perf_counter() - started, 1)
        cold = time.perf_counter()
        page = StatusPage(lake, refresh_s=3600)  # refreshed below, by hand, so requests meet no refresh
        refresh = {"cold_ms": round((time.perf_counter() - cold) * 1000, 1)}
        refresh["warm_ms"] = _ms(page.view.refresh)
        _append_batch(lake, now)
        refresh["one_more_batch_ms"] = _ms(page.view.refresh)
        result.measurements["refresh"] = refresh
        page.start()
        try:
            endpoints = {
                "page": "",
                "script": "static/app.js",
                "overview": "api/overview",
                "timeline (50 pipelines)": "api/timeline",
                "timeline (3 selected)": "api/timeline?pipelines=p00,p07,p13",
                "series": "api/pipelines/p07/series",
                "batches, page 1": "api/pipelines/p07/tables/batches?limit=50",
                "batches, page 100": "api/pipelines/p07/tables/batches?offset=1950&limit=50",
                "batches, filtered": "api/pipelines/p07/tables/batches?where.partition=gen-1&limit=50",
                "errors": "api/pipelines/p07/tables/errors",
                "offsets": "api/pipelines/p07/tables/offsets",
                "definition": "api/pipelines/p07/definition",
                "files": "api/pipelines/p07/tables/files",
            }
            timings = {name: _timed(page.url + path, runs) for name, path in endpoints.items()}
        finally:
            page.close()
    result.measurements["endpoints_ms"] = timings
    for name, times in timings.items():
        worst = max(times)
        result.ratios.append(
            Ratio(
                f"200 ms / slowest answer, {name}",
                TARGET_MS / worst,
                1.0,
                detail=f"median {statistics.median(times):.1f} ms, slowest {worst:.1f} ms over {runs} requests",
            )
        )
    result.notes.append(
        f"refresh of the lake's view: cold {refresh['cold_ms']} ms, warm {refresh['warm_ms']} ms, "
        f"after one more batch {refresh['one_more_batch_ms']} ms"
    )
    return result


def _ms(fn) -> float:
    started = time.perf_counter()
    fn()
    return round((time.perf_counter() - started) * 1000, 1)


def _timed(url: str, runs: int) -> list[float]:
    urllib.request.urlopen(url, timeout=30).read()  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()
        times.append(round((time.perf_counter() - started) * 1000, 2))
    return times


def _build(lake: Lake) -> int:
    """The lake of the module doc; returns the into time of the newest batch."""
    now = wall_clock_ms()
    per = BATCHES // PIPELINES
    names = [f"p{i:02}" for i in range(PIPELINES)]
    for name in names:
        section = {"name": name, "lake": str(lake.root), "engine": "local"}
        lifecycle.create(parse_config({"pipeline": section, "source": {"kind": "generator", "rate": 1000}}))
        upper = now - (hash(name) % 5_000)
        RemapTable(lake.remap_path(name)).mint(upper - 1, Frontier({"gen-0": per * 100, "gen-1": per * 100}))
        for output, row in (("bids", {"price": 1}), ("_errors", {"kind": "parse", "message": "bad", "raw": b"x"})):
            write_deltalake(
                str(lake.output_path(name, output)),
                pa.Table.from_pylist([{**row, "_into_ts": upper - 1, "_partition": "gen-0", "_offset": 7}]),
                commit_properties=CommitProperties(app_transactions=[Transaction(sink_id(name, output), upper - 1)]),
            )
        status = Status(name, "stopped", batches=per, bindings=1, resume_upper=upper, updated_ms=now)
        # As a job's StatusWriter leaves it (without the lease a job holds while it writes).
        conditional.put(lake.store, lake.status_path(name), json.dumps(asdict(status), indent=1), None)
    batches, offsets = [], []
    for name in names:
        for b in range(per):
            batch_id = now - (per - b) * 200
            for partition in ("gen-0", "gen-1"):
                batches.append(
                    {
                        "pipeline": name,
                        "batch_id": batch_id,
                        "state": "Succeeded",
                        "partition": partition,
                        "rows": 100,
                        "filtered": 0,
                        "bytes": 6_000,
                        "earliest_offset": b * 100,
                        "latest_offset": b * 100 + 99,
                        "start_ms": batch_id + 5,
                        "duration_ms": 20,
                        "time_ms": batch_id + 60,
                        "probe_ms": 2,
                        "mint_ms": 10,
                        "plan_ms": 1,
                        "read_ms": 20,
                        "commit_ms": 25,
                    }
                )
                offsets.append(
                    {
                        "pipeline": name,
                        "partition": partition,
                        "earliest": 0,
                        "latest": b * 100 + 100,
                        "latest_loaded": b * 100 + 100,
                        "time_ms": batch_id + 60,
                        "source_latest": b * 100 + 150,
                    }
                )
    errors = [
        {
            "pipeline": names[i % PIPELINES],
            "kind": "batch data",
            "code": "OSError",
            "message": "simulated",
            "batch_id": now - i * 1000,
            "partition": "gen-0",
            "offset": i,
            "time_ms": now - i * 1000,
        }
        for i in range(2_000)
    ]
    pipelines = [
        {"pipeline": n, "state": "Stopped", "health": "stopped", "finished": False, "time_ms": now} for n in names
    ]
    for table, rows in (("batches", batches), ("offsets", offsets), ("errors", errors), ("pipelines", pipelines)):
        write_deltalake(str(lake.status_table_path(table)), pa.Table.from_pylist(rows, schema=STATUS_SCHEMAS[table]))
    return now


def _append_batch(lake: Lake, now: int) -> None:
    """One more batch's rows, appended as a job's status writer appends them."""
    row = {
        "pipeline": "p07",
        "batch_id": now + 1,
        "state": "Succeeded",
        "partition": "gen-0",
        "rows": 100,
        "time_ms": now + 60,
    }
    write_deltalake(
        str(lake.status_table_path("batches")),
        pa.Table.from_pylist([row], schema=STATUS_SCHEMAS["batches"]),
        mode="append",
    )
