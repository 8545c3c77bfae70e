"""The kafka-python internals the fetcher relies on (``sources/kafka/fetcher.py``): a release that
moves them must fail here, by name, not in a read at run time."""

from __future__ import annotations

import inspect

from kafka import KafkaConsumer
from kafka.cluster import ClusterMetadata
from kafka.net.compat import KafkaNetClient
from kafka.net.manager import KafkaConnectionManager
from kafka.protocol.consumer import FetchRequest

from reclock.sources.kafka.requests import _PARTITION, _TOPIC


def test_the_consumer_lends_its_connection_manager():
    assert "self._client = self.config['kafka_client']" in inspect.getsource(KafkaConsumer.__init__)
    assert KafkaConsumer.DEFAULT_CONFIG["kafka_client"] is KafkaNetClient
    assert "self._manager = KafkaConnectionManager" in inspect.getsource(KafkaNetClient.__init__)
    for method in ("send", "run", "call_soon", "wait_for", "least_loaded_node"):
        assert callable(getattr(KafkaConnectionManager, method)), method
    assert inspect.iscoroutinefunction(ClusterMetadata.refresh_metadata)
    assert callable(ClusterMetadata.leader_for_partition)
    assert callable(ClusterMetadata.update_metadata)  # the probe's own metadata request is applied with it


def test_metadata_requests_name_their_topics_or_ask_for_all():
    from kafka.protocol.metadata import MetadataRequest

    assert MetadataRequest.ALL_TOPICS is None
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name="t")],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    assert request.topics[0].name == "t"


def test_fetch_requests_are_built_by_field_name():
    partition = _PARTITION(
        partition=3, current_leader_epoch=-1, fetch_offset=42, last_fetched_epoch=-1, partition_max_bytes=1024
    )
    request = FetchRequest(
        max_wait_ms=100,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[_TOPIC(topic="t", partitions=[partition])],
        forgotten_topics_data=[],
        rack_id="",
        min_version=4,
        max_version=12,
    )
    assert request.topics[0].partitions[0].fetch_offset == 42
