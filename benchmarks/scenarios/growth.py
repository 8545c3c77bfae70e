"""Scenario: growth. Does a batch on day 100 cost what it cost on day 1?

One pipeline (generator, 2 partitions, batches of 400 events, in-driver plane: a step is one remap
mint and one commit per output) is stepped back to back, its clock advancing a second per step as
a job's would at one batch a second. At each sampled age we read

* the **median step** over the 500 steps before it: one whole maintenance cycle, from the step
  after one maintenance to the step that runs the next (included), so the sample is the same
  mix of fresh and crowded tables at every age,
* the **reopen** time: a new :class:`~reclock.runtime.pipeline.Pipeline` on the same lake, as a restart
  builds it (the remap table replayed, every output's snapshot loaded), median of 3, taken just
  *before* the step that maintains (the most files a restart can meet), and just after it,
* the **live files** of the largest output and the parquet files on disk in the whole lake.

Two curves: maintenance on (the default ``every = 500``, and ``history_minutes = 0``: everything
older than the resume upper compacted, vacuumed as soon as unreferenced; the bounded state a job
converges to whatever its history window, reached within the run instead of after a day) and
maintenance off. Targets (issue 9): with
maintenance on, the median step and the reopen at the oldest age are within 1.5x of those at
age 500. The **small-batch floor** compares a step with what a capable user pays for the same
durable work: one ``write_deltalake`` append of 400 rows per table the step commits to, timed in
the same run on a table of the same age; target <= 2x.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks.fixtures import workdir
from benchmarks.harness import Ratio, ScenarioResult, figure, save_figure
from reclock.persist.maintenance import set_retention
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.settings import Maintenance, Settings
from reclock.sources.generator import GeneratorSource

__all__ = ["run"]

_REOPENS = 3
_ON = Maintenance(history_minutes=0)
_WINDOW = _ON.every
_OFF = Maintenance(every=0)


def run(full: bool = False) -> ScenarioResult:
    on_ages = [500, 1_000, 2_000, 5_000, 10_000] + ([30_000, 100_000] if full else [])
    off_ages = [500, 1_000, 2_000] + ([5_000, 10_000] if full else [])
    result = ScenarioResult("growth")
    curves = {"maintenance on": _grow(on_ages, _ON), "maintenance off": _grow(off_ages, _OFF)}
    result.measurements["curves"] = curves
    on = curves["maintenance on"]
    first, last = on[0], on[-1]
    for what in ("step_ms", "reopen_ms"):
        result.ratios.append(
            Ratio(
                f"maintenance on: {what.replace('_ms', '')} at {last['age']:,} batches / at {first['age']:,}",
                last[what] / first[what],
                1.5,
                lower_is_better=True,
                detail=f"{last[what]:.0f} ms vs {first[what]:.0f} ms",
            )
        )
    for point in (first, last):
        floor = point["step_ms"] / (point["tables_committed"] * point["user_commit_ms"])
        result.ratios.append(
            Ratio(
                f"small batch at {point['age']:,}: step / (tables it commits to x one user append)",
                floor,
                2.0,
                lower_is_better=True,
                detail=f"{point['step_ms']:.0f} ms vs {point['tables_committed']} x {point['user_commit_ms']:.1f} ms",
            )
        )
    off = curves["maintenance off"]
    result.notes.append(
        f"maintenance off: step {off[0]['step_ms']:.0f} ms at {off[0]['age']:,} -> {off[-1]['step_ms']:.0f} ms at "
        f"{off[-1]['age']:,}, reopen {off[0]['reopen_ms']:.0f} -> {off[-1]['reopen_ms']:.0f} ms, "
        f"{off[-1]['live_files']:,} live files in one output"
    )
    result.plots.append(_plot(curves))
    return result


def _grow(ages: list[int], maintenance: Maintenance) -> list[dict[str, Any]]:
    points = []
    with workdir("growth") as base:
        lake = base / "lake"
        clock = [1_700_000_000_000]

        def now() -> int:
            clock[0] += 1000
            return clock[0]

        phases = _Phases()

        def open_pipeline() -> Pipeline:
            source = GeneratorSource(partitions=2, limit=10**12, seed=1)
            settings = Settings(max_batch=400, idle_interval=0.0)
            return Pipeline(
                "growth",
                lake,
                source,
                data_plane=LocalDataPlane(),
                settings=settings,
                maintenance=maintenance,
                now=now,
                on_step=phases.reached,
            )

        pipeline = open_pipeline()
        user = _UserTable(base / "user")
        steps: list[float] = []

        def step() -> None:
            started = phases.start()
            pipeline.step()
            steps.append(time.perf_counter() - started)
            user.keep_pace(len(steps), maintenance)

        def reopen() -> float:
            times = []
            for _ in range(_REOPENS):
                started = time.perf_counter()
                open_pipeline()
                times.append(time.perf_counter() - started)
            return statistics.median(times) * 1000

        for age in ages:
            while len(steps) < age - 1:
                step()
            before = reopen()
            step()
            after = reopen()
            largest = max(pipeline.sinks.values(), key=lambda s: len(DeltaTable(str(s.path)).file_uris()))
            points.append(
                {
                    "age": age,
                    "step_ms": statistics.median(steps[-_WINDOW:]) * 1000,
                    "step_p90_ms": sorted(steps[-_WINDOW:])[int(_WINDOW * 0.9)] * 1000,
                    "reopen_ms": before,
                    "reopen_after_maintenance_ms": after,
                    "live_files": len(DeltaTable(str(largest.path)).file_uris()),
                    "lake_files": sum(1 for _ in lake.rglob("*.parquet")),
                    "tables_committed": 1 + len(pipeline.sinks),
                    "user_commit_ms": user.median_append_ms(),
                    "phases_ms": phases.medians(),
                }
            )
            print(f"  {'on ' if maintenance.every else 'off'} {points[-1]}", flush=True)
    return points


class _Phases:
    """Where a step's time goes, from the pipeline's own step markers (``on_step``): probe and
    mint, read and write, the commits, and the rest; medians over the last window of steps."""

    def __init__(self) -> None:
        self.samples: list[dict[str, float]] = []
        self._last = 0.0

    def start(self) -> float:
        self._last = time.perf_counter()
        self.samples.append({})
        return self._last

    def reached(self, step: str) -> None:
        now = time.perf_counter()
        phase = "commits" if step.startswith("committed:") else step
        if self.samples:
            self.samples[-1][phase] = self.samples[-1].get(phase, 0.0) + now - self._last
        self._last = now

    def medians(self) -> dict[str, float]:
        window = self.samples[-_WINDOW:]
        names = sorted({name for sample in window for name in sample})
        return {name: round(statistics.median(s.get(name, 0.0) for s in window) * 1000, 1) for name in names}


class _UserTable:
    """The baseline: a Delta table a user appends 400 rows to with ``write_deltalake``, kept as old
    as the pipeline's outputs (one append per pipeline step) and maintained on the same schedule."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.rows = pa.table({"id": pa.array(range(400), pa.int64()), "payload": ["x" * 40] * 400})
        self.timings: list[float] = []

    def keep_pace(self, age: int, maintenance: Maintenance) -> None:
        if age == 1 and maintenance.every:
            # the same short log retention as the pipeline's tables, or its own log would slow it
            write_deltalake(self.path, self.rows.slice(0, 0), mode="append")
            set_retention(DeltaTable(self.path), maintenance.history_minutes)
        started = time.perf_counter()
        write_deltalake(self.path, self.rows, mode="append")
        self.timings.append(time.perf_counter() - started)
        if maintenance.every and age % maintenance.every == 0:
            table = DeltaTable(self.path)
            table.optimize.compact()
            table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
            table.create_checkpoint()

    def median_append_ms(self) -> float:
        return statistics.median(self.timings[-_WINDOW:]) * 1000


def _plot(curves: dict[str, list[dict[str, Any]]]) -> str:
    fig, (left, right) = figure(9.0, 3.6, columns=2)
    for label, points in curves.items():
        ages = [p["age"] for p in points]
        left.plot(ages, [p["step_ms"] for p in points], marker="o", label=f"step, {label}")
        left.plot(ages, [p["reopen_ms"] for p in points], marker="s", linestyle="--", label=f"reopen, {label}")
        right.plot(ages, [p["live_files"] for p in points], marker="o", label=label)
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xlabel("batches so far")
        axis.legend(fontsize=7)
    left.set_ylabel("ms (median)")
    right.set_ylabel("live files in the largest output")
    right.set_yscale("log")
    fig.suptitle("growth: cost per batch against the pipeline's age")
    return save_figure(fig, "growth.png")
