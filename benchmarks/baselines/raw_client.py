"""Baseline (a): the client's limit. kafka-python reads the same offset ranges in the same Spark
tasks as reclock and does nothing else with the records but count them.

No decoding, no stamping, no parquet, no Delta commit: whatever reclock does on top of this is its
own cost, and this is the ceiling any Kafka-to-Delta path built on kafka-python in Spark tasks can
reach on this machine. The consumer is configured as a capable user would for bulk reads (big
fetches, many records per poll); ``check_crcs`` stays on (the ``crc32c`` package makes it cheap),
as it is in reclock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["count_range", "run"]

Range = tuple[str, int, int, int]  # topic, partition, start, end (exclusive)


def count_range(bootstrap: str, rng: Range) -> int:
    """Records in offsets ``[start, end)`` of one partition; stops on position (markers take offsets)."""
    from kafka import KafkaConsumer, TopicPartition

    topic, partition, start, end = rng
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        max_poll_records=50_000,
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
        fetch_max_wait_ms=100,
    )
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, start)
    count = 0
    try:
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=500).values():
                if records[-1].offset < end:
                    count += len(records)
                else:
                    count += sum(1 for r in records if r.offset < end)
    finally:
        consumer.close()
    return count


def run(spark: SparkSession, bootstrap: str, ranges: Sequence[Range]) -> int:
    """One Spark job, one task per range (as reclock's data plane runs splits); the total count."""
    rdd = spark.sparkContext.parallelize(list(ranges), len(ranges))
    return sum(rdd.map(lambda rng: count_range(bootstrap, rng)).collect())
