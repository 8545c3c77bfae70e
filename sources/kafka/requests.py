"""Kafka requests sent straight on a pooled client's connection: fetch, ends, metadata.

The readers and the probe (:mod:`~reclock.sources.kafka.fetcher`, :mod:`~reclock.sources.kafka.probe`)
do not go through ``KafkaConsumer``'s own fetcher or metadata refresh: they build the protocol's
requests here and send them on the client's connection manager (kafka-python's ``_client``), one
round trip each, so a probe of a wide topic or a fetch of many partitions costs one request per
leader. ``tests/unit/test_kafka_fetcher.py`` fails loudly if a kafka-python release moves the
request types.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

__all__ = ["Partition", "ends", "fetch_request", "metadata"]

#: A Kafka partition: its topic and index.
Partition = tuple[str, int]


def fetch_request(
    asks: dict[Partition, tuple[int, int]],
    *,
    read_committed: bool = False,
    max_bytes: int = 64 << 20,
    max_wait_ms: int = 100,
) -> Any:
    """A ``FetchRequest`` for ``{partition: (offset, max bytes)}``, no session; ``read_committed``
    asks for isolation level 1 (records up to the last stable offset, aborted transactions listed).
    ``max_bytes`` caps the whole response (a broker still sends the first partition's first batch
    whole, KIP-74, and every partition's ends). With nothing to send, the broker waits up to
    ``max_wait_ms`` for records before it answers."""
    from kafka.protocol.consumer import FetchRequest

    topics: dict[str, list[Any]] = defaultdict(list)
    for (topic, index), (offset, size) in asks.items():
        topics[topic].append(
            _PARTITION(
                partition=index,
                current_leader_epoch=-1,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                partition_max_bytes=size,
            )
        )
    return FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=1 if read_committed else 0,
        session_id=0,
        session_epoch=-1,
        topics=[_TOPIC(topic=t, partitions=p) for t, p in topics.items()],
        forgotten_topics_data=[],
        rack_id="",
        min_version=4,
        max_version=12,
    )


def ends(
    client: Any, positions: dict[Partition, int], timeout_s: float, *, read_committed: bool
) -> dict[Partition, tuple[int, int]]:
    """``(end, high watermark)`` that the fetch response carries for each partition, asked at
    ``positions`` (a partition's last known end: nothing to send back) in one request per leader.
    The end is the high watermark, or with ``read_committed`` the *last stable offset* of the
    same response (a Fetch v4+ field: where the earliest open transaction begins). Partitions
    without a known leader or with an error are left out: the caller asks them another way.

    The request caps its whole response at one byte: a broker then sends records of the first
    partition only (one batch, KIP-74) and the ends of all. A partition's byte budget alone is
    not enough: the broker sends the whole batch at the offset asked, and the offset a first
    probe asks at lies in the partition's last batch, which on a topic of small partitions is
    all of it. Without the cap, the first probe of a 1,000-partition topic read the whole topic
    (0.73 s of Tansu's time against 0.01 s with it).

    The broker is asked to wait at most 1 ms for records: asked at their known ends, partitions
    with nothing new made every later probe wait out the reader's 100 ms (``max_wait_ms``) for
    records it never wanted. Not 0: Tansu answers ``max_wait_ms`` 0 with no partitions at all."""
    from kafka import TopicPartition

    cluster = client._client.cluster
    for topic in sorted({topic for topic, _ in positions}):
        client.partitions_for_topic(topic)
    by_leader: dict[int, dict[Partition, tuple[int, int]]] = defaultdict(dict)
    for partition, offset in positions.items():
        leader = cluster.leader_for_partition(TopicPartition(*partition))
        if leader is not None and leader >= 0:
            by_leader[leader][partition] = (offset, 1)
    manager = client._client._manager
    futures = [
        manager.call_soon(
            lambda asks=asks, leader=leader: manager.send(
                fetch_request(asks, read_committed=read_committed, max_bytes=1, max_wait_ms=1), node_id=leader
            )
        )
        for leader, asks in by_leader.items()
    ]
    out: dict[Partition, tuple[int, int]] = {}
    for future in futures:
        response = manager.run(lambda future=future: manager.wait_for(future, int(timeout_s * 1000)))
        for topic_data in response.responses:
            for data in topic_data.partitions:
                if data.error_code or data.high_watermark < 0:
                    continue
                end = data.last_stable_offset if read_committed else data.high_watermark
                if end >= 0:
                    out[(topic_data.topic, data.partition_index)] = (min(end, data.high_watermark), data.high_watermark)
    return out


def metadata(client: Any, topics: Sequence[str] | None, timeout_s: float) -> dict[str, list[int]]:
    """``topic -> partitions`` of ``topics`` (every topic but the internal ones when ``None``),
    from one ``MetadataRequest`` on ``client``'s connection, also applied to the client's
    cluster view so that the leaders it knows are the ones just answered. A topic the broker
    does not know is left out (and, unlike a topic kafka-python is told to track, not asked
    for again in the background).

    One round trip, sent at once: kafka-python's ``topics()`` asks for every topic of the
    cluster (11,010 partitions on the benchmark's broker for a 1,000-partition source) and waits
    out the client's retry backoff since its last refresh first."""
    from kafka.protocol.metadata import MetadataRequest

    asked = (
        MetadataRequest.ALL_TOPICS
        if topics is None
        else [MetadataRequest.MetadataRequestTopic(name=topic) for topic in sorted(set(topics))]
    )
    request = MetadataRequest(
        topics=asked,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    manager = client._client._manager
    node = manager.least_loaded_node()
    future = manager.call_soon(lambda: manager.send(request, node_id=node))
    response = manager.run(lambda: manager.wait_for(future, int(timeout_s * 1000)))
    client._client.cluster.update_metadata(response)
    return {
        t.name: sorted(p.partition_index for p in t.partitions)
        for t in response.topics
        if t.error_code == 0 and not t.is_internal
    }


def _fetch_types() -> tuple[Any, Any]:
    from kafka.protocol.consumer import FetchRequest

    return FetchRequest.FetchTopic, FetchRequest.FetchTopic.FetchPartition


_TOPIC, _PARTITION = _fetch_types()
