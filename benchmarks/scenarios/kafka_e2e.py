"""Scenario 1: Kafka to Delta end to end, JSON decode, two outputs (two topics).

The data (JSON events of about 100 bytes, round-robin over 4 partitions per topic) is produced
once, before anything is timed. Then three contenders land the very same offset ranges, alternating
run by run, and each run is checked by reading its tables' Delta logs back:

* **reclock**: a :class:`~reclock.pipeline.Pipeline` over a :class:`~sources.kafka.KafkaSource`
  (``format="json"``) on the Spark data plane (``local[2]``), default settings, stepping until
  every output holds the produced end offsets; the Kafka consumer group is committed as usual.
* **(a) raw client** (``baselines/raw_client.py``): kafka-python reading the same ranges in the same
  kind of Spark tasks on the same session, counting rows and nothing else: the client's limit.
* **(b) naive pipeline** (``baselines/naive_pipeline.py``): one process polling kafka-python,
  ``write_deltalake`` per poll and topic, committing group offsets.

Targets: reclock / (a) >= 0.85 and reclock / (b) >= 2, on medians of rows per second. Each run is
timed from the moment the contender starts (tables created, consumers connected) to the moment
its last commit is visible, so fixed costs count.

``BENCH_PROFILE=1`` adds one profiled reclock run: py-spy samples the driver and every Spark
Python worker (``--subprocesses``) and writes ``results/kafka_e2e_profile.txt`` (collapsed stacks)
, ``results/kafka_e2e_profile.svg`` (a flame graph) and ``results/kafka_e2e_profile_summary.txt``
(where the CPU went, per process kind; see :func:`benchmarks.common.summarize_profile`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.baselines import naive_pipeline, raw_client
from benchmarks.common import (
    EVENT_SCHEMA,
    alternate,
    broker,
    delta_commits,
    event_values,
    figure,
    kafka_python_decode,
    lean_decode,
    load_average,
    median,
    produced,
    record_batches,
    save_figure,
    spark,
    summarize_profile,
    tree_cpu_seconds,
    workdir,
)
from benchmarks.harness import RESULTS, Ratio, ScenarioResult, median_time

__all__ = ["run"]

PARTITIONS = 4


def run(full: bool = False) -> ScenarioResult:
    per_topic = 1_000_000 if full else 200_000
    runs = 7 if full else 5
    result = ScenarioResult("kafka_e2e")
    bootstrap = broker().bootstrap
    started = time.monotonic()
    topics, ends = produced(per_topic, PARTITIONS)
    produce_s = time.monotonic() - started
    total = sum(sum(parts.values()) for parts in ends.values())
    session = spark()

    counter = iter(range(1_000_000))
    timelines: dict[str, list[list[tuple[float, int]]]] = {
        "reclock": [],
        "reclock: rows in task files, not yet committed": [],
        "raw client (a)": [],
        "naive (b)": [],
    }

    def reclock_run() -> float:
        seconds, timeline, tasks = _reclock(session, bootstrap, topics, ends, next(counter))
        timelines["reclock"].append(timeline)
        timelines["reclock: rows in task files, not yet committed"].append(tasks)
        return seconds

    def raw_run() -> float:
        ranges = [(t, p, 0, end) for t, parts in ends.items() for p, end in sorted(parts.items())]
        t0 = time.monotonic()
        count = raw_client.run(session, bootstrap, ranges)
        seconds = time.monotonic() - t0
        assert count == total, f"raw client read {count} of {total} records"
        timelines["raw client (a)"].append([(0.0, 0), (seconds, count)])
        return seconds

    def naive_run() -> float:
        with workdir("naive") as lake:
            commits: list[tuple[float, int]] = []
            t0 = time.monotonic()
            rows = naive_pipeline.run(bootstrap, ends, lake, EVENT_SCHEMA, f"naive-{next(counter)}", commits)
            seconds = time.monotonic() - t0
            landed = sum(c.rows for t in topics for c in delta_commits(lake / t))
            assert rows == landed == total, f"naive pipeline landed {landed} (reported {rows}) of {total}"
        timelines["naive (b)"].append([(0.0, 0)] + [(t - t0, n) for t, n in commits])
        return seconds

    cpu: dict[str, list[float]] = {}

    def with_cpu(name: str, fn: Any) -> Any:
        def call() -> float:
            before = tree_cpu_seconds()
            seconds = fn()
            cpu.setdefault(name, []).append(tree_cpu_seconds() - before)
            return seconds

        return call

    contenders = {"reclock": reclock_run, "raw client (a)": raw_run, "naive (b)": naive_run}
    times = alternate({name: with_cpu(name, fn) for name, fn in contenders.items()}, runs)
    rates = {name: total / median(secs) for name, secs in times.items()}
    result.ratios.append(
        Ratio(
            "reclock / raw client (a), rows/s",
            rates["reclock"] / rates["raw client (a)"],
            0.85,
            detail=f"{rates['reclock']:,.0f} vs {rates['raw client (a)']:,.0f} rows/s over {total:,} records",
        )
    )
    result.ratios.append(
        Ratio(
            "reclock / naive pipeline (b), rows/s",
            rates["reclock"] / rates["naive (b)"],
            2.0,
            detail=f"{rates['reclock']:,.0f} vs {rates['naive (b)']:,.0f} rows/s over {total:,} records",
        )
    )
    result.measurements.update(
        records=total,
        partitions_per_topic=PARTITIONS,
        produce_seconds=round(produce_s, 2),
        runs=runs,
        seconds={name: [round(s, 3) for s in secs] for name, secs in times.items()},
        rows_per_second={name: round(r) for name, r in rates.items()},
        cpu_seconds={name: [round(c, 2) for c in values] for name, values in cpu.items()},
        rows_per_cpu_second={name: round(total / median(values)) for name, values in cpu.items()},
        load_average=load_average(),
    )
    result.notes.append(
        "rows per CPU-second (driver, JVM, Python workers and broker; contention-independent): "
        + ", ".join(f"{name} {total / median(values):,.0f}" for name, values in cpu.items())
    )
    chosen = {}
    for name, key in (
        ("reclock", "reclock"),
        ("reclock: rows in task files, not yet committed", "reclock"),
        ("raw client (a): rows counted", "raw client (a)"),
        ("naive (b)", "naive (b)"),
    ):
        secs = times[key]
        middle = sorted(range(len(secs)), key=secs.__getitem__)[len(secs) // 2]
        chosen[name] = timelines[name if name in timelines else key][middle]
    result.plots.append(_plot(chosen, total))
    decode = _record_decoding()
    result.measurements["record_batch_decode_rows_per_s"] = decode
    result.notes.append(
        "parsing 50,000 records from v2 record batches in one process: kafka-python's record classes "
        f"{decode['kafka-python records']:,.0f}/s, a lean Python loop {decode['lean loop']:,.0f}/s "
        f"({decode['lean loop'] / decode['kafka-python records']:.1f}x); KafkaConsumer.poll end to end is slower "
        "still (see the profile)"
    )
    if os.environ.get("BENCH_PROFILE"):
        result.notes.append(_profile(session, bootstrap, topics, ends))
    return result


def _reclock(
    session: Any, bootstrap: str, topics: list[str], ends: dict[str, dict[int, int]], i: int
) -> tuple[float, list[tuple[float, int]], list[tuple[float, int]]]:
    """One reclock run into a fresh lake: seconds until every output holds every record.

    Also returns two timelines ``(seconds, rows)``: rows committed after each step, and rows in
    parquet files as each Spark task finished (written, not yet visible).
    """
    from reclock.dataplane import SparkDataPlane
    from reclock.pipeline import Pipeline
    from reclock.sources.kafka import KafkaSource

    want = {(t, p): end for t, parts in ends.items() for p, end in parts.items()}
    total = sum(want.values())
    with workdir("reclock") as lake:
        t0, wall0 = time.monotonic(), time.time()
        tasks: list[tuple[float, int]] = []
        source = KafkaSource(bootstrap, topics=topics, format="json", schema=EVENT_SCHEMA, group_id=f"reclock-{i}")
        pipeline = Pipeline("e2e", lake, source, data_plane=SparkDataPlane(session))
        timeline = [(0.0, 0)]
        rows = Counter()
        try:
            while not all(pipeline.resume_frontier().offset(p) >= end for p, end in want.items()):
                report = pipeline.step()
                rows.update(report.rows)
                tasks += [((r.started_ms + r.duration_ms) / 1000 - wall0, r.rows) for r in report.results]
                timeline.append((time.monotonic() - t0, sum(v for k, v in rows.items() if k != "_errors")))
        finally:
            source.close()
        seconds = time.monotonic() - t0
        landed = {name: sum(c.rows for c in delta_commits(sink.path)) for name, sink in pipeline.sinks.items()}
        assert landed.pop("_errors") == 0, "reclock wrote error rows"
        assert sum(landed.values()) == total, f"reclock landed {landed} of {total}"
    done = list(itertools.accumulate(n for _, n in sorted(tasks)))
    return seconds, timeline, [(0.0, 0)] + [(t, n) for (t, _), n in zip(sorted(tasks), done, strict=True)]


def _record_decoding() -> dict[str, float]:
    """Records per second parsing the same wire bytes: kafka-python's classes vs a lean loop."""
    values = event_values(0, 50_000)
    buf = record_batches(values)
    out = {}
    for name, fn in (("kafka-python records", kafka_python_decode), ("lean loop", lean_decode)):
        offsets, decoded = fn(buf)
        assert offsets == list(range(len(values))) and decoded == values, name
        seconds, _ = median_time(lambda fn=fn: fn(buf), 5)
        out[name] = round(len(values) / seconds)
    return out


def _plot(timelines: dict[str, list[tuple[float, int]]], total: int) -> str:
    """One run per contender (its median run): rows committed against time."""
    fig, ax = figure()
    styles = {
        "reclock": ("C0", "-", "."),
        "reclock: rows in task files, not yet committed": ("C0", ":", ""),
        "raw client (a): rows counted": ("C2", "-", "o"),
        "naive (b)": ("C3", "-", "."),
    }
    for name, timeline in timelines.items():
        color, line, marker = styles[name]
        xs, ys = zip(*timeline, strict=True)
        ax.step(xs, [y / 1e3 for y in ys], where="post", color=color, linestyle=line, marker=marker, label=name)
    ax.set_xlabel("seconds since the contender started (median run of each)")
    ax.set_ylabel("thousand rows")
    ax.set_title(f"Kafka to Delta, {total:,} JSON records, 2 topics x {PARTITIONS} partitions")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, "kafka_e2e.png")


def _profile(session: Any, bootstrap: str, topics: list[str], ends: dict[str, dict[int, int]]) -> str:
    """One reclock run under py-spy (driver and Spark Python workers); writes the profile files."""
    local = Path(sys.executable).with_name("py-spy")
    py_spy = str(local) if local.exists() else shutil.which("py-spy") or "py-spy"
    outputs = []
    for fmt, name in (("raw", "kafka_e2e_profile.txt"), ("flamegraph", "kafka_e2e_profile.svg")):
        path = RESULTS / name
        cmd = [py_spy, "record", "--pid", str(os.getpid()), "--subprocesses", "--rate", "200"]
        cmd += ["--format", fmt, "--output", str(path)]
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # let py-spy attach
        seconds, _, _ = _reclock(session, bootstrap, topics, ends, 10_000 + len(outputs))
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        if spy.returncode not in (0, -signal.SIGINT) and not path.exists():
            return f"py-spy failed ({spy.returncode}): {err[-500:]}"
        outputs.append(f"{path.name} ({seconds:.1f} s run)")
    summary = RESULTS / "kafka_e2e_profile_summary.txt"
    summary.write_text(summarize_profile(RESULTS / "kafka_e2e_profile.txt"))
    outputs.append(summary.name)
    return "profile written: " + ", ".join(outputs)
