"""Baseline (d): librdkafka's limit. One confluent-kafka consumer reads the same offset ranges in
one process and does nothing with the records but count them.

librdkafka fetches on its own threads, many partitions per request, and hands messages over in
batches of ``consume(10000)``; on two cores shared with the broker that is the practical ceiling
of any Kafka reader here, so reclock on Spark >= 1.0x this means exactly-once ingestion at the
speed of the fastest client doing nothing else. Written as a capable user would: partitions
assigned explicitly at offset 0 (no group join or rebalance wait), nothing committed, CRC32C
checked (librdkafka's default is off; reclock and the kafka-python baselines check it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

__all__ = ["run"]


def run(bootstrap: str, ends: Mapping[str, Mapping[int, int]], progress: list[tuple[float, int]] | None = None) -> int:
    """Records below ``ends`` (``{topic: {partition: end offset}}``) of every partition, from 0.

    Stops when every partition has handed over its last offset below its end (transaction markers
    take offsets too, so the count is checked by the caller, not assumed). ``progress`` gets
    ``(time.monotonic(), records so far)`` after every ``consume`` call.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "confluent-consume-baseline",  # required by the client; never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "check.crcs": True,
            "log_level": 3,
        }
    )
    remaining = {(t, p): end for t, parts in ends.items() for p, end in parts.items() if end > 0}
    consumer.assign([TopicPartition(t, p, 0) for t, p in remaining])
    count = 0
    try:
        while remaining:
            for message in consumer.consume(10_000, 1.0):
                if message.error():
                    raise KafkaException(message.error())
                key = (message.topic(), message.partition())
                end = remaining.get(key)
                if end is None:
                    continue
                offset = message.offset()
                if offset < end:
                    count += 1
                if offset >= end - 1:
                    del remaining[key]
            if progress is not None:
                progress.append((time.monotonic(), count))
    finally:
        consumer.close()
    return count
