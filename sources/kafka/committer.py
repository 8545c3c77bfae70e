"""Commit of the Kafka source (driver): the resume frontier goes to the consumer group.

After each batch the runtime hands the source its resume frontier; its offsets (offset = next to
read, Kafka's own convention) are committed to ``group_id`` so that Kafka tooling (lag monitors,
``kafka-consumer-groups``) sees the pipeline's progress. Resumption never reads them back, so the
commit is advisory: a failure is logged as a warning, the commit client is dropped, and the next
batch's commit tries again. Partitions of other sources in the frontier are left out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from reclock.errors import describe
from reclock.sources.kafka.clients import KafkaClients
from reclock.sources.kafka.config import kafka_partition
from reclock.timeline.frontier import Frontier, Partition

__all__ = ["commit_offsets"]

log = logging.getLogger(__name__)


def commit_offsets(
    clients: KafkaClients, group_id: str | None, frontier: Frontier, owns: Callable[[Partition], bool]
) -> None:
    """Commit the offsets of ``frontier``'s partitions that ``owns`` accepts to ``group_id``
    (nothing without a group or for a closed frontier). Never raises."""
    if group_id is None or frontier.is_closed:
        return
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    offsets = {
        TopicPartition(*kafka_partition(p)): OffsetAndMetadata(o, "", -1) for p, o in frontier.items() if owns(p)
    }
    if not offsets:
        return
    try:
        clients.committer(group_id).commit(offsets, timeout_ms=int(clients.read_timeout_s * 1000))
    except Exception as exc:
        log.warning(
            "kafka commit of %d partition offsets to group %r failed (advisory, will retry next batch): %s",
            len(offsets),
            group_id,
            describe(exc),
        )
        clients.drop_committer()
