"""``python -m benchmarks.shaping_engine [--rows N ...] [--repeat R]``: which SQL engine shapes batches.

A per-output SQL transform runs once per batch in every task, in the driver and in Spark's Python
workers, so the engine is chosen on what a task pays: the cold cost of a fresh worker (import the
engine, open a connection, run the first query), the fixed cost of one query on a one-row batch,
and rows a second on batches of realistic sizes (an auction bid: five numbers, two strings and
the lineage columns). Both candidates take Arrow in and give Arrow out; Spark SQL cannot run
inside a task and is not measured. Printed as a markdown table; the reading is in
``docs/design/20261123_shaping_engine.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

QUERY = (
    "SELECT auction, bidder, price * 1000 / bidder AS per_mille, upper(channel) AS channel FROM input WHERE price > 100"
)
FAILING = "SELECT auction, price / (bidder - bidder) AS boom FROM input"

_COLD = {
    "duckdb": (
        "import time; t = time.perf_counter(); import duckdb, pyarrow as pa; c = duckdb.connect();"
        "input = pa.table({'a': [1]}); c.execute('SELECT a FROM input').to_arrow_table();"
        "print(time.perf_counter() - t)"
    ),
    "datafusion": (
        "import time; t = time.perf_counter(); import datafusion, pyarrow as pa; c = datafusion.SessionContext();"
        "c.register_record_batches('input', [pa.table({'a': [1]}).to_batches()]);"
        "c.sql('SELECT a FROM input').to_arrow_table(); print(time.perf_counter() - t)"
    ),
}


def bids(rows: int, seed: int = 7) -> pa.Table:
    """A batch as a task sees it: lineage, then a bid's columns."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "_partition": pa.array(["bids-0"] * rows),
            "_offset": pa.array(np.arange(rows, dtype=np.int64)),
            "_into_ts": pa.array(np.full(rows, 1_790_000_000_000, dtype=np.int64)),
            "auction": pa.array(rng.integers(1000, 2000, rows)),
            "bidder": pa.array(rng.integers(1, 10_000, rows)),
            "price": pa.array(rng.integers(1, 10_000, rows)),
            "channel": pa.array(rng.choice(["apple", "google", "facebook", "baidu"], rows)),
            "url": pa.array([f"https://www.nexmark.com/item.htm?query=1&channel_id={i}" for i in range(rows)]),
        }
    )


def duckdb_runner() -> Callable[[pa.Table, str], pa.Table]:
    import duckdb

    conn = duckdb.connect()

    def run(batch: pa.Table, sql: str) -> pa.Table:
        conn.register("input", batch)
        try:
            return conn.execute(sql).to_arrow_table()
        finally:
            conn.unregister("input")

    return run


def datafusion_runner(partitions: int | None = None) -> Callable[[pa.Table, str], pa.Table]:
    """``partitions``: how many threads a query may use (a Spark task has one core); default all."""
    import datafusion

    config = datafusion.SessionConfig()
    if partitions is not None:
        config = config.with_target_partitions(partitions)
    ctx = datafusion.SessionContext(config)

    def run(batch: pa.Table, sql: str) -> pa.Table:
        ctx.register_record_batches("input", [batch.to_batches()])
        try:
            return ctx.sql(sql).to_arrow_table()
        finally:
            ctx.deregister_table("input")

    return run


def timed(run: Callable[[pa.Table, str], pa.Table], batch: pa.Table, sql: str, repeat: int) -> float:
    """Median seconds of ``repeat`` runs (a failing query counts until it raises)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        with contextlib.suppress(Exception):  # the failing query: what a failure costs is the point
            run(batch, sql)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def cold(engine: str, repeat: int = 3) -> float:
    """Median seconds a fresh interpreter takes to import, connect and answer its first query."""
    runs = [
        float(subprocess.run([sys.executable, "-c", _COLD[engine]], capture_output=True, text=True, check=True).stdout)
        for _ in range(repeat)
    ]
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shaping_engine")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 1_000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    runners = {
        "duckdb": duckdb_runner(),
        "datafusion": datafusion_runner(),
        "datafusion, 1 partition": datafusion_runner(1),
    }
    print(
        "| engine | cold worker (s) | "
        + " | ".join(f"{n:,} rows: ms, rows/s" for n in args.rows)
        + " | failing query, 10,000 rows (ms) |"
    )
    print("|---" * (len(args.rows) + 3) + "|")
    failing = bids(10_000)
    for engine, run in runners.items():
        cells = []
        for rows in args.rows:
            batch = bids(rows)
            run(batch, QUERY)  # warm: plans and caches of the first query are the cold cost
            seconds = timed(run, batch, QUERY, args.repeat)
            cells.append(f"{seconds * 1000:.2f}, {rows / seconds:,.0f}")
        fail_ms = timed(run, failing, FAILING, args.repeat) * 1000
        print(
            f"| {engine} | {cold(engine.split(',')[0]):.2f} | " + " | ".join(cells) + f" | {fail_ms:.2f} |", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
