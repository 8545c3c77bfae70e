"""Scenario 2: stamping (the reclock rule) on Arrow batches against a bare numpy ``searchsorted``.

The bare baseline is the least work any implementation must do: one ``searchsorted`` of the
offsets into the binding uppers and a gather of the times, on numpy arrays already in hand. reclock's
:class:`~reclock.timeline.stamp.Stamper` does that plus what a real batch needs: reading the offset column
from Arrow and checking that every row belongs to the split's partition, which is the path the data
plane takes. Target: at least 0.5 x the bare rate with 10, 10^3 and 10^5 bindings.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from benchmarks.harness import Ratio, ScenarioResult, median_time
from reclock import Bindings, Frontier

__all__ = ["run"]


def run(full: bool = False) -> ScenarioResult:
    rows = 4_000_000 if full else 1_000_000
    runs = 7 if full else 5
    result = ScenarioResult("stamping")
    rates: dict[str, dict[int, float]] = {"reclock": {}, "bare numpy": {}}
    for n in (10, 1_000, 100_000):
        reclock_s, bare_s = _measure(n, rows, runs)
        rates["reclock"][n] = rows / reclock_s
        rates["bare numpy"][n] = rows / bare_s
        result.ratios.append(
            Ratio(
                f"stamp rate / bare searchsorted, {n:,} bindings",
                bare_s / reclock_s,
                0.5,
                detail=f"{rows / reclock_s / 1e6:.1f}M vs {rows / bare_s / 1e6:.1f}M rows/s over {rows:,} rows",
            )
        )
    result.measurements["rows_per_second"] = {k: {str(n): v for n, v in d.items()} for k, d in rates.items()}
    result.plots.append(_plot(rates))
    return result


def _measure(n: int, rows: int, runs: int) -> tuple[float, float]:
    """Median seconds to stamp ``rows`` Kafka-ordered rows against ``n`` bindings: reclock, bare."""
    bindings = Bindings()
    step = rows // n
    for i in range(n):
        bindings.mint(1_000 + i, Frontier({"gen-0": (i + 1) * step}))
    stamper = bindings.stamper()
    partitions = pa.array(["gen-0"] * rows, pa.string())  # what a source's split yields
    offsets = pa.array(np.arange(rows, dtype=np.int64))
    uppers = np.array([(i + 1) * step for i in range(n)], dtype=np.int64)
    times = np.arange(1_000, 1_000 + n, dtype=np.int64)
    offs = offsets.to_numpy()

    def bare() -> np.ndarray:
        return times[np.minimum(np.searchsorted(uppers, offs, side="right"), n - 1)]

    assert np.array_equal(stamper.into_times(partitions, offsets, partition="gen-0"), bare())
    reclock_s, _ = median_time(lambda: stamper.into_times(partitions, offsets, partition="gen-0"), runs)
    bare_s, _ = median_time(bare, runs)
    return reclock_s, bare_s


def _plot(rates: dict[str, dict[int, float]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.harness import RESULTS

    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{n:,}" for n in rates["reclock"]]
    x = np.arange(len(labels))
    for i, (name, by_n) in enumerate(rates.items()):
        ax.bar(x + (i - 0.5) * 0.38, [v / 1e6 for v in by_n.values()], 0.38, label=name)
    ax.set_xticks(x, labels)
    ax.set_xlabel("bindings")
    ax.set_ylabel("million rows / s")
    ax.set_title("Stamping throughput")
    ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "stamping.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
