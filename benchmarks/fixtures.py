"""What the scenarios set up: scratch folders, the Spark session, the broker, topics and their records.

Nothing here is measured itself; it sets up inputs so that reclock and its baselines see exactly
the same records.

Run as a module it is also a small steady producer for the freshness scenario, in its own process
so that its CPU and GIL never compete with the pipeline being measured::

    python -m benchmarks.fixtures steady BOOTSTRAP TOPIC[,TOPIC] RATE SECONDS PARTITIONS
    python -m benchmarks.fixtures produce BOOTSTRAP TOPIC COUNT PARTITIONS   (prints the end offsets)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from reclock.demo.broker import EmbeddedBroker

__all__ = [
    "EVENT_COLUMNS",
    "EVENT_SCHEMA",
    "broker",
    "create_topics",
    "event_values",
    "produce",
    "produce_parallel",
    "produced",
    "spark",
    "steady_producer",
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


@contextlib.contextmanager
def running_job(lake: Any, name: str, thread_name: str = "benchmark-job") -> Iterator[None]:
    """``reclock start`` of pipeline ``name`` in a thread of this process, running once the body
    starts, stopped (and its failure raised) when the body ends: what a freshness measure needs
    around its writer, where a subprocess would add its start-up to every latency."""
    from reclock.job import lifecycle
    from reclock.job.status import read_status

    failure: list[BaseException] = []

    def run_job() -> None:
        try:
            lifecycle.run(lake, name)
        except BaseException as exc:  # raised in the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=run_job, name=thread_name, daemon=True)
    thread.start()
    wait_until(lambda: failure or (read_status(lake, name) or {}).get("health") == "running", 120, what="job start")
    if failure:
        raise failure[0]
    yield
    lifecycle.request_stop(lake, name)
    thread.join(timeout=120)
    if failure:
        raise failure[0]


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
            [sys.executable, "-m", "benchmarks.fixtures", "produce", bootstrap, topic, str(count), str(partitions)],
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
    cmd = [sys.executable, "-m", "benchmarks.fixtures", "steady", bootstrap, ",".join(topics)]
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


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "steady":
        _steady_main(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "produce":
        print(json.dumps(produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
