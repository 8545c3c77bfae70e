"""Baseline: the afternoon script for a registry-framed Avro topic, on librdkafka.

One process consumes with confluent-kafka, decodes every value with confluent-kafka's own
``AvroDeserializer`` (the registry's writer schema, fastavro underneath, one record at a time, as
its documentation shows), turns each ``consume(10000)`` batch into an Arrow table with
``pyarrow.Table.from_pylist`` and appends it to a Delta table with one ``write_deltalake``.
At-least-once, one process, no timeline: what people write first.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa

__all__ = ["run"]


def run(
    bootstrap: str,
    registry_url: str,
    ends: Mapping[int, int],
    topic: str,
    lake: Path,
    schema: pa.Schema,
    group_id: str,
    on_commit: list[tuple[float, int]] | None = None,
) -> int:
    """Land the offsets below ``ends`` (``{partition: end offset}``) of ``topic`` in ``lake/topic``;
    returns the rows written."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from deltalake import write_deltalake

    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "log_level": 3,
        }
    )
    remaining = {p: end for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in remaining])
    table_schema = pa.schema([*schema, pa.field("partition", pa.int32()), pa.field("offset", pa.int64())])
    written = 0
    try:
        while remaining:
            rows: list[dict] = []
            stored: dict[int, int] = {}
            for message in consumer.consume(10_000, 1.0):
                if message.error():
                    raise KafkaException(message.error())
                partition, offset = message.partition(), message.offset()
                end = remaining.get(partition)
                if end is None:
                    continue
                if offset < end:
                    row = deserialize(message.value(), context)
                    row["partition"], row["offset"] = partition, offset
                    rows.append(row)
                    stored[partition] = offset + 1
                if offset >= end - 1:
                    del remaining[partition]
            if rows:
                write_deltalake(str(lake / topic), pa.Table.from_pylist(rows, schema=table_schema), mode="append")
                written += len(rows)
                if on_commit is not None:
                    on_commit.append((time.monotonic(), written))
            if stored:
                consumer.store_offsets(offsets=[TopicPartition(topic, p, o) for p, o in stored.items()])
    finally:
        consumer.close()
    return written
