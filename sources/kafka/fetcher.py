"""Fetching: the raw record bytes of many partitions per request, from a client reused across
splits and batches.

Reading through ``KafkaConsumer.poll`` cost a client, an assign, a seek and a fetch per split
(about 30 ms a partition, so 1,000 partitions took 31.7 s) and a Python object per record. Here
a task's :class:`Fetcher` holds every split of the task at once:

* the task's partitions are cut into shares of ``share_partitions`` (50), in reading order; one
  ``FetchRequest`` per leader asks for every partition of a share that the task still needs (up
  to ``max_partition_bytes`` each, the answer capped at ``response_bytes``, 1 MiB), and up to
  ``fetches_in_flight`` (4) are in flight to a leader at once, pipelined on one connection: the
  share being read and the next ones, a window that slides as the reader moves on, so the
  broker serves the next share while the last answer travels and is parsed. Several small
  answers cost Tansu far less than one big one (0.24 s against 0.81 s for 500 partitions x 100
  records, ``docs/design/20261127_wide_topics_in_flight.md``). A partition is in one share only,
  so it is never asked twice at once and its records arrive in offset order;
* the response's record bytes go to :func:`~reclock.sources.kafka.batches.parse` as they are: no
  per-record object, CRC-32C checked per batch;
* with ``read_committed`` (the source's default) every request asks for it: the broker answers
  up to the last stable offset, and the response's aborted transactions go to the parser with
  the bytes, which drops those transactions' batches
  (:mod:`~reclock.sources.kafka.transactions`); markers and dropped batches still move the
  position past their offsets;
* partitions fetched ahead of the split being read wait in a buffer capped at
  ``buffer_bytes``; a partition whose buffer is full is not asked for until it drains;
* the client comes from a per-process pool (:func:`lease`): a Spark Python worker serves many
  tasks and keeps its connections, as Spark's own Kafka source caches its consumers.

The client is a ``KafkaConsumer`` built by :class:`~reclock.sources.kafka.clients.KafkaClients` (so
SASL, SSL and every user setting apply), never assigned: its fetcher stays idle, and the requests
are sent on its connection manager. That manager is kafka-python's (``_client``); the version
range in ``pyproject.toml`` pins the API, and ``tests/unit/test_kafka_fetcher.py`` fails loudly
if a release moves it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from reclock.sources.kafka.batches import Fetched, next_offset, parse_many
from reclock.sources.kafka.clients import KafkaClients, SourceTimeout, close_client, is_transient
from reclock.sources.kafka.requests import Partition, fetch_request

__all__ = ["Fetcher", "OffsetLost", "lease"]

log = logging.getLogger(__name__)

_OFFSET_OUT_OF_RANGE = 1
#: Errors that mean "ask again after a metadata refresh": leadership moved, or metadata is stale.
_RETRY_AFTER_METADATA = frozenset({3, 5, 6, 74, 75, 100})  # unknown partition, no leader, not leader, epochs, id


#: The smallest fetch asked for a partition.
_LEAST_BYTES = 64 << 10


class OffsetLost(Exception):
    """The broker no longer holds the offset asked for (retention deleted it)."""

    def __init__(self, partition: Partition, offset: int) -> None:
        super().__init__(f"offset {offset} of {partition[0]}[{partition[1]}] is out of range")
        self.partition = partition
        self.offset = offset


_POOL: dict[Any, list[Any]] = defaultdict(list)
_POOL_LOCK = threading.Lock()


@contextlib.contextmanager
def lease(clients: KafkaClients, deadline: float) -> Iterator[Any]:
    """A read client from this process's pool (made if none is idle), returned after use; a
    client that failed is closed instead, so a broken connection is never handed out again."""
    key = clients.pool_key()
    with _POOL_LOCK:
        client = _POOL[key].pop() if _POOL[key] else None
    if client is None:
        client = clients.for_fetch(deadline)
    try:
        yield client
    except BaseException:
        close_client(client)
        raise
    with _POOL_LOCK:
        _POOL[key].append(client)


@dataclass
class _Want:
    position: int
    end: int
    chunks: deque[Fetched] = field(default_factory=deque)
    buffered: int = 0
    high_watermark: int = -1
    bytes_per_offset: float = 512.0  # learnt from each fetch

    def ask_bytes(self, most: int) -> int:
        """Enough bytes for the rest of the range, and no more: a short read must not fetch a whole
        8 MiB response (a broker still sends one whole batch if it is larger; some brokers, Tansu
        among them, send more, which :func:`~reclock.sources.kafka.batches.parse` then leaves unparsed)."""
        return int(min(most, max(_LEAST_BYTES, (self.end - self.position) * self.bytes_per_offset * 1.1)))


#: Fetch requests in flight per leader for one task, each for its own share of the partitions
#: (never more than the client's ``max_in_flight_requests_per_connection`` - 1: kafka-python
#: fails a request beyond that limit instead of queueing it).
FETCHES_IN_FLIGHT = 4
#: Partitions in one share: one fetch request asks for at most this many.
SHARE_PARTITIONS = 50
#: What one fetch response may carry (``max_bytes``; a partition's first batch comes whole even
#: if larger, KIP-74). Tansu's cost grows faster than the bytes it sends: 500 partitions x 500
#: records took 0.98 s in 64 MiB answers and 0.39 s in 1 MiB ones, one at a time.
RESPONSE_BYTES = 1 << 20

#: ``(leader, share)``: where a fetch request goes and which share of the partitions it asks for.
Lane = tuple[int, int]
#: ``partition -> (offset, bytes)``: what one fetch request asks for.
Asks = dict[Partition, tuple[int, int]]


class Fetcher:
    """Fetches every partition of a task's splits; :meth:`chunks` hands out one partition's
    records in offset order, from ``start`` to ``end``, fetching as needed.

    The partitions are cut into shares of ``share_partitions``, in the order of ``ranges`` (the
    order they are read in). A share is asked for in one request per leader, and up to
    ``fetches_in_flight`` requests are in flight to a leader at once: the share being read and
    the next ones, a window that slides as the reader moves on."""

    def __init__(
        self,
        client: Any,
        clients: KafkaClients,
        ranges: Sequence[tuple[Partition, int, int]],
        *,
        keys: bool,
        headers: bool,
        max_partition_bytes: int = 8 << 20,
        buffer_bytes: int = 128 << 20,
        response_bytes: int = RESPONSE_BYTES,
        fetches_in_flight: int = FETCHES_IN_FLIGHT,
        share_partitions: int = SHARE_PARTITIONS,
    ) -> None:
        assert fetches_in_flight >= 1 and share_partitions >= 1, (fetches_in_flight, share_partitions)
        self._client = client
        self._clients = clients
        self._keys = keys
        self._headers = headers
        self._max_partition_bytes = max_partition_bytes
        self._buffer_bytes = buffer_bytes
        # One more may go out for the partition being read: stay below kafka-python's limit.
        limit = client.config.get("max_in_flight_requests_per_connection", 5) - 1
        self._in_flight_most = max(1, min(fetches_in_flight, limit))
        self._response_bytes = response_bytes
        self._wants: dict[Partition, _Want] = {}
        self._buffered = 0  # bytes of parsed records waiting in every partition's buffer
        #: The shares, in reading order, and the share of each partition.
        self._shares: list[list[Partition]] = []
        self._share_of: dict[Partition, int] = {}
        #: Shares before this one have nothing left to fetch.
        self._first_share = 0
        #: ``(leader, share) -> (response future, what it asked)``: at most one request per lane.
        self._inflight: dict[Lane, tuple[Any, Asks]] = {}
        #: Records parsed so far (fetched records past a range's end are never parsed).
        self.records_parsed = 0
        for partition, start, end in ranges:
            if end <= start:
                continue
            if partition not in self._share_of:
                if not self._shares or len(self._shares[-1]) >= share_partitions:
                    self._shares.append([])
                self._share_of[partition] = len(self._shares) - 1
                self._shares[-1].append(partition)
            self._wants[partition] = _Want(start, end)
        topics = {topic for topic, _ in self._wants}
        for topic in sorted(topics):
            client.partitions_for_topic(topic)  # metadata, once per topic and client

    def chunks(self, partition: Partition, start: int, deadline_s: float) -> Iterator[Fetched]:
        """Records of ``partition`` from ``start`` until the range registered for it is fetched.

        Raises :class:`OffsetLost` if the broker no longer holds the position,
        :class:`SourceTimeout` if no progress is made for ``deadline_s`` seconds."""
        want = self._wants.get(partition)
        if want is None:
            return
        if want.position < start:
            want.position = start
        deadline = time.monotonic() + deadline_s
        while want.chunks or want.position < want.end:
            if want.chunks:
                chunk = want.chunks.popleft()
                want.buffered -= chunk.values.data.nbytes
                self._buffered -= chunk.values.data.nbytes
                deadline = time.monotonic() + deadline_s
                yield chunk
                continue
            if time.monotonic() > deadline:
                raise SourceTimeout(
                    f"kafka read of {partition[0]}[{partition[1]}] made no progress for {deadline_s}s at "
                    f"offset {want.position} (high watermark {want.high_watermark}; {self._clients.where()})"
                )
            self._fetch(partition, deadline)
        del self._wants[partition]

    def skip_to(self, partition: Partition, offset: int) -> None:
        """Continue ``partition`` at ``offset`` (after an :class:`OffsetLost`); drops its buffer."""
        want = self._wants[partition]
        want.position = offset
        want.chunks.clear()
        self._buffered -= want.buffered
        want.buffered = 0
        self._inflight.clear()  # they asked from the old position: answers are dropped

    # -- requests -------------------------------------------------------------------------------

    def _fetch(self, needed: Partition, deadline: float) -> None:
        """Get records for ``needed``: the answer to the request in flight on its lane if there
        is one (sent ahead, see :meth:`_send_ahead`), else a new request for its share (and the
        window's other shares); then wait for the answer on ``needed``'s lane only: the other
        lanes' answers are taken when their partitions are read."""
        from kafka import TopicPartition

        share = self._share_of[needed]
        leader = self._client._client.cluster.leader_for_partition(TopicPartition(*needed))
        lane = (leader, share)
        if leader is None or leader < 0 or lane not in self._inflight:
            by_leader = self._asks(share, needed)
            if by_leader is None:
                self._refresh(deadline)
                return
            for node, asks in by_leader.items():
                self._inflight[(node, share)] = (self._send(node, asks), asks)
            self._send_ahead()
        if lane in self._inflight:
            self._answer(lane, *self._inflight.pop(lane), deadline)

    def _asks(self, share: int, needed: Partition | None) -> dict[int, Asks] | None:
        """``leader -> {partition: (offset, bytes)}`` of ``share``: ``needed`` and its partitions
        with room in their buffer, on the lanes with no request in flight; ``None`` if a leader
        is unknown (metadata must be refreshed first)."""
        from kafka import TopicPartition

        cluster = self._client._client.cluster
        full = self._buffered >= self._buffer_bytes
        by_leader: dict[int, Asks] = defaultdict(dict)
        for partition in self._shares[share]:
            want = self._wants.get(partition)
            if want is None or want.position >= want.end:
                continue
            if partition != needed and (full or want.buffered >= self._max_partition_bytes):
                continue
            leader = cluster.leader_for_partition(TopicPartition(*partition))
            if leader is None or leader < 0:
                return None
            if (leader, share) not in self._inflight:
                by_leader[leader][partition] = (want.position, want.ask_bytes(self._max_partition_bytes))
        return by_leader

    def _send_ahead(self) -> None:
        """Fill the window: requests for the first shares (in reading order) that have something
        left to fetch, until ``fetches_in_flight`` are in flight to each leader."""
        shares = self._shares
        while self._first_share < len(shares) and all(
            (w := self._wants.get(p)) is None or w.position >= w.end for p in shares[self._first_share]
        ):
            self._first_share += 1
        busy: dict[int, int] = defaultdict(int)
        for node, _ in self._inflight:
            busy[node] += 1
        window = self._in_flight_most * max(1, len(self._client._client.cluster.brokers()))
        for share in range(self._first_share, len(shares)):
            if len(self._inflight) >= window:
                return
            for node, asks in (self._asks(share, None) or {}).items():
                if asks and busy[node] < self._in_flight_most:
                    self._inflight[(node, share)] = (self._send(node, asks), asks)
                    busy[node] += 1

    def _send(self, leader: int, asks: Asks) -> Any:
        """Send one fetch request without waiting; the future resolves to its response."""
        request = fetch_request(asks, read_committed=self._clients.read_committed, max_bytes=self._response_bytes)
        manager = self._client._client._manager
        return manager.call_soon(lambda: manager.send(request, node_id=leader))

    def _answer(self, lane: Lane, future: Any, asks: Asks, deadline: float) -> None:
        """Wait for the fetch response of ``lane`` and take it in. As soon as the batch headers
        say where each partition continues, the window's next requests go out, so the broker
        works while this one is parsed. Data for a partition whose position moved since the
        request was sent (an offset skipped after a loss) is dropped."""
        from kafka.errors import for_code

        manager = self._client._client._manager
        try:
            response = manager.run(lambda: future)
        except Exception as exc:
            if not is_transient(exc):
                raise
            # A lost connection or a timeout: the caller asks again until its deadline, then
            # reports how far the read got.
            log.debug("kafka fetch from node %s failed: %s", lane[0], exc)
            self._refresh(deadline)
            return
        refresh = False
        committed = self._clients.read_committed
        arrived: list[tuple[_Want, Any, int]] = []
        aborted: list[list[tuple[int, int]] | None] = []
        for topic_data in response.responses:
            for data in topic_data.partitions:
                partition = (topic_data.topic, data.partition_index)
                want = self._wants.get(partition)
                if want is None or partition not in asks or asks[partition][0] != want.position:
                    continue
                want.high_watermark = data.high_watermark
                if data.error_code == _OFFSET_OUT_OF_RANGE:
                    raise OffsetLost(partition, want.position)
                if data.error_code in _RETRY_AFTER_METADATA:
                    refresh = True
                    continue
                if data.error_code:
                    raise for_code(data.error_code)(f"fetch of {partition[0]}[{partition[1]}]")
                if not data.records:
                    continue
                after = next_offset(data.records, until=want.end)
                if after is not None and after > want.position:
                    arrived.append((want, data.records, want.position))
                    aborted.append(
                        [(a.producer_id, a.first_offset) for a in data.aborted_transactions or ()]
                        if committed
                        else None
                    )
                    want.position = after
        if refresh:
            self._refresh(deadline)
        else:
            self._send_ahead()
        parsed = parse_many(
            [(records, want.end) for want, records, _ in arrived],
            keys=self._keys,
            headers=self._headers,
            aborted=aborted,
        )
        for (want, records, was), fetched in zip(arrived, parsed, strict=True):
            self.records_parsed += len(fetched)
            want.bytes_per_offset = len(records) / max(1, (fetched.next_offset or was) - was)
            if len(fetched):
                want.chunks.append(fetched)
                want.buffered += fetched.values.data.nbytes
                self._buffered += fetched.values.data.nbytes

    def _refresh(self, deadline: float) -> None:
        """A metadata update (leaders moved), waited for until ``deadline``. Requests still in
        flight are forgotten (their partitions are asked again, on their new leaders). The wait is
        bounded here: kafka-python's refresh of a silent broker waits out its own 10 s for the new
        connection's ``ApiVersions`` answer, which made a read with a 1.5 s ``read_timeout_s``
        report its timeout after 11.5 s."""
        self._inflight.clear()
        manager = self._client._client._manager
        try:
            refreshed = manager.call_soon(manager.cluster.refresh_metadata)
            wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
            manager.run(lambda: manager.wait_for(refreshed, wait_ms))
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.debug("kafka metadata refresh failed: %s", exc)
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
