"""Reading a py-spy profile: where the CPU of the driver and of Spark's Python workers went."""

from __future__ import annotations

from pathlib import Path

__all__ = ["summarize_profile"]

#: Where a sample's CPU went, by its innermost frame (first match wins).
_BUCKETS = (
    (
        "waiting (select, locks, sleeps)",
        ("selectors.py", "threading.py", "socket.py", "queue.py", "manager (daemon.py", "_profile (benchmarks"),
    ),
    ("kafka-python: record parsing", ("kafka/record/", "fetcher.py")),
    ("kafka-python: other", ("kafka/", "<codegen_decode")),
    ("JSON decode (sources/decode/, pyarrow.json)", ("sources/decode/", "pyarrow/json")),
    ("parquet write + stats (persist/sink.py)", ("persist/sink.py", "pyarrow/parquet")),
    ("stamping (reclock/timeline/stamp.py)", ("reclock/timeline/stamp.py",)),
    (
        "reclock data plane (reclock/runtime/task.py, planes.py)",
        ("reclock/runtime/task.py", "reclock/runtime/planes.py"),
    ),
    ("Kafka source Python (sources/kafka/)", ("sources/kafka/",)),
    ("other reclock / persist / sources", ("reclock/", "persist/", "sources/")),
    ("delta-rs (deltalake)", ("deltalake/",)),
    (
        "PySpark (serialisation, worker, py4j)",
        ("pyspark/", "py4j/", "cloudpickle", "(worker.py", "(serializers.py", "(daemon.py", "(util.py"),
    ),
    ("pyarrow other", ("pyarrow/",)),
)
_MARKERS = (
    "run_split",
    "KafkaSource.read",
    "KafkaConsumer.poll",
    "decode",
    "Decoder.decode",
    "write_data_file",
    "Stamper.into_times",
    "Pipeline.step",
    "KafkaSource.upper",
    "OutputSink.commit",
    "RemapTable.mint",
)


def summarize_profile(path: str | Path) -> str:
    """A plain-text reading of a py-spy ``--format raw --subprocesses`` profile.

    Samples are split by process (the driver, Spark's Python workers), then by where the CPU
    went (the innermost frame's file), and by the reclock functions on the stack.
    """
    by_process: dict[str, dict[str, int]] = {}
    markers: dict[str, dict[str, int]] = {}
    own_lines: dict[str, dict[str, int]] = {}
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        kind = "Spark Python workers" if procs and "pyspark.daemon" in procs[-1] else "driver"
        calls = [f for f in frames if not f.startswith("process ")]
        leaf = calls[-1] if calls else ""
        if leaf.startswith("<lambda> (<string>") and len(calls) > 1:
            leaf = calls[-2]  # a namedtuple's generated __new__: charge its caller (ConsumerRecord)
        bucket = next((name for name, keys in _BUCKETS if any(k in leaf for k in keys)), "other")
        by_process.setdefault(kind, {}).setdefault(bucket, 0)
        by_process[kind][bucket] += n
        for marker in _MARKERS:
            if any(f.startswith(marker + " ") for f in calls):
                markers.setdefault(kind, {}).setdefault(marker, 0)
                markers[kind][marker] += n
        if any(k in leaf for k in ("reclock/", "persist/", "sources/")):
            own_lines.setdefault(kind, {}).setdefault(leaf, 0)
            own_lines[kind][leaf] += n
    out = []
    for kind, buckets in sorted(by_process.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(buckets.values())
        busy = total - buckets.get("waiting (select, locks, sleeps)", 0)
        out.append(f"{kind}: {total} samples, {busy} not waiting")
        for name, n in sorted(buckets.items(), key=lambda kv: -kv[1]):
            out.append(f"  {100 * n / total:5.1f}%  {name}")
        out.append("  on the stack (share of all samples of these processes):")
        for marker, n in sorted(markers.get(kind, {}).items(), key=lambda kv: -kv[1]):
            out.append(f"  {100 * n / total:5.1f}%  {marker}")
        out.append("  hottest lines of reclock's own code (self time):")
        for leaf, n in sorted(own_lines.get(kind, {}).items(), key=lambda kv: -kv[1])[:8]:
            out.append(f"  {100 * n / total:5.1f}%  {leaf}")
    return "\n".join(out) + "\n"
