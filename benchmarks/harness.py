"""What every scenario shares: timing, results, the machine, and the report files.

These machines are noisy (2 shared cores), so a scenario never reports an absolute time as its
verdict: it measures reclock and a baseline in the same run, alternating, several times, and reports
the ratio of medians against its target. Results go to ``benchmarks/results/<scenario>.json``, a
markdown table (``results.md``) and PNG plots that a person would rather look at than read.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "Ratio", "ScenarioResult", "figure", "machine", "median_time", "save_figure", "write_report"]

RESULTS = Path(__file__).parent / "results"


@dataclass
class Ratio:
    """``value`` (reclock / baseline, higher is better unless ``lower_is_better``) against a target."""

    name: str
    value: float
    target: float
    lower_is_better: bool = False
    detail: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.target if self.lower_is_better else self.value >= self.target

    def line(self) -> str:
        op = "<=" if self.lower_is_better else ">="
        verdict = "MET" if self.met else "MISSED"
        return f"{self.name}: {self.value:.2f} (target {op} {self.target:g}) {verdict}  {self.detail}".rstrip()


@dataclass
class ScenarioResult:
    scenario: str
    ratios: list[Ratio] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=lambda: machine())

    def save(self) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"{self.scenario}.json"
        data = asdict(self)
        for ratio, raw in zip(self.ratios, data["ratios"], strict=True):
            raw["met"] = ratio.met
        path.write_text(json.dumps(data, indent=1, default=str))
        return path


def median_time(fn: Callable[[], Any], runs: int) -> tuple[float, list[float]]:
    """Median wall time of ``runs`` calls (and all of them), after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def machine() -> dict[str, Any]:
    """Enough about the machine to read a result: cores, memory, CPU, versions."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    for module in ("pyspark", "deltalake", "kafka", "pyarrow", "numpy"):
        try:
            info[module] = __import__(module).__version__
        except Exception:
            info[module] = None
    try:
        info["java"] = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except (OSError, IndexError):
        info["java"] = None
    return info


def write_report(results: list[ScenarioResult]) -> Path:
    """The markdown table of every ratio, plus the machine, next to the JSON files."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = ["| scenario | ratio | value | target | verdict | detail |", "|---|---|---|---|---|---|"]
    for result in results:
        for r in result.ratios:
            op = "<=" if r.lower_is_better else ">="
            lines.append(
                f"| {result.scenario} | {r.name} | {r.value:.2f} | {op} {r.target:g} | "
                f"{'met' if r.met else '**missed**'} | {r.detail} |"
            )
    if results:
        m = results[0].machine
        lines += [
            "",
            f"Machine: {m.get('cpus')} cores, {m.get('mem_gib')} GiB, {m.get('cpu')}; "
            f"Python {m.get('python')}, pyspark {m.get('pyspark')}, deltalake {m.get('deltalake')}, "
            f"kafka-python {m.get('kafka')}, pyarrow {m.get('pyarrow')}.",
        ]
    path = RESULTS / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def figure(width: float = 6.5, height: float = 3.8, columns: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=(width, height))


def save_figure(fig: Any, name: str) -> str:
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
