"""Baseline (e): the afternoon script on librdkafka. One process consumes with confluent-kafka,
decodes each ``consume(10000)`` batch's JSON values with ``pyarrow.json`` per topic, and appends
them to a Delta table per topic with one ``write_deltalake`` each.

The same pipeline as :mod:`benchmarks.baselines.naive_pipeline`, on the faster client: partitions
assigned explicitly (no rebalance wait), one vectorised JSON parse per topic and batch, and
at-least-once offsets (stored after the write, committed by librdkafka in the background). What
it does not give is what reclock is for: no exactly-once across a crash (a crash between a write
and the next background commit duplicates batches), no shared timeline, one process.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pa_json

__all__ = ["run"]


def run(
    bootstrap: str,
    ends: Mapping[str, Mapping[int, int]],
    lake: Path,
    schema: pa.Schema,
    group_id: str,
    on_commit: list[tuple[float, int]] | None = None,
) -> int:
    """Land the offsets below ``ends`` (``{topic: {partition: end offset}}``) in ``lake/<topic>``.

    Returns the rows written; ``on_commit`` gets ``(time.monotonic(), total rows so far)`` after
    every Delta write.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from deltalake import write_deltalake

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "check.crcs": True,
            "log_level": 3,
        }
    )
    remaining = {(t, p): end for t, parts in ends.items() for p, end in parts.items() if end > 0}
    consumer.assign([TopicPartition(t, p, 0) for t, p in remaining])
    table_schema = pa.schema([*schema, pa.field("partition", pa.int32()), pa.field("offset", pa.int64())])
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    written = 0
    try:
        while remaining:
            by_topic: dict[str, tuple[list[bytes], list[int], list[int]]] = {}
            stored: dict[tuple[str, int], int] = {}
            for message in consumer.consume(10_000, 1.0):
                if message.error():
                    raise KafkaException(message.error())
                key = (message.topic(), message.partition())
                end = remaining.get(key)
                if end is None:
                    continue
                offset = message.offset()
                if offset < end:
                    values, partitions, offsets = by_topic.setdefault(key[0], ([], [], []))
                    values.append(message.value())
                    partitions.append(key[1])
                    offsets.append(offset)
                    stored[key] = offset + 1
                if offset >= end - 1:
                    del remaining[key]
            for topic, (values, partitions, offsets) in by_topic.items():
                table = pa_json.read_json(io.BytesIO(b"\n".join(values)), parse_options=options)
                table = table.append_column("partition", pa.array(partitions, pa.int32()))
                table = table.append_column("offset", pa.array(offsets, pa.int64()))
                write_deltalake(str(lake / topic), table.cast(table_schema), mode="append")
                written += table.num_rows
                if on_commit is not None:
                    on_commit.append((time.monotonic(), written))
            if stored:
                consumer.store_offsets(offsets=[TopicPartition(t, p, o) for (t, p), o in stored.items()])
    finally:
        consumer.close()
    return written
