"""Scenario: a registry-framed Avro topic to Delta (issue 23, acceptance 3).

Order records (six fields: long, string, double, timestamp-millis, a nullable string, int) are
serialized by confluent-kafka's ``AvroSerializer``, which registers the schema in the registry
stand-in (:mod:`reclock.demo.registry`), and produced once, before anything is timed, round-robin
over 4 partitions of the embedded broker. Two contenders land the very same offsets, alternating
run by run, each checked against the count produced (from the Delta log of its table):

* **reclock in-driver**: a :class:`~reclock.runtime.pipeline.Pipeline` over a
  :class:`~reclock.sources.kafka.KafkaSource` with ``format = "avro"`` and ``schema_registry``,
  columns from the subject's version 1, stepping until the resume frontier holds every end offset.
* **confluent Avro pipeline** (``baselines/confluent_avro.py``): confluent-kafka's consumer and its
  ``AvroDeserializer`` record by record, ``Table.from_pylist`` and one ``write_deltalake`` per
  ``consume(10000)``: what its documentation leads to.

Target, on medians of rows per second: reclock / confluent Avro pipeline >= 1.5. Each run is
timed from the contender's start (clients connected, schema read) to its last commit.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa

from benchmarks.baselines import confluent_avro
from benchmarks.fixtures import broker, create_topics, workdir
from benchmarks.harness import Ratio, ScenarioResult
from benchmarks.measure import alternate, load_average, median
from benchmarks.readback import delta_commits

__all__ = ["run"]

PARTITIONS = 4
TOPIC = "registry-orders"
SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "quantity", "type": "int"},
    ],
}
LOCAL, BASELINE = "reclock, in-driver", "confluent Avro pipeline"


def run(full: bool = False) -> ScenarioResult:
    from reclock.demo.registry import RegistryStandIn

    count = 1_000_000 if full else 200_000
    runs = 5 if full else 3
    result = ScenarioResult("registry_avro")
    bootstrap = broker().bootstrap
    with RegistryStandIn() as registry:
        started = time.monotonic()
        create_topics(bootstrap, [TOPIC], PARTITIONS)
        ends = _produce(bootstrap, registry.url, count)
        produce_s = time.monotonic() - started
        counter = iter(range(1_000_000))
        arrow = _arrow_schema()

        def reclock_run() -> float:
            return _land(bootstrap, registry.url, ends, f"reclock-{next(counter)}")

        def baseline_run() -> float:
            with workdir("baseline") as lake:
                t0 = time.monotonic()
                rows = confluent_avro.run(bootstrap, registry.url, ends, TOPIC, lake, arrow, f"base-{next(counter)}")
                seconds = time.monotonic() - t0
                landed = sum(c.rows for c in delta_commits(lake / TOPIC))
                assert rows == landed == count, f"baseline landed {landed} (reported {rows}) of {count}"
            return seconds

        times = alternate({LOCAL: reclock_run, BASELINE: baseline_run}, runs)
    rates = {name: count / median(secs) for name, secs in times.items()}
    detail = f"{rates[LOCAL]:,.0f} vs {rates[BASELINE]:,.0f} rows/s over {count:,} registry-framed Avro records"
    result.ratios.append(
        Ratio(
            "reclock in-driver / confluent AvroDeserializer + write_deltalake, rows/s",
            rates[LOCAL] / rates[BASELINE],
            1.5,
            detail=detail,
        )
    )
    result.measurements.update(
        records=count,
        partitions=PARTITIONS,
        produce_seconds=round(produce_s, 2),
        runs=runs,
        seconds={name: [round(s, 3) for s in secs] for name, secs in times.items()},
        rows_per_second={name: round(r) for name, r in rates.items()},
        load_average=load_average(),
    )
    return result


def _record(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"customer-{i % 1000}",
        "amount": (i % 10_000) / 100,
        "placed_at": 1_790_000_000_000 + i,
        "note": None if i % 4 else f"note {i}",
        "quantity": i % 17,
    }


def _arrow_schema() -> pa.Schema:
    from reclock.sources.decode import avro_to_arrow_schema

    return avro_to_arrow_schema(json.dumps(SCHEMA))


def _produce(bootstrap: str, registry_url: str, count: int) -> dict[int, int]:
    """``count`` records serialized by confluent-kafka's ``AvroSerializer``; the end offset of
    each partition from the delivery reports."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(SCHEMA))
    context = SerializationContext(TOPIC, MessageField.VALUE)
    ends: dict[int, int] = {}
    failures: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20, "log_level": 3})
    for i in range(count):
        value = serialize(_record(i), context)
        while True:
            try:
                producer.produce(TOPIC, value, partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0 or failures:
        raise KafkaException(f"{TOPIC}: not all records delivered ({failures[:1]})")
    assert sum(ends.values()) == count, f"delivery reports end at {sum(ends.values())} of {count}"
    return ends


def _land(bootstrap: str, registry_url: str, ends: dict[int, int], group: str) -> float:
    """Seconds for reclock to land ``ends`` into a fresh lake, checked from the Delta log."""
    from reclock.runtime.pipeline import Pipeline
    from reclock.runtime.planes import LocalDataPlane
    from reclock.sources.kafka import KafkaSource, output_name_for

    want = {(TOPIC, p): end for p, end in ends.items()}
    total = sum(ends.values())
    with workdir("reclock") as lake:
        t0 = time.monotonic()
        source = KafkaSource(
            bootstrap,
            topics=[TOPIC],
            format="avro",
            schema_registry={"url": registry_url},
            reader_schema={"version": 1},
            group_id=group,
        )
        pipeline = Pipeline("landed", lake, source, data_plane=LocalDataPlane())
        try:
            while not all(pipeline.resume_frontier().offset(p) >= end for p, end in want.items()):
                pipeline.step()
        finally:
            source.close()
        seconds = time.monotonic() - t0
        landed = {name: sum(c.rows for c in delta_commits(sink.path)) for name, sink in pipeline.sinks.items()}
        assert landed.pop("_errors") == 0, "reclock wrote error rows"
        assert landed == {output_name_for(TOPIC): total}, f"reclock landed {landed} of {total}"
    return seconds
