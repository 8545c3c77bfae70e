"""Scenario 5: files. CSV and Parquet ingest against Spark Structured Streaming's file source.

The same files (JSON-event-like rows: 6 columns, about 90 bytes a CSV line) are written once as
CSV (with a header) and once as Parquet. Two contenders ingest each directory, alternating run by
run, on the one shared ``local[2]`` session:

* **reclock**: a :class:`~reclock.runtime.pipeline.Pipeline` over :class:`~reclock.sources.files.FilesSource` on
  the Spark data plane, stepping until every file is landed in its Delta output;
* **(c) Spark Structured Streaming** (``baselines/spark_file_stream.py``): ``readStream`` with the
  schema, ``writeStream.format("parquet")`` with its own checkpoint, ``trigger(availableNow)``;
* for the reading only, reclock on the in-driver plane (no Spark tasks): how much of reclock's time
  on Spark is per-task overhead rather than reading and writing.

Each contender is warmed up once on a one-file directory first (JVM code paths, codegen, Python
workers), then timed from start to its last commit. Rows are counted back from what each wrote.
Target: reclock >= 1.0 x Structured Streaming in rows per second, for CSV and for Parquet.
"""

from __future__ import annotations

import io
import itertools
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from benchmarks.baselines import spark_file_stream
from benchmarks.fixtures import EVENT_SCHEMA, event_values, spark, workdir
from benchmarks.harness import Ratio, ScenarioResult, figure, save_figure
from benchmarks.measure import alternate, load_average, median
from benchmarks.readback import delta_commits

__all__ = ["run"]

COLUMNS = {"id": "int64", "user": "string", "amount": "float64", "kind": "string", "page": "string", "ts": "int64"}
DDL = "id BIGINT, user STRING, amount DOUBLE, kind STRING, page STRING, ts BIGINT"
FORMATS = ("csv", "parquet")


def run(full: bool = False) -> ScenarioResult:
    files, rows_per_file = (40, 50_000) if full else (20, 25_000)
    runs = 5 if full else 3
    total = files * rows_per_file
    result = ScenarioResult("files")
    session = spark()
    rates: dict[str, dict[str, float]] = {}
    counter = itertools.count()
    with workdir("files") as root:
        _write_inputs(root, files, rows_per_file)
        for fmt in FORMATS:
            source_dir, warm_dir = root / fmt, root / f"{fmt}_warm"

            def reclock_run(src: Path = source_dir, fmt: str = fmt, n: int = total) -> float:
                return _reclock(session, src, fmt, root / f"lake_{fmt}_{next(counter)}", n)

            def local_run(src: Path = source_dir, fmt: str = fmt, n: int = total) -> float:
                return _reclock(None, src, fmt, root / f"lake_local_{fmt}_{next(counter)}", n)

            def spark_run(src: Path = source_dir, fmt: str = fmt, n: int = total) -> float:
                return _structured_streaming(session, src, fmt, root / f"sss_{fmt}_{next(counter)}", n)

            _reclock(session, warm_dir, fmt, root / f"lake_warm_{fmt}", rows_per_file)
            _structured_streaming(session, warm_dir, fmt, root / f"sss_warm_{fmt}", rows_per_file)
            contenders = {"reclock": reclock_run, "structured streaming (c)": spark_run, "reclock in-driver": local_run}
            times = alternate(contenders, runs)
            rates[fmt] = {name: total / median(secs) for name, secs in times.items()}
            result.measurements[fmt] = {
                "seconds": {name: [round(s, 3) for s in secs] for name, secs in times.items()},
                "rows_per_second": {name: round(r) for name, r in rates[fmt].items()},
                "input_mib": round(sum(f.stat().st_size for f in source_dir.iterdir()) / 2**20, 1),
            }
            r, s = rates[fmt]["reclock"], rates[fmt]["structured streaming (c)"]
            result.ratios.append(
                Ratio(
                    f"reclock / Structured Streaming file source, {fmt}",
                    r / s,
                    1.0,
                    detail=f"{r:,.0f} vs {s:,.0f} rows/s, {files} files x {rows_per_file:,} rows",
                )
            )
    result.measurements.update(files=files, rows_per_file=rows_per_file, runs=runs, load_average=load_average())
    result.plots.append(_plot(rates))
    return result


def _write_inputs(root: Path, files: int, rows_per_file: int) -> None:
    """The same rows as CSV (header) and as Parquet; plus a one-file warm-up directory of each."""
    for fmt in FORMATS:
        (root / fmt).mkdir()
        (root / f"{fmt}_warm").mkdir()
    for i in range(files + 1):
        values = event_values(i * rows_per_file, rows_per_file, ts=1_700_000_000_000 + i)
        table = pa_json.read_json(
            io.BytesIO(b"\n".join(values)), parse_options=pa_json.ParseOptions(explicit_schema=EVENT_SCHEMA)
        )
        name = f"part-{i:04d}" if i < files else "warm"
        where = "" if i < files else "_warm"
        pa_csv.write_csv(table, root / f"csv{where}" / f"{name}.csv")
        pq.write_table(table, root / f"parquet{where}" / f"{name}.parquet")


def _reclock(session: Any | None, source_dir: Path, fmt: str, lake: Path, expected: int) -> float:
    from reclock.runtime.pipeline import Pipeline
    from reclock.runtime.planes import LocalDataPlane, SparkDataPlane
    from reclock.sources.files import FilesSource

    started = time.perf_counter()
    source = FilesSource(path=str(source_dir), format=fmt, output="events", columns=COLUMNS if fmt == "csv" else None)
    plane = SparkDataPlane(session) if session is not None else LocalDataPlane()
    pipeline = Pipeline("files", lake, source, data_plane=plane)
    rows: Counter[str] = Counter()
    while rows["events"] < expected:
        report = pipeline.step()
        rows.update(report.rows)
        if report.idle and rows["events"] < expected:
            raise AssertionError(f"reclock went idle with {rows['events']} of {expected} rows landed")
    seconds = time.perf_counter() - started
    landed = sum(c.rows for c in delta_commits(pipeline.sinks["events"].path))
    errors = sum(c.rows for c in delta_commits(pipeline.sinks["_errors"].path))
    assert landed == expected and errors == 0, f"reclock landed {landed} rows (+{errors} errors) of {expected}"
    return seconds


def _structured_streaming(session: Any, source_dir: Path, fmt: str, out: Path, expected: int) -> float:
    started = time.perf_counter()
    spark_file_stream.run(session, source_dir, fmt, DDL, out / "table", out / "checkpoint")
    seconds = time.perf_counter() - started
    landed = session.read.parquet(str(out / "table")).count()
    assert landed == expected, f"structured streaming landed {landed} of {expected}"
    return seconds


def _plot(rates: dict[str, dict[str, float]]) -> str:
    import numpy as np

    fig, ax = figure(6, 3.5)
    names = ["reclock", "structured streaming (c)", "reclock in-driver"]
    x = np.arange(len(FORMATS))
    for i, name in enumerate(names):
        ax.bar(x + (i - 1) * 0.27, [rates[f][name] / 1e3 for f in FORMATS], 0.27, label=name)
    ax.set_xticks(x, list(FORMATS))
    ax.set_ylabel("thousand rows / s")
    ax.set_title("File ingest on local[2]: reclock vs Structured Streaming")
    ax.legend()
    return save_figure(fig, "files.png")
