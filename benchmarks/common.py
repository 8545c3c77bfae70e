"""Helpers the scenarios share: the broker, producing data, the Spark session, Delta logs, timing.

Nothing here is measured itself; it sets up inputs so that reclock and its baselines see exactly
the same records, and reads what they wrote back from the tables (not from their own reports).

Run as a module it is also a small steady producer for the freshness scenario, in its own process
so that its CPU and GIL never compete with the pipeline being measured::

    python -m benchmarks.common steady BOOTSTRAP TOPIC[,TOPIC] RATE SECONDS PARTITIONS
    python -m benchmarks.common produce BOOTSTRAP TOPIC COUNT PARTITIONS   (prints the end offsets)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from benchmarks.harness import RESULTS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from reclock.demo.broker import EmbeddedBroker

__all__ = [
    "EVENT_COLUMNS",
    "EVENT_SCHEMA",
    "Commit",
    "TreeSampler",
    "alternate",
    "assert_exactly_once",
    "broker",
    "create_topics",
    "delta_commits",
    "event_values",
    "figure",
    "kafka_python_decode",
    "lean_decode",
    "load_average",
    "median",
    "percentile",
    "produce",
    "produce_parallel",
    "produced",
    "record_batches",
    "save_figure",
    "spark",
    "steady_producer",
    "summarize_profile",
    "tree_cpu_seconds",
    "wait_until",
    "workdir",
]

#: The JSON records every Kafka scenario produces (about 100 bytes each) and decodes back.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("user", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("kind", pa.string()),
        pa.field("page", pa.string()),
        pa.field("ts", pa.int64()),
    ]
)

#: The same schema as a source option (config files spell types as pyarrow aliases).
EVENT_COLUMNS = {f.name: str(f.type) for f in EVENT_SCHEMA}

_KINDS = ("click", "view", "scroll", "buy")


def event_values(start: int, count: int, ts: int | None = None) -> list[bytes]:
    """``count`` JSON records with ids ``start..``; ``ts`` (ms) defaults to now for each call."""
    ts = int(time.time() * 1000) if ts is None else ts
    return [
        b'{"id":%d,"user":"user-%05d","amount":%d.25,"kind":"%s","page":"/p/%04d","ts":%d}'
        % (i, i % 50_000, i % 997, _KINDS[i % 4].encode(), i % 5_000, ts)
        for i in range(start, start + count)
    ]


# -- places and processes ------------------------------------------------------------------------


@contextlib.contextmanager
def workdir(name: str) -> Iterator[Path]:
    """A fresh scratch folder (lakes, checkpoints, input files), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=f"reclock-bench-{name}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


_SPARK: SparkSession | None = None


def spark() -> SparkSession:
    """The one long-lived ``local[2]`` session of this process, warmed up (JVM and Python worker)."""
    global _SPARK
    if _SPARK is None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from reclock.job.spark import spark_session

        session = spark_session("local[2]")
        session.range(10).count()
        session.sparkContext.parallelize(range(4), 2).map(lambda x: x).collect()
        _SPARK = session
    return _SPARK


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# -- Kafka ---------------------------------------------------------------------------------------

_BROKER: EmbeddedBroker | None = None


def broker() -> EmbeddedBroker:
    """One embedded Tansu broker for the whole benchmark run (stopped when the process exits)."""
    global _BROKER
    if _BROKER is None or not _BROKER.running:
        import atexit

        from reclock.demo.broker import EmbeddedBroker

        _BROKER = EmbeddedBroker().start()
        atexit.register(_stop_broker, _BROKER)
    return _BROKER


def _stop_broker(running: EmbeddedBroker) -> None:
    import logging

    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # clients still open at exit would log the loss
    running.stop()


def create_topics(bootstrap: str, names: Sequence[str], partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(n, partitions, 1) for n in names])
        for name in names:
            wait_until(
                lambda n=name: (d := admin.describe_topics([n])) and len(d[0].get("partitions", [])) == partitions,
                10,
                what=f"topic {name}",
            )
    finally:
        admin.close()


def _producer(bootstrap: str, **overrides: Any) -> Any:
    from kafka import KafkaProducer

    settings = {"linger_ms": 20, "batch_size": 1 << 20, "acks": 1, "max_request_size": 16 << 20}
    settings.update(overrides)
    return KafkaProducer(bootstrap_servers=bootstrap, **settings)


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> dict[int, int]:
    """Produce ``count`` JSON events round-robin over ``partitions``; the end offset of each.

    End offsets come from the delivery reports (Tansu's ``ListOffsets(LATEST)`` is wrong, see the
    facts file), so they are what every reader is asked to reach.
    """
    producer = _producer(bootstrap)
    ends: dict[int, int] = {}
    chunk = 20_000
    try:
        for start in range(0, count, chunk):
            futures = {}
            for i, value in enumerate(event_values(start, min(chunk, count - start))):
                p = (start + i) % partitions
                futures[p] = producer.send(topic, value=value, partition=p)
            producer.flush()
            for p, fut in futures.items():
                ends[p] = max(ends.get(p, 0), fut.get(timeout=30).offset + 1)
    finally:
        producer.close()
    return ends


def produce_parallel(bootstrap: str, topics: Sequence[str], count: int, partitions: int) -> dict[str, dict[int, int]]:
    """:func:`produce` into each topic from its own child process (kafka-python produces ~27k/s each)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.common", "produce", bootstrap, topic, str(count), str(partitions)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for topic in topics
    ]
    ends = {}
    for topic, proc in zip(topics, procs, strict=True):
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"producing into {topic} failed with exit code {proc.returncode}")
        ends[topic] = {int(p): int(e) for p, e in json.loads(out.strip().splitlines()[-1]).items()}
    return ends


_PRODUCED: dict[tuple[int, int], tuple[list[str], dict[str, dict[int, int]]]] = {}


def produced(per_topic: int, partitions: int) -> tuple[list[str], dict[str, dict[int, int]]]:
    """Two topics holding at least ``per_topic`` events each, produced once per process.

    Returns the topic names and ``{topic: {partition: end offset}}``. A later call asking for no
    more than an earlier one reuses its topics (readers start at the beginning of a topic, so the
    same records serve every contender and every scenario).
    """
    for (count, parts), found in _PRODUCED.items():
        if count >= per_topic and parts == partitions:
            return found
    bootstrap = broker().bootstrap
    tag = os.urandom(3).hex()
    topics = [f"clicks_{tag}", f"views_{tag}"]
    create_topics(bootstrap, topics, partitions)
    found = (topics, produce_parallel(bootstrap, topics, per_topic, partitions))
    _PRODUCED[(per_topic, partitions)] = found
    return found


def steady_producer(
    bootstrap: str, topics: Sequence[str], rate: float, seconds: float, partitions: int
) -> subprocess.Popen[str]:
    """Start producing ``rate`` events/s in total for ``seconds`` in a child process.

    Every record's JSON carries ``ts``, the wall-clock ms at which it was handed to the producer:
    the start of its produce-to-visible latency. The child prints ``ready`` once connected, then
    ``done <records>`` at the end.
    """
    cmd = [sys.executable, "-m", "benchmarks.common", "steady", bootstrap, ",".join(topics)]
    cmd += [str(rate), str(seconds), str(partitions)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise RuntimeError(f"steady producer did not start: {line!r}")
    return proc


def _steady_main(bootstrap: str, topics: str, rate: str, seconds: str, partitions: str) -> None:
    names = topics.split(",")
    producer = _producer(bootstrap, linger_ms=2, batch_size=64 << 10)
    producer.partitions_for(names[0])
    print("ready", flush=True)
    tick = 0.01
    per_tick = float(rate) * tick
    started = time.monotonic()
    sent = 0
    n_parts = int(partitions)
    while (elapsed := time.monotonic() - started) < float(seconds):
        owed = per_tick * (elapsed / tick + 1) - sent
        n = int(owed)
        if n > 0:
            for i, value in enumerate(event_values(sent, n)):
                k = sent + i
                producer.send(names[k % len(names)], value=value, partition=(k // len(names)) % n_parts)
            sent += n
        time.sleep(max(0.0, started + (elapsed // tick + 1) * tick - time.monotonic()))
    producer.flush()
    producer.close()
    print(f"done {sent}", flush=True)


# -- Delta logs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    """One version of a Delta table, read from its log file."""

    version: int
    visible_s: float  # mtime of the log file: the moment the commit became visible to readers
    commit_ms: int | None  # commitInfo.timestamp
    rows: int
    files: tuple[str, ...] = field(default=())


def delta_commits(table: str | Path, after: int = -1) -> list[Commit]:
    """The commits of a Delta table with version > ``after``, from ``_delta_log/*.json``.

    Read straight from the log (the Delta protocol: one JSON action per line), so no reader
    library sits between the commit and what we measure.
    """
    log = Path(table) / "_delta_log"
    out = []
    for path in sorted(log.glob("*.json")):
        version = int(path.stem)
        if version <= after:
            continue
        rows, files, commit_ms = 0, [], None
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                files.append(add["path"])
                stats = add.get("stats")
                rows += json.loads(stats)["numRecords"] if stats else 0
            elif "commitInfo" in action:
                commit_ms = action["commitInfo"].get("timestamp")
        out.append(Commit(version, path.stat().st_mtime, commit_ms, rows, tuple(files)))
    return out


def assert_exactly_once(lake: Any, pipeline: str, records: int) -> None:
    """Every source record is in exactly one output row: ``records`` distinct coordinates in all."""
    from deltalake import DeltaTable

    from reclock.persist.read import read_table

    seen = 0
    keys = []
    for output in lake.outputs(pipeline):
        table = read_table(DeltaTable(str(lake.output_path(pipeline, output))), columns=["_partition", "_offset"])
        seen += table.num_rows
        keys.append(table)
    combined = pa.concat_tables(keys)
    distinct = combined.group_by(["_partition", "_offset"]).aggregate([]).num_rows
    assert distinct == seen == records, f"{pipeline}: {seen} rows, {distinct} distinct records, {records} expected"


# -- timing --------------------------------------------------------------------------------------


def load_average() -> float:
    """The 1-minute load average: other work on the machine while a scenario ran."""
    return round(os.getloadavg()[0], 2)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def alternate(contenders: Mapping[str, Callable[[], Any]], runs: int) -> dict[str, list[Any]]:
    """Call each contender ``runs`` times, interleaved (A B C A B C ...), rotating who goes first.

    Interleaving spreads the machine's drifts (other processes, caches, JIT, GC) over all
    contenders instead of charging them to whoever ran last. Returns each call's result.
    """
    names = list(contenders)
    results: dict[str, list[Any]] = {n: [] for n in names}
    for i in range(runs):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            results[name].append(contenders[name]())
    return results


# -- memory --------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process and its live descendants (this process by default).

    Contention-independent: on a shared machine wall time depends on the neighbours, CPU time much
    less. Work done by descendants that already exited is not counted, so measure around work
    done by long-lived processes (the JVM, Spark's Python workers, the broker).
    """
    tree = _children()
    todo, total = [pid or os.getpid()], 0
    ticks = os.sysconf("SC_CLK_TCK")
    while todo:
        current = todo.pop()
        todo.extend(tree.get(current, ()))
        try:
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / ticks


class TreeSampler:
    """Samples the summed RSS of a process and all its descendants every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []  # (time, root kib, tree kib)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            tree = _children()
            todo, seen = [self.pid], []
            while todo:
                pid = todo.pop()
                seen.append(pid)
                todo.extend(tree.get(pid, ()))
            root = _rss_kib(self.pid)
            total = sum(_rss_kib(p) for p in seen)
            if root:
                self.samples.append((time.monotonic() - started, root, total))
            self._stop.wait(self.interval)

    @property
    def peak_tree_mib(self) -> float:
        return max((t for _, _, t in self.samples), default=0) / 1024

    @property
    def peak_root_mib(self) -> float:
        return max((r for _, r, _ in self.samples), default=0) / 1024


# -- Kafka record batches -------------------------------------------------------------------------


def record_batches(values: Sequence[bytes], batch_bytes: int = 1 << 20) -> bytes:
    """``values`` as consecutive Kafka v2 record batches (the bytes a Fetch response carries)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    def builder() -> Any:
        return DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=batch_bytes,
        )

    out = bytearray()
    current, base = builder(), 0
    for offset, value in enumerate(values):
        if current.append(offset - base, timestamp=1_700_000_000_000, key=None, value=value, headers=[]) is None:
            data = current.build()
            data[0:8] = base.to_bytes(8, "big")
            out += data
            current, base = builder(), offset
            current.append(0, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    data = current.build()
    data[0:8] = base.to_bytes(8, "big")
    out += data
    return bytes(out)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def lean_decode(buf: bytes) -> tuple[list[int], list[bytes | None]]:
    """Offsets and values of uncompressed v2 record batches: the least per-record work possible
    in Python (no record objects, no timestamps, keys or headers kept; no CRC check).

    Only a yardstick for what kafka-python's per-record parsing costs on top of that; a real
    reader would also check each batch's CRC32C, skip control batches and handle compression.
    """
    offsets: list[int] = []
    values: list[bytes | None] = []
    pos, end = 0, len(buf)
    while pos + 61 <= end:
        base = int.from_bytes(buf[pos : pos + 8], "big")
        stop = pos + 12 + int.from_bytes(buf[pos + 8 : pos + 12], "big")
        count = int.from_bytes(buf[pos + 57 : pos + 61], "big")
        p = pos + 61
        for _ in range(count):
            # One-byte varints (most fields of small records) are decoded inline.
            b = buf[p]
            length, q = ((b >> 1) ^ -(b & 1), p + 1) if b < 0x80 else _varint(buf, p)
            record_end = q + length
            q += 1  # attributes
            q = q + 1 if buf[q] < 0x80 else _varint(buf, q)[1]  # timestamp delta
            b = buf[q]
            delta, q = ((b >> 1) ^ -(b & 1), q + 1) if b < 0x80 else _varint(buf, q)
            b = buf[q]
            key_length, q = ((b >> 1) ^ -(b & 1), q + 1) if b < 0x80 else _varint(buf, q)
            q += max(key_length, 0)
            b = buf[q]
            value_length, q = ((b >> 1) ^ -(b & 1), q + 1) if b < 0x80 else _varint(buf, q)
            offsets.append(base + delta)
            values.append(buf[q : q + value_length] if value_length >= 0 else None)
            p = record_end
        pos = stop
    return offsets, values


def kafka_python_decode(buf: bytes) -> tuple[list[int], list[bytes | None]]:
    """The same through kafka-python's own record classes (what its fetcher iterates)."""
    from kafka.record.memory_records import MemoryRecords

    records = MemoryRecords(buf)
    offsets: list[int] = []
    values: list[bytes | None] = []
    while records.has_next():
        for record in records.next_batch():
            offsets.append(record.offset)
            values.append(record.value)
    return offsets, values


# -- profiles ------------------------------------------------------------------------------------

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
    ("reclock data plane (reclock/runtime/task.py, planes.py)", ("reclock/runtime/task", "reclock/runtime/planes")),
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


# -- plots ---------------------------------------------------------------------------------------


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


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    array = np.asarray(values, dtype=float)
    return float(np.percentile(array, q)) if array.size else float("nan")


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "steady":
        _steady_main(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "produce":
        print(json.dumps(produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
