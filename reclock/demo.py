"""The embedded default behind ``reclock demo``: the whole Kafka path with nothing to install by hand.

By default (``source="kafka"``) the demo starts an embedded Kafka-compatible broker
(:class:`~reclock.broker.EmbeddedBroker`, Tansu in memory), creates one topic per output of the
generator's auction workload (``persons``, ``auctions``, ``bids``, 4 partitions each) and starts a
Kafka pipeline (``<lake>/demo``) on them as a normal job (status tables, ``status.json``, progress
lines). Once the job runs, a producer process writes the generator's events to the topics as JSON
with kafka-python, and the pipeline ingests them live. A watcher asks the job to stop once every
output holds every record the producer delivered, then the broker stops. Kafka is unbounded, so the
pipeline ends *stopped*, not *finished*; the demo returns the into time of the consistent cut that
holds all of it.

``source="generator"`` runs the generator straight into the pipeline (no broker, a bounded source
that finishes) and reads as of its closing binding. ``source="all"`` runs a Kafka, a files and a
generator pipeline on one lake and reads one cut across them (:mod:`reclock.demo_timeline`).

Production runs in its own process, so on a small machine the producer and the pipeline each get a
core; its speed is kafka-python's per-record ``send()`` (about 25k records/s here whatever the
batching settings, see ``docs/sources/kafka.md``), so with the default sizes the pipeline keeps up
and the lag stays small.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.compute as pc

from reclock import job
from reclock.config import parse_config
from reclock.errors import ConfigError, ReclockError
from reclock.health import Health
from reclock.persist.asof import readable_upper
from reclock.persist.lake import Lake
from reclock.status import read_status
from reclock.time import Frontier, IntoTime

__all__ = ["DEMO", "DEMO_PARTITIONS", "SOURCES", "kafka_source", "run_demo"]

#: The demo pipeline's name (its folder in the lake).
DEMO = "demo"
#: What ``run_demo(source=...)`` accepts; ``all`` is :mod:`reclock.demo_timeline`.
SOURCES = ("kafka", "generator", "all")
#: Generator partitions, and partitions of each Kafka topic: event ``(gen-i, o)`` goes to partition ``i``.
DEMO_PARTITIONS = 4

#: Generator offsets the producer turns into records per step, per partition (partitions interleave).
_PRODUCE_STEP = 8_192
#: kafka-python producer settings, measured on the embedded broker: large batches and a short linger
#: (17k records/s with the defaults, 24k with these); idempotence and metrics only cost CPU here.
_PRODUCER_SETTINGS: dict[str, Any] = {
    "linger_ms": 20,
    "batch_size": 1 << 20,
    "max_request_size": 16 << 20,
    "acks": 1,
    "enable_idempotence": False,
    "metrics_enabled": False,
}
_STOP_POLL_S = 0.2


def run_demo(
    lake: Lake, *, events: int, rate: float, engine: str, out: TextIO, source: str = "kafka"
) -> IntoTime | None:
    """Run the demo pipeline; the into time to read as of, or ``None`` if it failed.

    ``source="kafka"``: produce ``events`` generator events (at most ``rate`` a second) to an
    embedded broker while a Kafka pipeline ingests them, until every output holds every record.
    ``source="generator"``: the generator itself is the pipeline's source.
    """
    if source not in SOURCES:
        raise ConfigError("source", f"must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "all":
        from reclock.demo_timeline import run_timeline_demo

        return run_timeline_demo(lake, events=events, rate=rate, engine=engine, out=out)
    lake.store.delete_tree(lake.pipeline_dir(DEMO))
    if source == "generator":
        return _generator_demo(lake, events=events, rate=rate, engine=engine, out=out)
    return _kafka_demo(lake, events=events, rate=rate, engine=engine, out=out)


# -- the generator straight into the pipeline ------------------------------------------------------


def _generator_demo(lake: Lake, *, events: int, rate: float, engine: str, out: TextIO) -> IntoTime | None:
    config = parse_config(
        {
            "pipeline": _pipeline_section(lake, engine),
            "source": {"kind": "generator", "partitions": DEMO_PARTITIONS, "rate": rate, "limit": events},
        }
    )
    job.create(config, storage_options=lake.store.options)
    out.write(f"demo: {events:,} auction events at {rate:,.0f}/s -> persons, auctions, bids in {lake.root}/{DEMO}\n")
    pipeline = job.run(lake, DEMO, progress=out)
    if pipeline.health is Health.FAILED:
        return None
    return min(readable_upper(lake, DEMO), pipeline.remap.bindings.upper) - 1  # the closing binding


def kafka_source(bootstrap: str, schemas: Mapping[str, pa.Schema]) -> dict[str, Any]:
    """The ``[source]`` of a demo pipeline reading each topic, JSON with its schema, into its output."""
    return {
        "kind": "kafka",
        "bootstrap_servers": bootstrap,
        "topics": list(schemas),
        "outputs": {
            topic: {"topics": [topic], "format": "json", "schema": {f.name: str(f.type) for f in schema}}
            for topic, schema in schemas.items()
        },
        "read_timeout_s": 10.0,
    }


def _pipeline_section(lake: Lake, engine: str) -> dict[str, Any]:
    return {"name": DEMO, "lake": str(lake.root), "engine": engine, "batch_interval": 0.2, "max_batch": 100_000}


# -- Kafka: an embedded broker, a producer process, a Kafka pipeline --------------------------------


def _kafka_demo(lake: Lake, *, events: int, rate: float, engine: str, out: TextIO) -> IntoTime | None:
    from reclock.broker import EmbeddedBroker
    from reclock.sources.generator import AUCTIONS, AUCTIONS_SCHEMA, BIDS, BIDS_SCHEMA, PERSONS, PERSONS_SCHEMA

    schemas = {PERSONS: PERSONS_SCHEMA, AUCTIONS: AUCTIONS_SCHEMA, BIDS: BIDS_SCHEMA}
    with tempfile.TemporaryDirectory(prefix="reclock-demo-broker-") as logs, EmbeddedBroker(log_dir=logs) as broker:
        _create_topics(broker.bootstrap, list(schemas))
        config = parse_config(
            {
                "pipeline": _pipeline_section(lake, engine),
                "source": kafka_source(broker.bootstrap, schemas),
            }
        )
        job.create(config, storage_options=lake.store.options)
        out.write(
            f"demo: {events:,} auction events produced as JSON at up to {rate:,.0f}/s to Kafka topics "
            f"{', '.join(schemas)} ({DEMO_PARTITIONS} partitions each) on an embedded broker at {broker.bootstrap},\n"
            f"      ingested live by pipeline {DEMO!r} ({engine} engine) into {lake.root}/{DEMO}\n"
        )
        out.flush()
        producer = _ProducerProcess(broker.bootstrap, events, rate)
        watcher = _Watcher(lake, producer, out)
        watcher.start()
        try:
            pipeline = job.run(lake, DEMO, progress=out)
        finally:
            watcher.done.set()
            watcher.join()
            producer.close()
        if watcher.error is not None:
            out.write(f"demo: {watcher.error}\n")
            return None
        if pipeline.health is Health.FAILED:
            return None
        if not watcher.complete:
            out.write("demo: stopped before every produced record was in the lake\n")
            return None
    return readable_upper(lake, DEMO) - 1  # every output holds every produced record at this cut


def _create_topics(bootstrap: str, topics: list[str]) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, DEMO_PARTITIONS, 1) for topic in topics])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            described = admin.describe_topics(topics)
            if len(described) == len(topics) and all(
                len(t.get("partitions", ())) == DEMO_PARTITIONS for t in described
            ):
                return
            time.sleep(0.05)
        raise ReclockError(f"demo: topics {topics} did not appear on the embedded broker")
    finally:
        admin.close()


class _Watcher(threading.Thread):
    """Starts the producer once the job runs; asks the job to stop once every output holds every
    record the producer delivered.

    It compares the producer's delivery ends (the broker's own offsets) with the resume frontier
    the job publishes in ``status.json``: that frontier is covered by *every* output, durably.
    """

    def __init__(self, lake: Lake, producer: _ProducerProcess, out: TextIO) -> None:
        super().__init__(name="reclock-demo-watcher", daemon=True)
        self.lake = lake
        self.producer = producer
        self.out = out
        self.done = threading.Event()
        self.complete = False
        self.error: str | None = None

    def run(self) -> None:
        ends: dict[tuple[str, int], int] | None = None
        while not self.done.wait(_STOP_POLL_S):
            status = read_status(self.lake, DEMO) or {}
            health = status.get("health")
            if health in (Health.FAILED.value, Health.STOPPED.value):
                return
            if not self.producer.started:
                if health == Health.RUNNING.value:  # the job is up (Spark too): produce into it, live
                    self.producer.start()
                    self.out.write("\ndemo: the pipeline is running; producing\n")
                    self.out.flush()
                continue
            if ends is None:
                result = self.producer.result()
                if result is None:
                    continue
                if "error" in result:
                    self.error = f"the producer failed: {result['error']}"
                    job.request_stop(self.lake, DEMO)
                    return
                ends = result["ends"]
                seconds = max(result["seconds"], 1e-9)
                total = sum(ends.values())
                self.out.write(
                    f"\ndemo: produced {total:,} records in {seconds:.1f} s ({total / seconds:,.0f}/s); "
                    "waiting until every output holds all of them\n"
                )
                self.out.flush()
            resume = Frontier.from_json(status.get("resume_frontier", "{}"))
            if all(resume.covers(partition, end - 1) for partition, end in ends.items() if end > 0):
                self.complete = True
                job.request_stop(self.lake, DEMO)
                return


class _ProducerProcess:
    """The demo's producer in a child process (its own interpreter, so its own core).

    The child imports and connects at once, then waits for :meth:`start`, so production begins
    only when the pipeline runs and the records stream in live, whatever the engine's start-up.
    """

    def __init__(self, bootstrap: str, events: int, rate: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._go = context.Event()
        self._receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_produce,
            args=(bootstrap, events, rate, self._go, sender),
            name="reclock-demo-producer",
            daemon=True,
        )
        self._process.start()
        sender.close()
        self._result: dict[str, Any] | None = None

    @property
    def started(self) -> bool:
        return self._go.is_set()

    def start(self) -> None:
        self._go.set()

    def result(self) -> dict[str, Any] | None:
        """``{"ends": {(topic, partition): end}, "seconds": s}`` or ``{"error": ...}``; ``None`` while running."""
        if self._result is None:
            if self._receiver.poll():
                try:
                    self._result = self._receiver.recv()
                except EOFError:
                    self._result = {"error": f"producer process exited with code {self._process.exitcode}"}
            elif not self._process.is_alive() and not self._receiver.poll():
                self._result = {"error": f"producer process exited with code {self._process.exitcode}"}
        return self._result

    def close(self) -> None:
        """Stop the producer if it still runs (the demo was stopped early) and reap it."""
        self._process.join(timeout=0.5)
        if self._process.is_alive():
            self._process.terminate()  # our own child, by its own handle
            self._process.join(timeout=5)
        self._receiver.close()


def _produce(bootstrap: str, events: int, rate: float, go: Any, sender: Any) -> None:
    """Child process: once ``go`` is set, the generator's events as JSON, event ``(gen-i, o)`` to
    partition ``i`` of the topic named after its output, at most ``rate`` a second; reports the
    delivery ends."""
    try:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap, **_PRODUCER_SETTINGS)
        go.wait()
        started = time.monotonic()
        last: dict[tuple[str, int], Any] = {}
        sent = 0
        for topic, partition, values in _events_as_json(events):
            send = producer.send
            future = None
            for value in values:
                future = send(topic, value=value, partition=partition)
            if future is not None:
                last[(topic, partition)] = future
            sent += len(values)
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        producer.flush()
        # The broker's own offsets: a fresh topic starts at 0, so the last offset + 1 is the end.
        ends = {key: future.get(timeout=30).offset + 1 for key, future in last.items()}
        producer.close()
        sender.send({"ends": ends, "seconds": time.monotonic() - started})
    except BaseException as exc:  # reported to the parent, which stops the demo
        sender.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        sender.close()


def _events_as_json(events: int) -> Iterator[tuple[str, int, list[bytes]]]:
    """``(topic, partition, values)`` slices of the generator's events, partitions interleaved."""
    from reclock.sources.base import Split
    from reclock.sources.generator import GeneratorSource

    generator = GeneratorSource(partitions=DEMO_PARTITIONS, limit=events)
    limits = generator.partition_limits or ()
    for start in range(0, max(limits, default=0), _PRODUCE_STEP):
        for index, limit in enumerate(limits):
            if start >= limit:
                continue
            split = Split(f"gen-{index}", start, min(limit, start + _PRODUCE_STEP))
            for output, batch in generator.read(split):
                yield output, index, _json_values(batch)


def _json_values(batch: pa.RecordBatch) -> list[bytes]:
    """One JSON object per row of ``batch`` (lineage columns left out), built column-wise by Arrow."""
    parts: list[Any] = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if field.name.startswith("_"):
            continue
        key = ("{" if not parts else ",") + f'"{field.name}":'
        if pa.types.is_string(field.type):
            escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
            parts += [pa.scalar(key + '"'), escaped, pa.scalar('"')]
        else:
            parts += [pa.scalar(key), pc.cast(column, pa.string())]
    parts.append(pa.scalar("}"))
    return pc.binary_join_element_wise(*parts, "").cast(pa.binary()).to_pylist()
