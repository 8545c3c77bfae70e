"""Scenario 1: Kafka to Delta end to end, JSON decode, two outputs (two topics).

The data (JSON events of about 100 bytes, round-robin over 4 partitions per topic) is produced
once, before anything is timed. Then six contenders read the very same offset ranges, alternating
run by run; each run is checked against what was produced (the Delta logs of its tables for those
that land data, the count for those that only read):

* **reclock on Spark**: a :class:`~reclock.runtime.pipeline.Pipeline` over a
  :class:`~reclock.sources.kafka.KafkaSource` (``format="json"``) on the Spark data plane (``local[2]``),
  default settings, stepping until every output holds the produced end offsets; the Kafka consumer
  group is committed as usual (:func:`benchmarks.landing.land`).
* **reclock in-driver**: the same pipeline with ``data_plane=LocalDataPlane()``: no Spark at all.
* **(a) raw client** (``baselines/raw_client.py``): kafka-python reading the same ranges in the same
  kind of Spark tasks on the same session, counting rows and nothing else: the client's limit.
* **(b) naive pipeline** (``baselines/naive_pipeline.py``): one process polling kafka-python,
  ``write_deltalake`` per poll and topic, committing group offsets.
* **(d) confluent consume** (``baselines/confluent_consume.py``): one librdkafka consumer,
  ``consume(10000)`` to the ends, counting only: the fastest client doing nothing else.
* **(e) confluent pipeline** (``baselines/confluent_pipeline.py``): (b) on librdkafka, one
  ``pyarrow.json`` parse and one ``write_deltalake`` per topic per consume batch.

Targets, on medians of rows per second: reclock on Spark / (a) >= 0.85, / (b) >= 2, / (e) >= 1.5
and / (d) >= 1.0; reclock in-driver / (e) >= 1.0. Rows per CPU-second of the whole process tree
(driver, JVM, Spark's Python workers, the broker) >= 2x the last recorded reclock number
(:data:`RECORDED_ROWS_PER_CPU_SECOND`), on both planes. Each run is timed from the moment the
contender starts (tables created, consumers connected) to the moment its last commit is visible,
so fixed costs count.

``BENCH_PROFILE=1`` adds one profiled reclock run: py-spy samples the driver and every Spark
Python worker (``--subprocesses``) and writes ``results/kafka_e2e_profile.txt`` (collapsed stacks)
, ``results/kafka_e2e_profile.svg`` (a flame graph) and ``results/kafka_e2e_profile_summary.txt``
(where the CPU went, per process kind; see :func:`benchmarks.profiling.summarize_profile`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.baselines import confluent_consume, confluent_pipeline, naive_pipeline, raw_client
from benchmarks.fixtures import EVENT_SCHEMA, broker, event_values, produced, spark, workdir
from benchmarks.harness import RESULTS, Ratio, ScenarioResult, figure, median_time, save_figure
from benchmarks.landing import land
from benchmarks.measure import alternate, load_average, median, tree_cpu_seconds
from benchmarks.profiling import summarize_profile
from benchmarks.readback import delta_commits
from benchmarks.record_batches import kafka_python_decode, lean_decode, record_batches

__all__ = ["run"]

PARTITIONS = 4

#: Rows per CPU-second of reclock on Spark in the last recorded run before issue 14 (docs/benchmarks.md,
#: "After the restructuring of issue 10", 2026-11-23: reclock 51,613, raw client 58,480, naive 56,417).
#: CPU time depends much less on the neighbours than wall time, so this one target is set against a
#: recorded number rather than a contender of the same run.
RECORDED_ROWS_PER_CPU_SECOND = 51_613

SPARK, LOCAL = "reclock, Spark", "reclock, in-driver"
RAW, NAIVE = "raw client (a)", "naive (b)"
CONSUME, PIPELINE = "confluent consume (d)", "confluent pipeline (e)"
WRITTEN = "reclock, Spark: rows in task files, not yet committed"


def run(full: bool = False) -> ScenarioResult:
    from reclock.runtime.planes import LocalDataPlane, SparkDataPlane

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
    timelines: dict[str, list[list[tuple[float, int]]]] = {}

    def landed_by_reclock(name: str, plane: Any) -> Any:
        def call() -> float:
            landing = land(plane, bootstrap, topics, ends, f"reclock-{next(counter)}")
            timelines.setdefault(name, []).append(landing.committed)
            if name == SPARK:
                timelines.setdefault(WRITTEN, []).append(landing.written)
            return landing.seconds

        return call

    def raw_run() -> float:
        ranges = [(t, p, 0, end) for t, parts in ends.items() for p, end in sorted(parts.items())]
        t0 = time.monotonic()
        count = raw_client.run(session, bootstrap, ranges)
        seconds = time.monotonic() - t0
        assert count == total, f"raw client read {count} of {total} records"
        timelines.setdefault(RAW, []).append([(0.0, 0), (seconds, count)])
        return seconds

    def consume_run() -> float:
        progress: list[tuple[float, int]] = []
        t0 = time.monotonic()
        count = confluent_consume.run(bootstrap, ends, progress)
        seconds = time.monotonic() - t0
        assert count == total, f"confluent consume read {count} of {total} records"
        timelines.setdefault(CONSUME, []).append([(0.0, 0)] + [(t - t0, n) for t, n in progress])
        return seconds

    def landed_by_hand(name: str, baseline: Any) -> Any:
        def call() -> float:
            with workdir("baseline") as lake:
                commits: list[tuple[float, int]] = []
                t0 = time.monotonic()
                rows = baseline.run(bootstrap, ends, lake, EVENT_SCHEMA, f"baseline-{next(counter)}", commits)
                seconds = time.monotonic() - t0
                landed = sum(c.rows for t in topics for c in delta_commits(lake / t))
                assert rows == landed == total, f"{name} landed {landed} (reported {rows}) of {total}"
            timelines.setdefault(name, []).append([(0.0, 0)] + [(t - t0, n) for t, n in commits])
            return seconds

        return call

    cpu: dict[str, list[float]] = {}

    def with_cpu(name: str, fn: Any) -> Any:
        def call() -> float:
            before = tree_cpu_seconds()
            seconds = fn()
            cpu.setdefault(name, []).append(tree_cpu_seconds() - before)
            return seconds

        return call

    contenders = {
        SPARK: landed_by_reclock(SPARK, SparkDataPlane(session)),
        LOCAL: landed_by_reclock(LOCAL, LocalDataPlane()),
        RAW: raw_run,
        NAIVE: landed_by_hand(NAIVE, naive_pipeline),
        CONSUME: consume_run,
        PIPELINE: landed_by_hand(PIPELINE, confluent_pipeline),
    }
    times = alternate({name: with_cpu(name, fn) for name, fn in contenders.items()}, runs)
    rates = {name: total / median(secs) for name, secs in times.items()}
    per_cpu = {name: total / median(values) for name, values in cpu.items()}
    over = f"rows/s over {total:,} records"
    for name, reclock, baseline, target in (
        ("reclock / raw client (a), rows/s", SPARK, RAW, 0.85),
        ("reclock / naive pipeline (b), rows/s", SPARK, NAIVE, 2.0),
        ("reclock on Spark / confluent pipeline (e), rows/s", SPARK, PIPELINE, 1.5),
        ("reclock on Spark / confluent consume-only (d), rows/s", SPARK, CONSUME, 1.0),
        ("reclock in-driver / confluent pipeline (e), rows/s", LOCAL, PIPELINE, 1.0),
    ):
        detail = f"{rates[reclock]:,.0f} vs {rates[baseline]:,.0f} {over}"
        result.ratios.append(Ratio(name, rates[reclock] / rates[baseline], target, detail=detail))
    for name, plane in ((SPARK, "on Spark"), (LOCAL, "in-driver")):
        result.ratios.append(
            Ratio(
                f"reclock {plane}: rows per CPU-second / recorded reclock ({RECORDED_ROWS_PER_CPU_SECOND:,})",
                per_cpu[name] / RECORDED_ROWS_PER_CPU_SECOND,
                2.0,
                detail=f"{per_cpu[name]:,.0f} rows per CPU-second of driver, JVM, Python workers and broker",
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
        rows_per_cpu_second={name: round(r) for name, r in per_cpu.items()},
        recorded_rows_per_cpu_second=RECORDED_ROWS_PER_CPU_SECOND,
        load_average=load_average(),
    )
    result.notes.append(
        "rows per CPU-second (driver, JVM, Python workers and broker; contention-independent): "
        + ", ".join(f"{name} {r:,.0f}" for name, r in per_cpu.items())
    )
    chosen = {}
    for name in timelines:
        secs = times[SPARK if name == WRITTEN else name]
        middle = sorted(range(len(secs)), key=secs.__getitem__)[len(secs) // 2]
        chosen[name] = timelines[name][middle]
    result.plots.append(_plot(chosen, total))
    decode = _record_decoding()
    result.measurements["record_batch_decode_rows_per_s"] = decode
    result.notes.append(
        "parsing 50,000 records from v2 record batches in one process: kafka-python's record classes "
        f"{decode['kafka-python records']:,.0f}/s, a lean Python loop {decode['lean loop']:,.0f}/s, reclock's "
        f"columnar parser {decode['reclock columns']:,.0f}/s "
        f"({decode['reclock columns'] / decode['kafka-python records']:.0f}x kafka-python's)"
    )
    if os.environ.get("BENCH_PROFILE"):
        result.notes.append(_profile(SparkDataPlane(session), bootstrap, topics, ends))
    return result


def _record_decoding() -> dict[str, float]:
    """Records per second parsing the same wire bytes: kafka-python's classes, a lean loop, and
    reclock's columnar parser (``sources/kafka/batches.py``, timed without turning its columns
    back into Python objects, as the reader uses them)."""
    from reclock.sources.kafka.batches import parse

    values = event_values(0, 50_000)
    buf = record_batches(values)
    fetched = parse(buf)
    assert fetched.offsets.tolist() == list(range(len(values))) and list(fetched.values) == values
    out = {}
    for name, fn in (
        ("kafka-python records", kafka_python_decode),
        ("lean loop", lean_decode),
        ("reclock columns", parse),
    ):
        if fn is not parse:
            offsets, decoded = fn(buf)
            assert offsets == list(range(len(values))) and decoded == values, name
        seconds, _ = median_time(lambda fn=fn: fn(buf), 5)
        out[name] = round(len(values) / seconds)
    return out


#: How each contender is drawn: reclock blue (dotted: written, not yet committed), the kafka-python
#: baselines green and red, the librdkafka ones purple and orange; readers that only count in circles.
_STYLES = {
    SPARK: ("C0", "-", "."),
    WRITTEN: ("C0", ":", ""),
    LOCAL: ("C9", "-", "."),
    RAW: ("C2", "--", "o"),
    NAIVE: ("C3", "-", "."),
    CONSUME: ("C4", "--", "o"),
    PIPELINE: ("C1", "-", "."),
}


def _plot(timelines: dict[str, list[tuple[float, int]]], total: int) -> str:
    """One run per contender (its median run): rows committed (or counted) against time."""
    fig, ax = figure(width=10, height=4.4)
    for name, style in _STYLES.items():
        if name not in timelines:
            continue
        color, line, marker = style
        xs, ys = zip(*timelines[name], strict=True)
        label = f"{name}: rows counted" if name in (RAW, CONSUME) else name
        ax.step(xs, [y / 1e3 for y in ys], where="post", color=color, linestyle=line, marker=marker, label=label)
    ax.set_xlabel("seconds since the contender started (median run of each)")
    ax.set_ylabel("thousand rows")
    ax.set_title(f"Kafka to Delta, {total:,} JSON records, 2 topics x {PARTITIONS} partitions")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3)
    return save_figure(fig, "kafka_e2e.png")


def _profile(plane: Any, bootstrap: str, topics: list[str], ends: dict[str, dict[int, int]]) -> str:
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
        seconds = land(plane, bootstrap, topics, ends, f"reclock-profile-{len(outputs)}").seconds
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        if spy.returncode not in (0, -signal.SIGINT) and not path.exists():
            return f"py-spy failed ({spy.returncode}): {err[-500:]}"
        outputs.append(f"{path.name} ({seconds:.1f} s run)")
    summary = RESULTS / "kafka_e2e_profile_summary.txt"
    summary.write_text(summarize_profile(RESULTS / "kafka_e2e_profile.txt"))
    outputs.append(summary.name)
    return "profile written: " + ", ".join(outputs)
