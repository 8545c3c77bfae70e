"""The demo's Kafka side: its topics on the embedded broker, and a producer process writing the
generator's auction events to them as JSON.

Shared by the single-pipeline demo (:mod:`reclock.demo.run`) and the three-pipeline one
(:mod:`reclock.demo.timeline`), which is why it is its own module: neither demo imports the other.
Production runs in its own process, so on a small machine the producer and the pipeline each get a
core; its speed is kafka-python's per-record ``send()`` (about 25k records/s here whatever the
batching settings, see ``docs/sources/kafka.md``).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from reclock.errors import ReclockError

__all__ = ["DEMO_PARTITIONS", "ProducerProcess", "create_topics", "kafka_source"]

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


def create_topics(bootstrap: str, topics: list[str]) -> None:
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


class ProducerProcess:
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
