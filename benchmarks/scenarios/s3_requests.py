"""Scenario: s3_requests. What a batch and an idle minute cost in S3 requests, young and old.

On a real object store every request takes 10-50 ms and is billed, so the count of requests is
the cost (issue 21, item 10). The pipeline is the generator's: three outputs and ``_errors``, four
output tables and the remap table. Requests are counted on the wire by a proxy between reclock and
moto's S3 server (:mod:`tests.integration.s3_requests`, its own process), by method and by the
kind of object they name; nothing in reclock is patched.

**Ages.** At 100 and 10,000 batches (``--full`` adds 1,000). The history is built cheaply: the
same :class:`~reclock.runtime.pipeline.Pipeline` steps a *local* lake with tiny batches (8 records,
its clock a second a step, the job's default maintenance every 500 batches, which checkpoints,
compacts, vacuums and expires the log as a job does), and the lake is then copied object for
object into a new bucket. Only the place differs from a lake grown on S3 (and the objects' upload
times, which nothing in the format reads). On the bucket the pipeline is opened afresh through the
proxy, warmed by a few batches, and :data:`_WINDOW` batches are counted; then one maintenance pass
on the bucket, amortized over its 500 batches.

**The floor**, per batch: the requests a capable user pays with the same library for the same
durable work. A batch commits once to each of the 5 tables (one ``PUT`` of a log entry per output
commit, one for the remap mint) and writes the data files it makes (``PUT data``, counted). A
commit also needs to know the table's newest version, which costs reads; how many is measured as a
user's ``write_deltalake`` append on a table held open (:func:`_user_append`), in the same run on
the same server. So ``floor = 5 x (a user's append, its data PUT excepted) + the batch's data PUTs``,
and its reads (GET, HEAD, LIST) are ``5 x`` the user's. Targets: a batch's requests within 2x of
the floor at every age, its GETs at 10,000 within 1.25x of those at 100 (flat with age).

**Idle.** A ``reclock start`` job (in this process) whose generator has nothing yet is counted
for :data:`_IDLE_S` seconds: it looks for a stop request at the batch cadence, renews its lease and
keeps its status fresh. Target: requests a minute at most 2x the batch cadence (60 steps a minute
at ``batch_interval = 1``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks.fixtures import workdir
from benchmarks.harness import Ratio, ScenarioResult
from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.job.control import request_stop
from reclock.persist.lake import Lake
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.settings import Maintenance, Settings
from reclock.sources.generator import GeneratorSource
from tests.integration.s3 import S3Server
from tests.integration.s3_requests import CountingProxy, Requests

__all__ = ["run"]

#: Batches counted at each age: one checkpoint interval (delta-rs checkpoints a table every 100
#: versions after a commit, reading its log since the last one), so every window holds exactly one
#: checkpoint per table, as every 100 batches of a job's life do, at whatever age.
_WINDOW = 100
_WARM = 3  # batches after opening on the bucket, before counting (the first reads each table's log)
_RECORDS = 8  # records per batch while the history is built (tiny: the age is in commits, not rows)
_MAINTENANCE = Maintenance()  # the job's default: every 500 batches
_IDLE_S = 30


def run(full: bool = False) -> ScenarioResult:
    ages = [100, 1_000, 10_000] if full else [100, 10_000]
    result = ScenarioResult("s3_requests")
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
    server = S3Server(log)
    proxy = CountingProxy(server.endpoint)
    try:
        with workdir("s3_requests") as base:
            user = _user_append(server, proxy)
            points = _ages(server, proxy, base / "lake", ages, user)
        idle = _idle(server, proxy)
    finally:
        proxy.stop()
        server.stop()
        log.close()
    result.measurements.update({"user_append": user, "ages": points, "idle": idle})
    young, old = points[0], points[-1]
    for point in points:
        result.ratios.append(
            Ratio(
                f"requests a batch at {point['age']:,} batches / floor",
                point["total"] / point["floor"],
                2.0,
                lower_is_better=True,
                detail=f"{point['total']:.1f} vs {point['floor']:.1f}; GET {point['GET']:.1f}, PUT {point['PUT']:.1f}, "
                f"HEAD {point['HEAD']:.1f}, LIST {point['LIST']:.1f}",
            )
        )
    result.ratios.append(
        Ratio(
            f"GETs a batch at {old['age']:,} / at {young['age']:,}",
            old["GET"] / young["GET"],
            1.25,
            lower_is_better=True,
            detail=f"{old['GET']:.1f} vs {young['GET']:.1f}",
        )
    )
    result.ratios.append(
        Ratio(
            "idle requests a minute / batch cadence (steps a minute)",
            idle["per_minute"] / idle["cadence_per_minute"],
            2.0,
            lower_is_better=True,
            detail=f"{idle['per_minute']:.0f} a minute: {idle['by_kind']}",
        )
    )
    result.notes.append(
        f"history: {old['age']:,} batches built in {old['build_s']:.0f} s on a local lake, "
        f"{old['objects']:,} objects copied in {old['copy_s']:.0f} s; maintenance on the bucket: "
        f"{old['maintenance_requests']:,} requests, {old['maintenance_per_batch']:.1f} a batch over "
        f"{_MAINTENANCE.every}"
    )
    return result


def _ages(server: S3Server, proxy: CountingProxy, local: Path, ages: list[int], user: dict[str, Any]) -> list[dict]:
    clock = [1_700_000_000_000]

    def now() -> int:
        clock[0] += 1000
        return clock[0]

    def open_pipeline(lake: Lake | Path) -> Pipeline:
        return Pipeline(
            "cost",
            lake,
            GeneratorSource(partitions=2, limit=10**12, seed=1),
            data_plane=LocalDataPlane(),
            settings=Settings(max_batch=_RECORDS, idle_interval=0.0),
            maintenance=_MAINTENANCE,
            now=now,
        )

    builder = open_pipeline(local)
    built, build_s = 0, 0.0
    points = []
    for age in ages:
        started = time.perf_counter()
        while built < age:
            builder.step()
            built += 1
        build_s += time.perf_counter() - started
        bucket = server.bucket()
        started = time.perf_counter()
        objects = _copy(server, local, bucket)
        copy_s = time.perf_counter() - started
        lake = Lake.at(f"s3://{bucket}/lake", {**server.storage_options, "endpoint": proxy.endpoint})
        pipeline = open_pipeline(lake)
        for _ in range(_WARM):
            pipeline.step()
        batch = _per(_counted(proxy, lambda p=pipeline: [p.step() for _ in range(_WINDOW)]), _WINDOW)
        maintenance = _counted(proxy, pipeline.maintain)
        tables = 1 + len(pipeline.sinks)
        floor = tables * user["per_commit"] + batch["PUT data"]
        point = {
            "age": age,
            "build_s": round(build_s, 1),
            "objects": objects,
            "copy_s": round(copy_s, 1),
            "tables": tables,
            "total": batch.total(),
            "floor": floor,
            "reads": batch.total("GET") + batch.total("HEAD") + batch.total("LIST"),
            "floor_reads": tables * user["reads"],
            **{method: batch.total(method) for method in ("GET", "PUT", "HEAD", "LIST", "DELETE", "POST")},
            "by_kind": {kind: round(n, 2) for kind, n in sorted(batch.items()) if n},
            "maintenance_requests": maintenance.total(),
            "maintenance_per_batch": maintenance.total() / _MAINTENANCE.every,
            "maintenance_by_kind": dict(sorted(maintenance.items())),
        }
        points.append(point)
        print(f"  age {age:,}: {point}", flush=True)
    return points


def _user_append(server: S3Server, proxy: CountingProxy, appends: int = 10) -> dict[str, Any]:
    """What one append costs a user who holds a Delta table open: ``write_deltalake`` on it."""
    lake = Lake.at(f"s3://{server.bucket()}/lake", {**server.storage_options, "endpoint": proxy.endpoint})
    path = str(lake.root / "user")
    rows = pa.table({"id": pa.array(range(_RECORDS), pa.int64()), "payload": ["x" * 40] * _RECORDS})
    write_deltalake(path, rows, mode="append", storage_options=lake.store.delta_options)
    table = DeltaTable(path, storage_options=lake.store.delta_options)
    one = _per(_counted(proxy, lambda: [write_deltalake(table, rows, mode="append") for _ in range(appends)]), appends)
    return {
        "per_commit": one.total() - one["PUT data"],
        "reads": one.total("GET") + one.total("HEAD") + one.total("LIST"),
        "by_kind": dict(sorted(one.items())),
    }


def _idle(server: S3Server, proxy: CountingProxy) -> dict[str, Any]:
    """A job with nothing to read, counted for :data:`_IDLE_S` seconds once its start-up is over."""
    lake = Lake.at(f"s3://{server.bucket()}/lake", {**server.storage_options, "endpoint": proxy.endpoint})
    far = 4_102_444_800_000  # 2100: the generator's first record is due then, so the job stays idle
    config = parse_config(
        {
            "pipeline": {"name": "idle", "lake": lake.uri, "engine": "local", "idle_interval": 3600},
            "source": {"kind": "generator", "partitions": 2, "rate": 1000, "anchor_ms": far},
        }
    )
    lifecycle.create(config, storage_options={**server.storage_options, "endpoint": proxy.endpoint})
    job = threading.Thread(target=lifecycle.run, args=(lake, "idle"), daemon=True)
    job.start()
    try:
        time.sleep(10)  # start-up: the first (time-only) binding, the status tables' first flush
        idle = _counted(proxy, lambda: time.sleep(_IDLE_S))
    finally:
        request_stop(Lake.at(lake.uri, server.storage_options), "idle")
        job.join(timeout=60)
    cadence = 60 / config.settings.batch_interval
    return {
        "seconds": _IDLE_S,
        "per_minute": idle.total() * 60 / _IDLE_S,
        "cadence_per_minute": cadence,
        "by_kind": {kind: n for kind, n in sorted(idle.items()) if n},
        "stopped": not job.is_alive(),
    }


def _copy(server: S3Server, local: Path, bucket: str) -> int:
    """Every file of the local lake into ``bucket`` under ``lake/``, straight to the server."""
    client = server.client()
    files = [p for p in local.rglob("*") if p.is_file()]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), bucket, f"lake/{p.relative_to(local)}"), files))
    return len(files)


def _counted(proxy: CountingProxy, work: Callable[[], object]) -> Requests:
    before = proxy.counts()
    work()
    after = proxy.counts()
    after.subtract(before)
    return after


def _per(counted: Requests, n: int) -> Requests:
    return Requests({kind: count / n for kind, count in counted.items()})
