"""Baseline (b): what a capable user writes without reclock. One process polls kafka-python,
decodes each poll's JSON values in one vectorised call, appends them to a Delta table per topic
with ``write_deltalake`` and commits the consumer group's offsets after each write.

It is written fairly, not as a straw man: partitions are assigned explicitly (no group rebalance
wait), fetches are large, JSON is decoded by ``pyarrow.json`` over the whole poll rather than one
``json.loads`` per record, and each poll becomes one Delta commit per topic. What it does not give
is what reclock is for: no exactly-once across a crash (a crash between the write and the offset
commit duplicates a batch), no shared timeline, no parallelism beyond one process.
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
    """Land every topic of ``ends`` (``{topic: {partition: end offset}}``) in ``lake/<topic>``.

    Returns the rows written; ``on_commit`` gets ``(time.monotonic(), total rows so far)`` after
    every Delta write.
    """
    from deltalake import write_deltalake
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=50_000,
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
        fetch_max_wait_ms=100,
    )
    tps = [TopicPartition(t, p) for t, parts in ends.items() for p in parts]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    table_schema = pa.schema([*schema, pa.field("partition", pa.int32()), pa.field("offset", pa.int64())])
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    written = 0
    try:
        while any(consumer.position(tp) < ends[tp.topic][tp.partition] for tp in tps):
            polled = consumer.poll(timeout_ms=500)
            by_topic: dict[str, list] = {}
            for tp, records in polled.items():
                by_topic.setdefault(tp.topic, []).extend(records)
            for topic, records in by_topic.items():
                values = pa_json.read_json(io.BytesIO(b"\n".join(r.value for r in records)), parse_options=options)
                table = values.append_column(
                    "partition", pa.array([r.partition for r in records], pa.int32())
                ).append_column("offset", pa.array([r.offset for r in records], pa.int64()))
                write_deltalake(str(lake / topic), table.cast(table_schema), mode="append")
                written += table.num_rows
                if on_commit is not None:
                    on_commit.append((time.monotonic(), written))
            if polled:
                consumer.commit()
    finally:
        consumer.close()
    return written
