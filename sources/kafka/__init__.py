"""Kafka source: exact offset ranges of topic partitions, read with kafka-python's connections.

A partition id is ``(topic, partition)`` and an offset is Kafka's own, so a :class:`Frontier` of
this source says, per partition, the first offset not yet complete. Each topic routes to one
output (by default an output named after the topic); a record becomes a row of that output with
``_partition`` / ``_offset`` lineage, or a row of :data:`~reclock.sources.base.ERRORS`.

The stages, in the design's words, one module each:

* **options and routing** (:mod:`~reclock.sources.kafka.config`): every option checked in the constructor;
  which output each topic feeds and how its records decode.
* **clients** (:mod:`~reclock.sources.kafka.clients`): how each kafka-python consumer is configured, and
  the driver's long-lived ones. ``client_settings`` (SASL, SSL, timeouts) are passed through to
  every client and never logged or shown in ``repr``.
* **probe** (:mod:`~reclock.sources.kafka.probe`, :meth:`KafkaSource.upper`, driver): the fetch-response
  last stable offset (``read_committed``, the default) or high watermark of every partition, never
  regressing; discovery of topics and partitions; start positions; partitions held back by an open
  transaction.
* **split** (:mod:`~reclock.sources.kafka.splits`, :meth:`KafkaSource.splits`, driver): ``[max(lower,
  start position), upper)`` per partition, cut at ``max_split_offsets``; offsets lost to retention.
* **fetch** (:mod:`~reclock.sources.kafka.fetcher`, Spark task): every partition of a task's splits in
  shared fetch requests, several in flight per leader, on a client pooled per process; record
  batches parsed into columns by :mod:`~reclock.sources.kafka.batches`, aborted transactions
  dropped by the protocol's rule (:mod:`~reclock.sources.kafka.transactions`).
* **read** (:mod:`~reclock.sources.kafka.reader`, :meth:`KafkaSource.read_group`, Spark task): exactly
  ``[start, end)`` of each split, a route's records pending across partitions and shaped
  (:mod:`~reclock.sources.kafka.decoding`) into output and errors batches of at most
  :attr:`KafkaSource.flush_rows` rows.
* **commit** (:mod:`~reclock.sources.kafka.committer`, :meth:`KafkaSource.commit`, driver): the resume
  frontier goes to the consumer group ``group_id``; advisory.

:class:`KafkaSource` (:mod:`~reclock.sources.kafka.source`) wires them into the source protocol.

Reads are ``read_committed`` by default (``isolation_level = "read_uncommitted"`` reads every
record up to the high watermark): exactly the committed records land, and an open transaction
holds the upper back (``docs/sources/kafka.md``, "Transactions").

Known limits: ``start="latest"`` and ``{"timestamp": ms}`` are resolved by each source instance when it first
needs them (pass explicit offsets for a start that must survive a restart before the first batch
binds). On Tansu, ``offsets_for_times`` always answers offset 0, so a timestamp start reads from
the beginning there.
"""

from reclock.sources.kafka.clients import SourceTimeout
from reclock.sources.kafka.config import METADATA_COLUMNS, KafkaRoute, output_name_for
from reclock.sources.kafka.reader import OFFSET_LOST as OFFSET_LOST
from reclock.sources.kafka.source import KafkaSource
from reclock.sources.kafka.splits import KafkaSplit

__all__ = [
    "METADATA_COLUMNS",
    "KafkaRoute",
    "KafkaSource",
    "KafkaSplit",
    "SourceTimeout",
    "output_name_for",
]
