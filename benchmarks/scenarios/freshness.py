"""Scenario 3: freshness. Time from produce to visible in Delta at a steady rate well below capacity.

A child process produces JSON events into two topics (4 partitions each) at a steady rate; each
record carries ``ts``, the wall-clock millisecond at which it was handed to the producer. A real
ingest job (:func:`reclock.job.lifecycle.run`, the code behind ``reclock start``: status tables, metrics and
all) runs with ``batch_interval`` 0.5 s three times: every batch on the Spark data plane (the
shared ``local[2]`` session, ``small_batch_offsets = 0``), with the default automatic choice
(``AutoDataPlane``: batches under ``small_batch_offsets`` run in the driver, larger ones on Spark),
and on the in-driver plane only (``engine = "local"``).

**Method.** A record is visible when the Delta commit that adds its file exists: the commit's log
file ``_delta_log/<version>.json`` is written atomically (put-if-absent), so its modification time
is the moment a reader could first see the record. For every commit we read the ``ts`` column of
the files it adds; latency = log file mtime - ``ts``. Producer, job and file system share one
clock (one machine). The commit's own ``commitInfo.timestamp`` gives the same numbers within a few
ms (reported as a cross-check). Target: p50 <= ``batch_interval`` + 1 s, reported as the ratio
p50 / (``batch_interval`` + 1 s), lower is better.

**Per-batch cost.** To see where Spark's per-job cost dominates small batches, the same pipeline
steps through fixed-size batches (``max_batch``) on both planes, alternating, for a cheap source
(the generator) and for Kafka + JSON; the step time against the batch size shows from which size
on Spark's two cores pay for its job overhead. That crossover is the threshold an in-driver path
for small batches should switch at.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks.fixtures import (
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    broker,
    create_topics,
    produced,
    running_job,
    spark,
    steady_producer,
    wait_until,
    workdir,
)
from benchmarks.harness import Ratio, ScenarioResult, figure, save_figure
from benchmarks.measure import load_average, median, percentile
from benchmarks.readback import delta_commits

__all__ = ["run"]

BATCH_INTERVAL = 0.5
PARTITIONS = 4
#: The three ways a job can run its batches: ``(engine, [spark] small_batch_offsets)``. "spark"
#: sends every batch to Spark, "auto" is the default (batches under the threshold run in the
#: driver, see ``reclock.runtime.planes.AutoDataPlane``), "local" never starts Spark.
PLANES = {"spark": ("spark", 0), "auto": ("spark", None), "local": ("local", None)}


def run(full: bool = False) -> ScenarioResult:
    rate = 2_000
    seconds = 60 if full else 30
    result = ScenarioResult("freshness")
    session = spark()
    latencies: dict[str, np.ndarray] = {}
    for plane, (engine, small) in PLANES.items():
        latencies[plane], info = _freshness(plane, engine, small, rate, seconds)
        result.measurements[plane] = info
        p50 = info["p50_ms"] / 1000
        result.ratios.append(
            Ratio(
                f"p50 latency / (batch_interval + 1 s), {plane} plane",
                p50 / (BATCH_INTERVAL + 1),
                1.0,
                lower_is_better=True,
                detail=f"p50 {info['p50_ms']:.0f} ms, p99 {info['p99_ms']:.0f} ms, {info['records']:,} records at "
                f"{rate:,}/s; a batch every {info['commit_interval_ms']:.0f} ms",
            )
        )
    result.measurements.update(rate=rate, seconds=seconds, batch_interval=BATCH_INTERVAL)

    sizes = {"generator": [1_000, 30_000, 300_000], "kafka json": [1_000, 8_000, 64_000]}
    if full:
        sizes = {
            "generator": [1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000],
            "kafka json": [1_000, 4_000, 16_000, 64_000, 128_000],
        }
    costs = _batch_costs(session, sizes, runs=5 if full else 3)
    result.measurements["step_seconds"] = costs
    thresholds = {}
    for source, by_plane in costs.items():
        thresholds[source] = _crossover(sizes[source], by_plane["spark"], by_plane["local"])
        small, big = sizes[source][0], sizes[source][-1]
        result.notes.append(
            f"{source}: a step of {small:,} rows takes {by_plane['spark'][0] * 1e3:.0f} ms on Spark vs "
            f"{by_plane['local'][0] * 1e3:.0f} ms in-driver; {big:,} rows: {by_plane['spark'][-1] * 1e3:.0f} vs "
            f"{by_plane['local'][-1] * 1e3:.0f} ms; Spark pays from about "
            + (f"{thresholds[source]:,.0f} rows" if thresholds[source] else "(no crossover in the measured range)")
        )
    result.measurements["spark_pays_from_rows"] = thresholds
    result.measurements["spark_job_overhead_ms"] = _job_overhead(session)
    result.measurements["load_average"] = load_average()
    result.plots.append(_plot_latency(latencies))
    result.plots.append(_plot_costs(sizes, costs, thresholds))
    return result


# -- produce-to-visible latency ------------------------------------------------------------------


def _freshness(
    plane: str, engine: str, small_batch_offsets: int | None, rate: int, seconds: float
) -> tuple[np.ndarray, dict[str, Any]]:
    from reclock.job import lifecycle
    from reclock.job.config import parse_config
    from reclock.persist.lake import Lake
    from reclock.sources.kafka import output_name_for

    bootstrap = broker().bootstrap
    spark_section: dict[str, Any] = {"master": "local[2]"}
    if small_batch_offsets is not None:
        spark_section["small_batch_offsets"] = small_batch_offsets
    with workdir(f"fresh-{plane}") as root:
        tag = root.name.rsplit("-", 1)[-1].lower()
        topics = [f"fresh_{plane}_{tag}_a", f"fresh_{plane}_{tag}_b"]
        create_topics(bootstrap, topics, PARTITIONS)
        lake = Lake.at(root / "lake")
        config = parse_config(
            {
                "pipeline": {
                    "name": "fresh",
                    "lake": str(lake.root),
                    "engine": engine,
                    "batch_interval": BATCH_INTERVAL,
                },
                "spark": spark_section,
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": bootstrap,
                    "topics": topics,
                    "format": "json",
                    "schema": EVENT_COLUMNS,
                },
            }
        )
        lifecycle.create(config)
        with running_job(lake, "fresh", "freshness-job"):
            producer = steady_producer(bootstrap, topics, rate, seconds, PARTITIONS)
            assert producer.stdout is not None
            done = producer.stdout.readline().split()
            producer.wait(timeout=30)
            sent = int(done[1])
            tables = [lake.output_path("fresh", output_name_for(t)) for t in topics]
            wait_until(lambda: sum(c.rows for t in tables for c in delta_commits(t)) >= sent, 120, what="all records")
        latencies, by_commit_info, intervals, per_batch = _latencies(tables)
    assert len(latencies) == sent, f"{plane}: {len(latencies)} records landed of {sent} produced"
    return latencies, {
        "records": sent,
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "max_ms": float(latencies.max()),
        "p50_ms_by_commit_timestamp": percentile(by_commit_info, 50),
        "p99_ms_by_commit_timestamp": percentile(by_commit_info, 99),
        "commit_interval_ms": median(intervals),
        "rows_per_batch_median": median(per_batch),
    }


def _latencies(tables: Sequence[Path]) -> tuple[np.ndarray, np.ndarray, list[float], list[int]]:
    """Per record: visible (log file mtime) - produced; also by commitInfo timestamp."""
    by_mtime, by_info = [], []
    intervals: list[float] = []
    per_batch: list[int] = []
    for table in tables:
        commits = [c for c in delta_commits(table) if c.rows]
        for previous, commit in itertools.pairwise(commits):
            intervals.append((commit.visible_s - previous.visible_s) * 1000)
        for commit in commits:
            ts = np.concatenate([pq.read_table(Path(table) / f, columns=["ts"])["ts"].to_numpy() for f in commit.files])
            by_mtime.append(commit.visible_s * 1000 - ts)
            by_info.append((commit.commit_ms or 0) - ts)
            per_batch.append(commit.rows)
    return np.concatenate(by_mtime), np.concatenate(by_info), intervals, per_batch


# -- the per-batch cost of each plane ------------------------------------------------------------


class _Timed:
    """Wraps a data plane and records how long each ``run`` took."""

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.seconds: list[float] = []

    def run(self, plan: Any, splits: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.plane.run(plan, splits)
        finally:
            self.seconds.append(time.perf_counter() - started)


def _batch_costs(session: Any, sizes: dict[str, list[int]], runs: int) -> dict[str, dict[str, list[float]]]:
    """Median seconds of one pipeline step per batch size, per plane, per source."""
    from reclock.runtime.pipeline import Pipeline
    from reclock.runtime.planes import LocalDataPlane, SparkDataPlane
    from reclock.runtime.settings import Settings
    from reclock.sources.generator import GeneratorSource
    from reclock.sources.kafka import KafkaSource

    need = max(sizes["kafka json"]) * (runs + 1) // 2 + 1
    topics, _ = produced(max(need, 200_000), PARTITIONS)
    bootstrap = broker().bootstrap
    out: dict[str, dict[str, list[float]]] = {}
    for source_name, source_sizes in sizes.items():
        out[source_name] = {"spark": [], "local": []}
        for size in source_sizes:
            step_times: dict[str, list[float]] = {"spark": [], "local": []}
            with workdir("cost") as root:
                pipelines = {}
                for plane in ("spark", "local"):
                    if source_name == "generator":
                        source = GeneratorSource(partitions=4, limit=size * (runs + 2))
                    else:
                        source = KafkaSource(bootstrap, topics=topics, format="json", schema=EVENT_SCHEMA)
                    data_plane = SparkDataPlane(session) if plane == "spark" else LocalDataPlane()
                    pipeline = Pipeline(
                        f"{plane}_{size}", root, source, data_plane=data_plane, settings=Settings(max_batch=size)
                    )
                    pipeline.step()  # warm: tables created, clients connected
                    pipelines[plane] = pipeline
                for i in range(runs):
                    for plane in ("spark", "local") if i % 2 == 0 else ("local", "spark"):
                        started = time.perf_counter()
                        report = pipelines[plane].step()
                        step_times[plane].append(time.perf_counter() - started)
                        assert sum(report.rows.values()) == size, (source_name, plane, size, report.rows)
                for pipeline in pipelines.values():
                    close = getattr(pipeline.source, "close", None)
                    if close is not None:
                        close()
            for plane in ("spark", "local"):
                out[source_name][plane].append(median(step_times[plane]))
    return out


def _crossover(sizes: list[int], spark_s: list[float], local_s: list[float]) -> float | None:
    """The batch size (rows) from which the Spark plane is faster, interpolated in log-log space."""
    diff = [np.log(s) - np.log(loc) for s, loc in zip(spark_s, local_s, strict=True)]
    if diff[0] <= 0:
        return float(sizes[0])
    for i in range(1, len(sizes)):
        if diff[i] <= 0:
            x0, x1 = np.log(sizes[i - 1]), np.log(sizes[i])
            return float(np.exp(x0 + (x1 - x0) * diff[i - 1] / (diff[i - 1] - diff[i])))
    return None


def _job_overhead(session: Any) -> dict[str, float]:
    """Warm round trips of the smallest Spark jobs the data plane could issue (median of 9, ms)."""
    sc = session.sparkContext

    def timed(fn: Any) -> float:
        times = []
        for _ in range(9):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return round(median(times) * 1000, 1)

    return {
        "parallelize(2 items).map.collect": timed(lambda: sc.parallelize([1, 2], 2).map(lambda x: x).collect()),
        "parallelize(8 items).map.collect": timed(lambda: sc.parallelize(list(range(8)), 8).map(lambda x: x).collect()),
        "range(10).count": timed(lambda: session.range(10).count()),
    }


# -- plots ---------------------------------------------------------------------------------------


def _plot_latency(latencies: dict[str, np.ndarray]) -> str:
    fig, ax = figure()
    for plane, values in latencies.items():
        xs = np.sort(values) / 1000
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{plane} plane (p50 {np.median(xs):.2f} s)")
    ax.axvline(BATCH_INTERVAL + 1, color="grey", linestyle="--", label="target for p50: batch_interval + 1 s")
    ax.set_xlabel("produce to visible in Delta (s)")
    ax.set_ylabel("fraction of records")
    ax.set_title("Freshness at a steady 2,000 records/s (CDF)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return save_figure(fig, "freshness.png")


def _plot_costs(sizes: dict[str, list[int]], costs: dict[str, dict[str, list[float]]], thresholds: dict) -> str:
    fig, ax = figure()
    for i, (source, by_plane) in enumerate(costs.items()):
        for plane, style in (("spark", "-o"), ("local", "--s")):
            ax.plot(
                sizes[source], [s * 1000 for s in by_plane[plane]], style, color=f"C{i}", label=f"{source}, {plane}"
            )
        if thresholds.get(source):
            ax.axvline(thresholds[source], color=f"C{i}", alpha=0.4, linestyle=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows per batch (max_batch)")
    ax.set_ylabel("ms per pipeline step")
    ax.set_title("One batch: Spark plane vs in-driver plane")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, "freshness_batch_cost.png")
