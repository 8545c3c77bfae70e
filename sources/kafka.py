"""Kafka source: exact offset ranges of topic partitions, read with kafka-python.

A partition id is ``(topic, partition)`` and an offset is Kafka's own, so a :class:`Frontier` of
this source says, per partition, the first offset not yet complete. Each topic routes to one
output (by default an output named after the topic); a record becomes a row of that output with
``_partition`` / ``_offset`` lineage, or a row of :data:`~sources.base.ERRORS`.

The stages, in the design's words:

* **probe** (:meth:`KafkaSource.upper`, driver): the true end of each partition is the *high
  watermark carried by a Fetch response*, read with ``consumer.highwater(tp)`` after a poll. Never
  ``end_offsets()``: ``ListOffsets(LATEST)`` is wrong on the Tansu test broker (it answers the last
  batch's base offset + 1). Every probe uses a fresh consumer (kafka-python keeps buffered and
  in-flight fetch responses across ``unsubscribe``/``assign``, so a reused one can answer with an
  earlier probe's high watermark), seeks each partition to its last known end and polls until
  every partition has answered. The frontier it reports is the join of everything learned, so it
  never regresses. Topics matching ``pattern``
  and partitions added while running join as soon as metadata shows them, with their whole high
  watermark: data a partition already holds binds at one time. A high watermark that goes back
  (topic deleted and re-created, unclean leader election) is a :class:`DefiniteSourceError`.
* **split** (:meth:`KafkaSource.splits`, driver): ``[max(lower, start position), upper)`` per
  partition, cut at ``max_split_offsets``. The start position (``earliest``, ``latest``, explicit
  offsets, a timestamp) applies only to a partition the lower frontier has never advanced. An
  offset below the partition's low watermark was deleted before it was read: a
  :class:`DefiniteSourceError` naming the partition and both offsets, or, with
  ``on_offset_lost="skip"``, the split starts at the low watermark and reports the skipped range
  as one :data:`ERRORS` row (kind ``offset_lost``).
* **read** (:meth:`KafkaSource.read`, Spark task): a fresh consumer assigns the partition, seeks to
  ``start`` (mid-batch seeks work) and polls until its *position* reaches ``end``: transaction
  markers and compaction gaps take offsets but yield no record, so counting records would never
  finish. Records at or past ``end`` (fetches return whole batches) are dropped, so a split
  always yields the same records; a poll never asks for more records than the range has left, so
  the rest of a fetch is never decoded (kafka-python decodes records in Python, ~15 us each). A
  batch is flushed every :attr:`KafkaSource.flush_rows` rows. If no progress is made for
  ``read_timeout_s`` the read raises :class:`SourceTimeout` (retryable) instead of hanging.
* **commit** (:meth:`KafkaSource.commit`, driver): the resume frontier goes to the consumer
  group ``group_id`` (offset = next to read); advisory, so a failure is logged, never raised.

``client_settings`` (SASL, SSL, timeouts) are passed through to every kafka-python client and
never logged or shown in ``repr``. Clients are created lazily and dropped when the source is
pickled, so the source can travel to Spark executors.

Known limits: reads are ``read_uncommitted`` (``isolation_level`` is reserved: the probe's high
watermark is not the last stable offset), so records of aborted transactions are ingested;
``start="latest"`` and ``{"timestamp": ms}`` are resolved by each source instance when it first
needs them (pass explicit offsets for a start that must survive a restart before the first batch
binds). On Tansu, ``offsets_for_times`` always answers offset 0, so a timestamp start reads from
the beginning there.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from reclock.errors import ConfigError, DefiniteSourceError, TransientError, describe
from reclock.time import Frontier, Partition, decode_partition, encode_partition
from sources.base import ERRORS, LINEAGE_FIELDS, Output, RecordError, SourceBase, Split, debezium_schema, error_batch
from sources.decode import Decoder, as_schema, make_decoder

__all__ = [
    "METADATA_COLUMNS",
    "KafkaRoute",
    "KafkaSource",
    "KafkaSplit",
    "SourceTimeout",
    "output_name_for",
]

log = logging.getLogger(__name__)

Policy = Literal["fail", "skip"]

#: Record metadata an output can carry as columns, with their Arrow types (``key`` may be text).
METADATA_COLUMNS: dict[str, pa.DataType] = {
    "key": pa.binary(),
    "headers": pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.timestamp("ms", tz="UTC"),
}

#: ``kind`` of the errors row that reports offsets deleted before they were read.
OFFSET_LOST = "offset_lost"

#: Client settings reclock owns: a user value would break exact, replayable reads.
_RESERVED_SETTINGS = frozenset(
    {
        "bootstrap_servers",
        "group_id",
        "enable_auto_commit",
        "auto_offset_reset",
        "key_deserializer",
        "value_deserializer",
        "isolation_level",
        "allow_auto_create_topics",
        "consumer_timeout_ms",
    }
)

#: Longest a probe waits for the partitions' fetch answers (those that answered are reported).
_PROBE_WAIT_S = 5.0
_START_WORDS = ("earliest", "latest")
_POLICIES = ("fail", "skip")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class SourceTimeout(TransientError):
    """The broker did not answer in time (down, paused, unreachable). Retryable: the pipeline
    stalls and retries the batch; the data itself is fine."""


@dataclass(frozen=True)
class KafkaSplit(Split):
    """Offsets ``[start, end)`` of one ``(topic, partition)``.

    ``lost_from`` is set when offsets ``[lost_from, start)`` were deleted before they were read
    (``on_offset_lost="skip"``): :meth:`KafkaSource.read` reports them as one errors row.
    """

    lost_from: int | None = None

    @property
    def topic(self) -> str:
        return self.partition[0]

    @property
    def kafka_partition(self) -> int:
        return self.partition[1]


@dataclass(frozen=True)
class KafkaRoute:
    """One output's resolved configuration: which topics feed it and how records decode."""

    name: str
    topics: frozenset[str]
    pattern: re.Pattern[str] | None
    decoder: Decoder
    metadata: tuple[tuple[str, str], ...]  # (metadata field, column name)
    key_format: Literal["bytes", "text"]
    output: Output = field(compare=False)

    def matches(self, topic: str) -> bool:
        return topic in self.topics or (self.pattern is not None and self.pattern.fullmatch(topic) is not None)


def output_name_for(topic: str) -> str:
    """The default output name for a topic: an identifier (``orders.v1`` -> ``orders_v1``)."""
    name = re.sub(r"[^0-9A-Za-z_]+", "_", topic).strip("_").lower()
    name = re.sub(r"_+", "_", name)
    if not name:
        return "topic"
    return name if name[0].isalpha() else f"t_{name}"


class KafkaSource(SourceBase):
    """Kafka topics as a reclock source; see the module docstring for the contract.

    Topic selection: ``topics`` (a list) or ``pattern`` (a regex matched against whole topic
    names; internal ``__*`` topics are excluded). Outputs: ``outputs`` maps an output name to its
    options ``{"topics": [...] | "pattern": "...", "format": ..., "schema": ..., "metadata": ...,
    "key": [...], "envelope": ...}``; without it, each listed topic gets an output named after it
    (:func:`output_name_for`), and a ``pattern`` source gets one output named after the pattern.
    The format options given to the constructor (``format``, ``schema``, ``delimiter``,
    ``quote_char``, ``avro_schema``, ``confluent``, ``metadata``, ``key_format``) are the defaults
    every output inherits. ``metadata`` names record metadata to add as columns: a list of
    ``key``, ``headers``, ``topic``, ``partition``, ``offset``, ``timestamp``, or a mapping from
    those to column names.
    """

    #: Rows per Arrow batch that :meth:`read` yields (bounded memory per task).
    flush_rows: int = 50_000

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        topics: Sequence[str] | None = None,
        pattern: str | None = None,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        format: str = "bytes",
        schema: pa.Schema | None = None,
        delimiter: str = ",",
        quote_char: str = '"',
        avro_schema: str | Mapping[str, Any] | None = None,
        confluent: bool = False,
        metadata: Sequence[str] | Mapping[str, str] = (),
        key_format: str = "bytes",
        start: str | Mapping[Any, int] = "earliest",
        on_record_error: Policy = "skip",
        on_offset_lost: Policy = "fail",
        group_id: str | None = None,
        client_settings: Mapping[str, Any] | None = None,
        max_split_offsets: int = 1_000_000,
        read_timeout_s: float = 30.0,
    ) -> None:
        self.bootstrap_servers = _check_bootstrap(bootstrap_servers)
        self.topics, self.pattern = _check_selection(topics, pattern)
        self.on_record_error: Policy = _check_choice("on_record_error", on_record_error, _POLICIES)  # type: ignore[assignment]
        self.on_offset_lost: Policy = _check_choice("on_offset_lost", on_offset_lost, _POLICIES)  # type: ignore[assignment]
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ConfigError("group_id", "must be a non-empty string or None")
        self.group_id = group_id
        self._client_settings = _check_client_settings(client_settings)
        if not isinstance(max_split_offsets, int) or isinstance(max_split_offsets, bool) or max_split_offsets < 1:
            raise ConfigError("max_split_offsets", f"must be an int >= 1, got {max_split_offsets!r}")
        self.max_split_offsets = max_split_offsets
        if not isinstance(read_timeout_s, (int, float)) or isinstance(read_timeout_s, bool) or read_timeout_s <= 0:
            raise ConfigError("read_timeout_s", f"must be a number > 0, got {read_timeout_s!r}")
        self.read_timeout_s = float(read_timeout_s)
        defaults = {
            "format": format,
            "schema": schema,
            "delimiter": delimiter,
            "quote_char": quote_char,
            "avro_schema": avro_schema,
            "confluent": confluent,
            "metadata": metadata,
            "key_format": key_format,
        }
        self._routes = _build_routes(self.topics, self.pattern, outputs, defaults)
        self.start = _check_start(start)

        # Driver-side state: what the probe has learned. Clients are never pickled.
        self._known: dict[tuple[str, int], int] = {}
        self._seen_topics: set[str] = set()
        self._latest_start: dict[tuple[str, int], int] | None = None
        self._timestamp_start: dict[tuple[str, int], int] = {}
        self._unrouted_warned: set[str] = set()
        self._probe_client: Any = None
        self._commit_client: Any = None

    # -- the Source protocol --------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        return [route.output for route in self._routes]

    def upper(self) -> Frontier:
        """Probe: the high watermark of every partition of every routed topic, joined with all
        earlier probes (never regresses). Raises :class:`SourceTimeout` if the broker does not
        answer, :class:`DefiniteSourceError` if a partition's end went back or a listed topic was
        deleted."""
        from kafka import TopicPartition

        consumer = self._fresh_probe_consumer()
        try:
            # Step 1: discover. A topic (or partition) that appears joins the frontier now.
            partitions = self._discover(consumer)
            tps = [TopicPartition(t, p) for t, p in partitions]
            # Step 2: probe the fetch-response high watermark of each partition.
            learned = self._probe(consumer, tps)
            regressed = [tp for tp, hw in learned.items() if hw < self._known.get(tp, 0)]
            if regressed:  # confirm with a second probe (a fresh consumer) before calling it definite
                again = self._fresh_probe_consumer()
                try:
                    learned.update(self._probe(again, [TopicPartition(t, p) for t, p in regressed]))
                finally:
                    _close(again)
                regressed = [tp for tp in regressed if learned[tp] < self._known.get(tp, 0)]
            if regressed:
                t, p = regressed[0]
                raise DefiniteSourceError(
                    f"kafka partition {t}[{p}]: high watermark went back from {self._known[(t, p)]} to "
                    f"{learned[(t, p)]} (topic deleted and re-created, or records lost on the broker)"
                )
            if tps and not learned:
                raise SourceTimeout(
                    f"kafka probe: none of {len(tps)} partitions answered a fetch within "
                    f"{min(self.read_timeout_s, _PROBE_WAIT_S)}s ({self._where()})"
                )
        except (SourceTimeout, DefiniteSourceError):
            self._drop_probe()
            raise
        except Exception as exc:
            self._drop_probe()
            if _is_transient(exc):
                raise SourceTimeout(f"kafka probe failed: {describe(exc)} ({self._where()})") from exc
            raise
        finally:
            _close(consumer)
        # Step 3: join into what we knew; the first probe also fixes start="latest".
        for key, hw in learned.items():
            if hw > self._known.get(key, 0):
                self._known[key] = hw
        if self._latest_start is None:
            self._latest_start = dict(learned)
        return Frontier({key: hw for key, hw in self._known.items() if hw > 0})

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[KafkaSplit]:
        """Splits of ``[max(lower, start position), upper)`` per partition of this source.

        The start position applies only where ``lower`` has never advanced (offset 0). An offset
        below the partition's low watermark is lost: :class:`DefiniteSourceError` with
        ``on_offset_lost="fail"``, else the split carries the lost range in ``lost_from``.
        """
        if upper.is_closed:
            raise ValueError("a Kafka source never closes; splits need a finite upper")
        todo = sorted(
            ((p, lower.offset(p), end) for p, end in upper.items() if end > lower.offset(p) and self._owns(p)),
            key=lambda item: (item[0][0], item[0][1]),
        )
        if not todo:
            return []
        fresh = [p for p, begin, _ in todo if begin == 0]
        starts = self._start_positions(fresh) if fresh else {}
        lows = self._low_watermarks([p for p, _, _ in todo])
        out: list[KafkaSplit] = []
        for p, begin, end in todo:
            low = lows.get(p, 0)
            if begin == 0:
                begin, explicit = starts.get(p, (low, False))
                if not explicit:
                    begin = max(begin, low)  # earliest/latest/timestamp never report a loss
            lost_from: int | None = None
            if begin < low:
                if self.on_offset_lost == "fail":
                    raise DefiniteSourceError(
                        f"kafka partition {p[0]}[{p[1]}]: offset {begin} is below the low watermark {low}; "
                        f"records [{begin}, {low}) were deleted (retention?) before they were read. "
                        f"Set on_offset_lost='skip' to continue from {low} and record the gap."
                    )
                lost_from, begin = begin, min(low, end)
            if lost_from is not None and begin >= end:
                out.append(KafkaSplit(p, end, end, lost_from))
                continue
            while begin < end:
                stop = min(end, begin + self.max_split_offsets)
                out.append(KafkaSplit(p, begin, stop, lost_from))
                lost_from = None
                begin = stop
        return out

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Yield the records of ``split`` (exactly ``[start, end)``) as ``(output, batch)`` pairs.

        Runs on an executor in a fresh consumer; replayable. Raises :class:`SourceTimeout` when
        the broker makes no progress for ``read_timeout_s``.
        """
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError

        topic, kpart = split.partition
        route = self._route(topic)
        if route is None:
            raise ValueError(f"topic {topic!r} is not routed to any output of this source")
        encoded = encode_partition(split.partition)
        lost_from = getattr(split, "lost_from", None)
        if lost_from is not None and lost_from < split.start:
            yield ERRORS, self._lost_batch(encoded, split.partition, lost_from, split.start)
        if split.start >= split.end:
            return

        tp = TopicPartition(topic, kpart)
        end = split.end
        timeout = self.read_timeout_s
        deadline = time.monotonic() + timeout
        consumer = self._read_consumer(deadline)
        try:
            consumer.assign([tp])
            consumer.seek(tp, split.start)
            position = split.start
            buf = _Buffer(route)
            while position < end:
                # Step 1: poll; stop on position, since markers and gaps take offsets.
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    hw = consumer.highwater(tp)
                    raise SourceTimeout(
                        f"kafka read of {topic}[{kpart}] [{split.start}, {end}) made no progress for {timeout}s "
                        f"at offset {position} (high watermark {hw}; {self._where()})"
                    )
                try:
                    # Never decode past the end: a fetch returns whole batches, often far beyond it.
                    fetched = consumer.poll(
                        timeout_ms=int(min(remaining, 0.5) * 1000) + 1,
                        max_records=max(1, min(self.flush_rows, end - position)),
                    )
                except OffsetOutOfRangeError:
                    # Retention deleted what this split needs after it was planned.
                    low = self._low_watermarks([split.partition], consumer).get(split.partition, 0)
                    if low <= position:
                        raise
                    if self.on_offset_lost == "fail":
                        raise DefiniteSourceError(
                            f"kafka partition {topic}[{kpart}]: offset {position} is below the low watermark "
                            f"{low}; records [{position}, {min(low, end)}) were deleted before they were read"
                        ) from None
                    yield ERRORS, self._lost_batch(encoded, split.partition, position, min(low, end))
                    position = min(low, end)
                    if position < end:
                        consumer.seek(tp, position)
                    deadline = time.monotonic() + timeout
                    continue
                records = fetched.get(tp, ())
                if records:
                    if records[-1].offset >= end:
                        records = [r for r in records if r.offset < end]
                    if records and records[0].offset < split.start:
                        records = [r for r in records if r.offset >= split.start]
                    buf.add(records)
                new_position = consumer.position(tp, timeout_ms=int(max(remaining, 0.001) * 1000))
                if new_position is not None and new_position > position:
                    position = new_position
                    deadline = time.monotonic() + timeout
                # Step 2: flush a bounded batch.
                if len(buf) >= self.flush_rows:
                    yield from self._shape(buf, encoded, topic, kpart)
            if len(buf):
                yield from self._shape(buf, encoded, topic, kpart)
        finally:
            _close(consumer)

    def commit(self, frontier: Frontier) -> None:
        """Commit the frontier's offsets of this source's partitions to ``group_id`` (offset =
        next to read). Advisory: logs a warning on failure, never raises."""
        if self.group_id is None or frontier.is_closed:
            return
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        offsets = {
            TopicPartition(p[0], p[1]): OffsetAndMetadata(o, "", -1) for p, o in frontier.items() if self._owns(p)
        }
        if not offsets:
            return
        try:
            if self._commit_client is None:
                self._commit_client = self._consumer(group_id=self.group_id, deadline=None)
            self._commit_client.commit(offsets, timeout_ms=int(self.read_timeout_s * 1000))
        except Exception as exc:
            log.warning(
                "kafka commit of %d partition offsets to group %r failed (advisory, will retry next batch): %s",
                len(offsets),
                self.group_id,
                describe(exc),
            )
            client, self._commit_client = self._commit_client, None
            if client is not None:
                _close(client)

    def close(self) -> None:
        """Close the driver-side clients (the probe and the committer)."""
        self._drop_probe()
        client, self._commit_client = self._commit_client, None
        if client is not None:
            _close(client)

    # -- pickling and repr ----------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_probe_client"] = None
        state["_commit_client"] = None
        return state

    def __repr__(self) -> str:
        selection = f"topics={list(self.topics)!r}" if self.topics else f"pattern={self.pattern!r}"
        settings = "<redacted>" if self._client_settings else "{}"
        return (
            f"KafkaSource(bootstrap_servers={self.bootstrap_servers!r}, {selection}, "
            f"outputs={[r.name for r in self._routes]!r}, start={self._start_repr()}, group_id={self.group_id!r}, "
            f"client_settings={settings})"
        )

    # -- routing --------------------------------------------------------------------------------

    def _route(self, topic: str) -> KafkaRoute | None:
        for route in self._routes:
            if route.matches(topic):
                return route
        return None

    def _selected(self, topic: str) -> bool:
        if self.topics:
            return topic in self.topics
        assert self.pattern is not None
        return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None

    def _owns(self, partition: Partition) -> bool:
        return (
            isinstance(partition, tuple)
            and len(partition) == 2
            and isinstance(partition[0], str)
            and isinstance(partition[1], int)
            and self._selected(partition[0])
            and self._route(partition[0]) is not None
        )

    # -- clients --------------------------------------------------------------------------------

    def _consumer(self, *, deadline: float | None, **overrides: Any) -> Any:
        from kafka import KafkaConsumer

        budget_ms = int(self.read_timeout_s * 1000)
        if deadline is not None:
            budget_ms = max(1, min(budget_ms, int((deadline - time.monotonic()) * 1000)))
        config: dict[str, Any] = {
            "client_id": "reclock",
            "request_timeout_ms": max(1000, min(30_000, int(self.read_timeout_s * 1000))),
            "bootstrap_timeout_ms": budget_ms,
            "retry_backoff_ms": 100,
            "reconnect_backoff_max_ms": 1000,
            "check_crcs": True,
        }
        config.update(self._client_settings)
        config.update(
            {
                "bootstrap_servers": self.bootstrap_servers,
                "group_id": None,
                "enable_auto_commit": False,
                "auto_offset_reset": "none",
                "isolation_level": "read_uncommitted",
                "allow_auto_create_topics": False,
            }
        )
        config.update(overrides)
        if config.get("fetch_max_wait_ms", 500) >= config["request_timeout_ms"]:
            config["fetch_max_wait_ms"] = max(1, config["request_timeout_ms"] // 2)
        try:
            return KafkaConsumer(**config)
        except Exception as exc:
            if _is_transient(exc):
                raise SourceTimeout(f"kafka: cannot reach the brokers: {describe(exc)} ({self._where()})") from exc
            raise

    def _read_consumer(self, deadline: float) -> Any:
        return self._consumer(
            deadline=deadline,
            max_poll_records=self.flush_rows,
            max_partition_fetch_bytes=16 << 20,
            fetch_max_bytes=64 << 20,
            fetch_max_wait_ms=100,
        )

    def _probe_consumer(self) -> Any:
        """The driver's long-lived consumer for low watermarks and timestamp lookups."""
        if self._probe_client is None:
            self._probe_client = self._fresh_probe_consumer()
        return self._probe_client

    def _fresh_probe_consumer(self) -> Any:
        """A consumer for one probe: creating one costs a few ms, the bootstrap rides on the
        metadata request every probe makes anyway."""
        return self._consumer(
            deadline=None,
            auto_offset_reset="earliest",  # a last known end beyond the log resets, then answers
            max_partition_fetch_bytes=1024,  # only the high watermark matters
            fetch_max_wait_ms=5,
            retry_backoff_ms=20,  # also spaces metadata refreshes: each probe needs one
        )

    def _drop_probe(self) -> None:
        client, self._probe_client = self._probe_client, None
        if client is not None:
            _close(client)

    # -- probe internals ------------------------------------------------------------------------

    def _discover(self, consumer: Any) -> list[tuple[str, int]]:
        # Always a metadata round trip. kafka-python gives it no timeout, and a metadata refresh
        # that cannot reach a node retries until one answers, so bound the wait here.
        topics = _bounded(consumer.topics, self.read_timeout_s, f"kafka metadata request ({self._where()})")
        partitions: list[tuple[str, int]] = []
        present = set()
        for topic in sorted(topics):
            if not self._selected(topic):
                continue
            if self._route(topic) is None:
                if topic not in self._unrouted_warned:
                    self._unrouted_warned.add(topic)
                    log.warning("kafka topic %r matches the pattern but no output; ignored", topic)
                continue
            present.add(topic)
            for p in sorted(consumer.partitions_for_topic(topic) or ()):
                partitions.append((topic, p))
        missing = [t for t in self.topics if t not in present]
        gone = [t for t in missing if t in self._seen_topics]
        if gone:
            raise DefiniteSourceError(f"kafka topic {gone[0]!r} was deleted while the source reads it")
        for topic in missing:
            if topic not in self._unrouted_warned:
                self._unrouted_warned.add(topic)
                log.warning("kafka topic %r does not exist (yet); waiting for it", topic)
        for topic in present - self._seen_topics:
            log.info("kafka source discovered topic %r", topic)
        self._seen_topics |= present
        return partitions

    def _probe(self, consumer: Any, tps: list[Any]) -> dict[tuple[str, int], int]:
        """Fetch-response high watermark per partition (those that answered in time).

        Each partition is fetched from its last known end, or for a partition seen for the first
        time from ``end_offsets() - 1``: only a *hint* that keeps the fetch small (Tansu answers
        the last batch's base offset + 1, Kafka the true end); the answer is the high watermark
        the fetch response carries. A partition that answered is seeked to that high watermark,
        so the records its fetch returned are dropped unparsed and the next poll moves on to the
        other partitions.

        ``consumer`` must be fresh (see the module docstring), and this must never ``pause()`` a
        partition: kafka-python 3.0 parks the buffered fetch of a paused partition and, once another
        partition's drained fetch sits in line, never releases it, so the parked partition is never
        fetched again and the probe waits out its deadline.
        """
        if not tps:
            return {}
        consumer.assign(tps)
        new = [tp for tp in tps if (tp.topic, tp.partition) not in self._known]
        hints: dict[Any, int] = {}
        if new:
            try:
                hints = {tp: o for tp, o in consumer.end_offsets(new, timeout_ms=self._ms()).items() if o}
            except Exception as exc:  # only a hint: fetch from the start instead
                log.debug("kafka end_offsets hint failed: %s", describe(exc))
        for tp in tps:
            known = self._known.get((tp.topic, tp.partition))
            consumer.seek(tp, known if known is not None else max(0, hints.get(tp, 0) - 1))
        # A partition whose leader does not answer keeps its last known end for this probe.
        deadline = time.monotonic() + min(self.read_timeout_s, _PROBE_WAIT_S)
        pending = list(tps)
        try:
            while pending and time.monotonic() < deadline:
                consumer.poll(timeout_ms=10, max_records=1)
                still = []
                for tp in pending:
                    hw = consumer.highwater(tp)
                    if hw is None:
                        still.append(tp)
                    else:
                        consumer.seek(tp, hw)  # the rest of its fetch is dropped unparsed
                pending = still
            return {(tp.topic, tp.partition): hw for tp in tps if (hw := consumer.highwater(tp)) is not None}
        finally:
            consumer.unsubscribe()  # no fetches between probes

    def _low_watermarks(
        self, partitions: Sequence[tuple[str, int]], consumer: Any = None
    ) -> dict[tuple[str, int], int]:
        """First offset still held by the broker per partition (``beginning_offsets``)."""
        from kafka import TopicPartition

        if not partitions:
            return {}
        client = consumer if consumer is not None else self._probe_consumer()
        try:
            tps = [TopicPartition(t, p) for t, p in partitions]
            lows = client.beginning_offsets(tps, timeout_ms=int(self.read_timeout_s * 1000))
        except Exception as exc:
            if consumer is None:
                self._drop_probe()
            if _is_transient(exc):
                raise SourceTimeout(f"kafka low watermarks: {describe(exc)} ({self._where()})") from exc
            raise
        return {(tp.topic, tp.partition): int(o) for tp, o in lows.items() if o is not None}

    def _start_positions(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, bool]]:
        """``partition -> (start offset, explicit)`` for partitions the lower never advanced."""
        start = self.start
        if start == "earliest":
            return {}
        if start == "latest":
            if self._latest_start is None:
                self.upper()  # the first probe fixes "latest"
            latest = self._latest_start or {}
            return {p: (latest.get(p, 0), False) for p in partitions}
        assert isinstance(start, dict)
        if "timestamp" in start:
            return {p: (o, False) for p, o in self._timestamp_offsets(partitions, start["timestamp"]).items()}
        return {p: (start[p], True) for p in partitions if p in start}

    def _timestamp_offsets(self, partitions: Sequence[tuple[str, int]], ts: int) -> dict[tuple[str, int], int]:
        from kafka import TopicPartition

        todo = [p for p in partitions if p not in self._timestamp_start]
        if todo:
            consumer = self._probe_consumer()
            try:
                found = consumer.offsets_for_times(
                    {TopicPartition(t, p): ts for t, p in todo}, timeout_ms=int(self.read_timeout_s * 1000)
                )
            except Exception as exc:
                self._drop_probe()
                if _is_transient(exc):
                    raise SourceTimeout(f"kafka offsets_for_times: {describe(exc)} ({self._where()})") from exc
                raise
            for tp, hit in found.items():
                key = (tp.topic, tp.partition)
                # No record at or after ts: start at the end known now.
                self._timestamp_start[key] = hit.offset if hit is not None else self._known.get(key, 0)
        return {p: self._timestamp_start[p] for p in partitions if p in self._timestamp_start}

    # -- shaping --------------------------------------------------------------------------------

    def _shape(self, buf: _Buffer, encoded: str, topic: str, kpart: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Decode the buffered records into the route's output batch plus an errors batch."""
        route = buf.route
        offsets = np.asarray(buf.offsets, dtype=np.int64)
        values = buf.values
        fail = self.on_record_error == "fail"
        decoded = route.decoder.decode(values, fail_fast=fail)
        meta_columns: list[pa.Array] = []
        key_faults: list[tuple[int, str, str]] = []
        names = [column for _, column in route.metadata]
        if route.metadata:
            meta_columns, key_faults = self._metadata_columns(buf, route, topic, kpart, offsets)
        if fail and (decoded.errors or key_faults):  # name the first bad record, value or key
            self._fail(route, topic, kpart, offsets, min(decoded.errors[:1] + key_faults[:1]), buf)
        faults = list(decoded.errors)
        good = decoded.good
        payload = decoded.batch
        if key_faults:
            decoded_ok = set(good.tolist())
            key_faults = [f for f in key_faults if f[0] in decoded_ok]  # one fault per record
        if key_faults:
            faults = sorted(faults + key_faults)
            keep = ~np.isin(good, [i for i, _, _ in key_faults])
            payload = payload.filter(pa.array(keep))
            good = good[keep]
        if len(good):
            take = pa.array(good)
            columns = [
                pa.repeat(pa.scalar(encoded, pa.string()), len(good)),
                pa.array(offsets[good], pa.int64()),
                *payload.columns,
                *(column.take(take) for column in meta_columns),
            ]
            # The decoded payload (a debezium route's is the before/after/op wrapper), then metadata.
            schema = pa.schema([*LINEAGE_FIELDS, *payload.schema, *(route.output.schema.field(n) for n in names)])
            yield route.name, pa.RecordBatch.from_arrays(columns, schema=schema)
        if faults:
            yield (
                ERRORS,
                error_batch(
                    encoded,
                    [int(offsets[i]) for i, _, _ in faults],
                    [kind for _, kind, _ in faults],
                    [message for _, _, message in faults],
                    [values[i] for i, _, _ in faults],
                ),
            )
        buf.clear()

    def _fail(
        self, route: KafkaRoute, topic: str, kpart: int, offsets: np.ndarray, fault: tuple[int, str, str], buf: _Buffer
    ) -> None:
        i, kind, message = fault
        buf.clear()
        raise RecordError(
            f"output {route.name!r}: record {topic}[{kpart}]@{int(offsets[i])} could not be decoded "
            f"({kind}): {message} (on_record_error='fail')"
        )

    def _metadata_columns(
        self, buf: _Buffer, route: KafkaRoute, topic: str, kpart: int, offsets: np.ndarray
    ) -> tuple[list[pa.Array], list[tuple[int, str, str]]]:
        n = len(offsets)
        columns: list[pa.Array] = []
        faults: list[tuple[int, str, str]] = []
        for meta, _ in route.metadata:
            if meta == "key":
                keys = pa.array(buf.keys, pa.binary())
                if route.key_format == "text":
                    try:
                        keys = keys.cast(pa.string())
                    except (pa.ArrowInvalid, UnicodeDecodeError):
                        for i, k in enumerate(buf.keys):
                            try:
                                if k is not None:
                                    k.decode("utf-8")
                            except UnicodeDecodeError as exc:
                                faults.append((i, "decode", f"invalid UTF-8 key: {exc}"))
                        bad = {i for i, _, _ in faults}
                        keys = pa.array([None if i in bad else k for i, k in enumerate(buf.keys)], pa.binary()).cast(
                            pa.string()
                        )
                columns.append(keys)
            elif meta == "headers":
                columns.append(pa.array(buf.headers, METADATA_COLUMNS["headers"]))
            elif meta == "topic":
                columns.append(pa.repeat(pa.scalar(topic, pa.string()), n))
            elif meta == "partition":
                columns.append(pa.repeat(pa.scalar(kpart, pa.int32()), n))
            elif meta == "offset":
                columns.append(pa.array(offsets, pa.int64()))
            elif meta == "timestamp":
                ts = np.asarray(buf.timestamps, dtype=np.int64)
                columns.append(pa.array(ts, pa.int64(), mask=ts < 0).cast(METADATA_COLUMNS["timestamp"]))
        return columns, faults

    def _lost_batch(self, encoded: str, partition: tuple[str, int], start: int, stop: int) -> pa.RecordBatch:
        message = (
            f"offsets [{start}, {stop}) of kafka partition {partition[0]}[{partition[1]}] were deleted "
            f"(below the low watermark {stop}) before they were read; skipped"
        )
        log.warning("%s", message)
        return error_batch(encoded, [start], [OFFSET_LOST], [message], [None])

    # -- misc -----------------------------------------------------------------------------------

    def _ms(self) -> int:
        return int(self.read_timeout_s * 1000)

    def _where(self) -> str:
        return f"bootstrap_servers={self.bootstrap_servers!r}"

    def _start_repr(self) -> str:
        if isinstance(self.start, str):
            return repr(self.start)
        if "timestamp" in self.start:
            return repr({"timestamp": self.start["timestamp"]})
        return f"<{len(self.start)} partition offsets>"


class _Buffer:
    """Columns of the records read since the last flush (one partition, one route)."""

    __slots__ = ("headers", "keys", "offsets", "route", "timestamps", "values", "wanted")

    def __init__(self, route: KafkaRoute) -> None:
        self.route = route
        self.wanted = frozenset(meta for meta, _ in route.metadata)
        self.offsets: list[int] = []
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.headers: list[Any] = []
        self.timestamps: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, records: Sequence[Any]) -> None:
        self.offsets.extend(map(_OFFSET, records))
        self.values.extend(map(_VALUE, records))
        wanted = self.wanted
        if "key" in wanted:
            self.keys.extend(map(_KEY, records))
        if "headers" in wanted:
            self.headers.extend([h if h else [] for h in map(_HEADERS, records)])
        if "timestamp" in wanted:
            self.timestamps.extend(map(_TIMESTAMP, records))

    def clear(self) -> None:
        self.offsets = []
        self.values = []
        self.keys = []
        self.headers = []
        self.timestamps = []


_OFFSET = itemgetter(3)
_TIMESTAMP = itemgetter(4)
_KEY = itemgetter(6)
_VALUE = itemgetter(7)
_HEADERS = itemgetter(8)


# -- configuration ------------------------------------------------------------------------------


def _check_bootstrap(value: Any) -> str | list[str]:
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError("bootstrap_servers", "must not be empty")
        return value
    if isinstance(value, Sequence) and value and all(isinstance(v, str) and v.strip() for v in value):
        return list(value)
    raise ConfigError("bootstrap_servers", "must be 'host:port' or a non-empty list of them")


def _check_selection(topics: Any, pattern: Any) -> tuple[tuple[str, ...], str | None]:
    if (topics is None) == (pattern is None):
        raise ConfigError("topics", "give exactly one of topics (a list) or pattern (a regex)")
    if topics is not None:
        if isinstance(topics, str) or not isinstance(topics, Sequence) or not topics:
            raise ConfigError("topics", "must be a non-empty list of topic names")
        for t in topics:
            if not isinstance(t, str) or not t:
                raise ConfigError("topics", f"topic names must be non-empty strings, got {t!r}")
        if len(set(topics)) != len(topics):
            raise ConfigError("topics", "lists a topic twice")
        return tuple(topics), None
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("pattern", "must be a non-empty regex string")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError("pattern", f"invalid regex: {exc}") from exc
    return (), pattern


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(name, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def _check_client_settings(settings: Any) -> dict[str, Any]:
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ConfigError("client_settings", "must be a mapping of kafka-python settings")
    from kafka import KafkaConsumer

    known = set(KafkaConsumer.DEFAULT_CONFIG)
    for key in settings:
        if not isinstance(key, str):
            raise ConfigError("client_settings", "keys must be strings")
        if key in _RESERVED_SETTINGS:
            raise ConfigError(f"client_settings.{key}", "is set by reclock (exact, replayable reads need it)")
        if key not in known:
            raise ConfigError(f"client_settings.{key}", "is not a kafka-python consumer setting")
    return dict(settings)


def _check_start(start: Any) -> str | dict[Any, int]:
    if isinstance(start, str):
        if start not in _START_WORDS:
            raise ConfigError("start", f"must be 'earliest', 'latest' or a mapping, got {start!r}")
        return start
    if not isinstance(start, Mapping):
        raise ConfigError("start", "must be 'earliest', 'latest', {partition: offset} or {'timestamp': ms}")
    if "timestamp" in start:
        ts = start["timestamp"]
        if len(start) != 1 or not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
            raise ConfigError("start.timestamp", "must be the only key, an int of epoch milliseconds >= 0")
        return {"timestamp": ts}
    offsets: dict[Any, int] = {}
    for key, offset in start.items():
        partition = decode_partition(key) if isinstance(key, str) else key
        if not (
            isinstance(partition, tuple)
            and len(partition) == 2
            and isinstance(partition[0], str)
            and isinstance(partition[1], int)
            and not isinstance(partition[1], bool)
        ):
            raise ConfigError("start", f"partition keys are (topic, partition) tuples or '[\"topic\",0]', got {key!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(f"start.{encode_partition(partition)}", f"offset must be an int >= 0, got {offset!r}")
        offsets[partition] = offset
    return offsets


_OUTPUT_KEYS = frozenset(
    {
        "topics",
        "pattern",
        "format",
        "schema",
        "delimiter",
        "quote_char",
        "avro_schema",
        "confluent",
        "metadata",
        "key_format",
        "key",
        "envelope",
    }
)


def _build_routes(
    topics: tuple[str, ...],
    pattern: str | None,
    outputs: Mapping[str, Mapping[str, Any]] | None,
    defaults: dict[str, Any],
) -> tuple[KafkaRoute, ...]:
    if outputs is None:
        if topics:
            names = [output_name_for(t) for t in topics]
            if len(set(names)) != len(names):
                raise ConfigError("outputs", f"topics {list(topics)} map to clashing output names {names}; name them")
            specs: dict[str, dict[str, Any]] = {n: {"topics": [t]} for n, t in zip(names, topics, strict=True)}
        else:
            specs = {output_name_for(pattern or ""): {}}
    else:
        if not isinstance(outputs, Mapping) or not outputs:
            raise ConfigError("outputs", "must be a non-empty mapping of output name to options")
        specs = {}
        for name, spec in outputs.items():
            if not isinstance(spec, Mapping):
                raise ConfigError(f"outputs.{name}", "options must be a mapping")
            specs[name] = dict(spec)
    routes = []
    catch_all = [n for n, s in specs.items() if "topics" not in s and "pattern" not in s]
    if len(catch_all) > 1:
        raise ConfigError("outputs", f"outputs {catch_all} name neither topics nor pattern; only one may")
    for name, spec in specs.items():
        routes.append(_build_route(name, spec, defaults))
    routes.sort(key=lambda r: r.name in catch_all)  # a catch-all output is tried last
    if topics:
        for t in topics:
            if not any(r.matches(t) or r.name in catch_all for r in routes):
                raise ConfigError("outputs", f"topic {t!r} is routed to no output")
    return tuple(routes)


def _build_route(name: str, spec: dict[str, Any], defaults: dict[str, Any]) -> KafkaRoute:
    where = f"outputs.{name}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(where, "an output name is an identifier starting with a letter")
    unknown = set(spec) - _OUTPUT_KEYS
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}", f"unknown option; expected one of {sorted(_OUTPUT_KEYS)}")
    opts = {**defaults, **{k: v for k, v in spec.items() if k in defaults}}
    route_topics = spec.get("topics", ())
    if isinstance(route_topics, str) or not all(isinstance(t, str) and t for t in route_topics):
        raise ConfigError(f"{where}.topics", "must be a list of topic names")
    route_pattern = spec.get("pattern")
    compiled = None
    if route_pattern is not None:
        try:
            compiled = re.compile(route_pattern)
        except (re.error, TypeError) as exc:
            raise ConfigError(f"{where}.pattern", f"invalid regex: {exc}") from exc
    catch_all = "topics" not in spec and "pattern" not in spec
    if catch_all:
        compiled = re.compile(".*", re.DOTALL)
    envelope = spec.get("envelope", "append")
    if envelope not in ("append", "upsert", "debezium"):
        raise ConfigError(f"{where}.envelope", f"must be append, upsert or debezium, got {envelope!r}")
    row_schema = as_schema(opts["schema"], field=f"{where}.format.schema")
    if envelope == "debezium" and (opts["format"] != "json" or row_schema is None):
        raise ConfigError(f"{where}.envelope", 'debezium needs format = "json" and the row\'s schema')
    decoder = make_decoder(
        opts["format"],
        debezium_schema(row_schema) if envelope == "debezium" else opts["schema"],
        delimiter=opts["delimiter"],
        quote_char=opts["quote_char"],
        avro_schema=opts["avro_schema"],
        confluent=opts["confluent"],
        field=f"{where}.format",
    )
    key_format = opts["key_format"]
    if key_format not in ("bytes", "text"):
        raise ConfigError(f"{where}.key_format", f"must be 'bytes' or 'text', got {key_format!r}")
    metadata = _check_metadata(opts["metadata"], f"{where}.metadata")
    fields = list(row_schema if envelope == "debezium" else decoder.schema)
    for meta, column in metadata:
        ftype = pa.string() if meta == "key" and key_format == "text" else METADATA_COLUMNS[meta]
        fields.append(pa.field(column, ftype))
    names = [f.name for f in fields]
    clash = sorted({n for n in names if names.count(n) > 1} | {n for n in names if n.startswith("_")})
    if clash:
        raise ConfigError(f"{where}.metadata", f"column {clash[0]!r} clashes with another column or a lineage name")
    key = spec.get("key", ())
    if isinstance(key, str):
        key = (key,)
    key = tuple(key)
    missing = [k for k in key if k not in names]
    if missing:
        raise ConfigError(f"{where}.key", f"key column {missing[0]!r} is not a column of the output")
    output = Output(name, pa.schema(fields), key, envelope)
    return KafkaRoute(name, frozenset(route_topics), compiled, decoder, metadata, key_format, output)


def _check_metadata(metadata: Any, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(metadata, str):
        metadata = [metadata]
    if isinstance(metadata, Mapping):
        pairs = list(metadata.items())
    elif isinstance(metadata, Sequence):
        pairs = [(m, m) for m in metadata]
    else:
        raise ConfigError(where, "must be a list of metadata names or a mapping name -> column")
    for meta, column in pairs:
        if meta not in METADATA_COLUMNS:
            raise ConfigError(where, f"unknown metadata {meta!r}; expected one of {', '.join(METADATA_COLUMNS)}")
        if not isinstance(column, str) or not column:
            raise ConfigError(where, f"column name for {meta!r} must be a non-empty string")
    return tuple(pairs)


# -- helpers ------------------------------------------------------------------------------------


def _is_transient(exc: BaseException) -> bool:
    """kafka-python's retriable errors: timeouts, lost connections, leaders moving."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, RetriableError

    return isinstance(exc, (KafkaTimeoutError, KafkaConnectionError, RetriableError))


def _bounded(call: Any, timeout_s: float, what: str) -> Any:
    """``call()`` in a helper thread, waiting at most ``timeout_s``; :class:`SourceTimeout` after.

    On a timeout the thread is left to finish on its own (the caller drops the client, which
    ends the call).
    """
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # handed to the waiting thread
            result["error"] = exc

    worker = threading.Thread(target=run, name="reclock-kafka-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise SourceTimeout(f"{what} did not answer within {timeout_s}s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _close(client: Any) -> None:
    try:
        client.close(autocommit=False, timeout_ms=1000)
    except TypeError:
        client.close()
    except Exception as exc:  # closing is best effort
        log.debug("closing a kafka client failed: %s", describe(exc))
