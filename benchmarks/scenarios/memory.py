"""Scenario 6: memory. Peak RSS when the input grows 10 x, with bounded batches.

The job is ``python -m reclock.cli start`` in a fresh process, reading the generator (4
partitions, everything available at once) to its end with the same ``max_batch``, once with the
base input and once with 10 x as many records. Two numbers per run:

* **driver**: the job process's own peak RSS (``VmHWM``, its high-water mark, read by the process
  itself at exit, so no peak between samples is missed);
* **process tree**: the driver plus everything it started (the Spark JVM and its Python workers),
  sampled every 0.1 s from ``/proc``; the peak of the sum.

Both planes are measured: on the Spark plane the driver only plans and commits (tasks hold the
data); on the in-driver plane the driver holds every batch itself, so that is where ``max_batch``
must keep memory flat. Target: peak(10 x) / peak(1 x) < 1.3 for the driver on each plane.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.fixtures import workdir
from benchmarks.harness import Ratio, ScenarioResult, figure, save_figure
from benchmarks.measure import TreeSampler, load_average, median

__all__ = ["run"]

# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child forked from a big parent
# would report the parent's size; VmHWM belongs to the process's own address space.
_DRIVER = """
import sys
from reclock.cli.main import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    hwm = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print("maxrss_kib", hwm, file=sys.stderr, flush=True)
sys.exit(code)
"""


def run(full: bool = False) -> ScenarioResult:
    base = 400_000 if full else 200_000
    max_batch = 100_000
    repeats = 2 if full else 1
    result = ScenarioResult("memory")
    peaks: dict[str, dict[int, dict[str, float]]] = {}
    for engine in ("spark", "local"):
        peaks[engine] = {}
        for records in (base, base * 10):
            runs = [_job(engine, records, max_batch) for _ in range(repeats)]
            peaks[engine][records] = {
                key: median([r[key] for r in runs]) for key in ("driver_mib", "tree_mib", "seconds")
            }
        small, big = peaks[engine][base], peaks[engine][base * 10]
        result.ratios.append(
            Ratio(
                f"driver peak RSS at 10x input / at 1x, {engine} plane",
                big["driver_mib"] / small["driver_mib"],
                1.3,
                lower_is_better=True,
                detail=f"{big['driver_mib']:.0f} vs {small['driver_mib']:.0f} MiB ({base * 10:,} vs {base:,} records, "
                f"max_batch {max_batch:,})",
            )
        )
        result.ratios.append(
            Ratio(
                f"process tree peak RSS at 10x input / at 1x, {engine} plane",
                big["tree_mib"] / small["tree_mib"],
                1.3,
                lower_is_better=True,
                detail=f"{big['tree_mib']:.0f} vs {small['tree_mib']:.0f} MiB (driver + JVM + Python workers)"
                if engine == "spark"
                else f"{big['tree_mib']:.0f} vs {small['tree_mib']:.0f} MiB",
            )
        )
    result.measurements.update(
        max_batch=max_batch,
        peaks={e: {str(n): v for n, v in by_n.items()} for e, by_n in peaks.items()},
        load_average=load_average(),
    )
    result.plots.append(_plot(peaks))
    return result


def _job(engine: str, records: int, max_batch: int) -> dict[str, Any]:
    """Run one generator job to its end in a fresh process; its peaks and wall time."""
    from reclock.job import lifecycle
    from reclock.job.config import parse_config
    from reclock.persist.lake import Lake

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with workdir(f"memory-{engine}") as root:
        lake = Lake.at(root / "lake")
        lifecycle.create(
            parse_config(
                {
                    "pipeline": {"name": "mem", "lake": str(lake.root), "engine": engine, "max_batch": max_batch},
                    "spark": {"master": "local[2]"},
                    "source": {"kind": "generator", "partitions": 4, "limit": records},
                }
            )
        )
        cmd = [sys.executable, "-c", _DRIVER, "--lake", str(lake.root), "start", "mem"]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        with TreeSampler(proc.pid) as sampler:
            _, err = proc.communicate(timeout=900)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"memory job ({engine}, {records}) failed: {err[-2000:]}")
        maxrss = int(next(line.split()[1] for line in err.splitlines() if line.startswith("maxrss_kib")))
    return {"driver_mib": maxrss / 1024, "tree_mib": sampler.peak_tree_mib, "seconds": seconds}


def _plot(peaks: dict[str, dict[int, dict[str, float]]]) -> str:
    fig, ax = figure()
    for i, (engine, by_n) in enumerate(peaks.items()):
        sizes = sorted(by_n)
        ax.plot(sizes, [by_n[n]["driver_mib"] for n in sizes], "-o", color=f"C{i}", label=f"{engine} plane: driver")
        ax.plot(
            sizes,
            [by_n[n]["tree_mib"] for n in sizes],
            "--s",
            color=f"C{i}",
            alpha=0.6,
            label=f"{engine} plane: process tree",
        )
    ax.set_xscale("log")
    ax.set_xlabel("records ingested (max_batch fixed)")
    ax.set_ylabel("peak RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title("Peak memory against input size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, "memory.png")
