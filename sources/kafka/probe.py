"""Probe of the Kafka source (driver): which partitions exist, where each one ends, and where a
partition that was never read starts.

The true end of a partition is what a *Fetch response* carries: the high watermark, or with
``isolation_level = "read_committed"`` (the default) the **last stable offset** of the same
response, the first offset of the earliest open transaction, so the upper never passes a
transaction that has not ended and every transaction below it is decided. Never ``end_offsets()``:
``ListOffsets(LATEST)`` is wrong on the Tansu test broker (it answers the last batch's base offset
+ 1), and ``ListOffsets`` with ``isolation_level = 1`` answers 0 there while any transaction is
open (measured, see ``docs/design/20261125_kafka_read_committed.md``); the Fetch response's last
stable offset is right on both.

A probe is two round trips on a pooled read client (:func:`~reclock.sources.kafka.fetcher.lease`):
one ``MetadataRequest`` naming the listed topics (every topic for a ``pattern``), then one
fetch per leader, capped at one byte, at each partition's last known end (0 for a partition
seen for the first time). Only partitions that fetch leaves unanswered cost more: a fresh
consumer (see :mod:`reclock.sources.kafka.clients`) and their low watermarks or a poll
(``docs/design/20261127_wide_topics_in_flight.md``).

An open transaction holds the upper back. A partition whose last stable offset has stayed at
one offset below its high watermark for ``open_transaction_warning_s`` is named by
:meth:`Prober.warnings`, with the producer id and epoch of the batch at that offset (the open
transaction's first batch): a read_uncommitted fetch of one batch. The ``transactional.id``
behind it is not in the partition (only the transaction coordinator knows it).

Invariants of :meth:`Prober.upper`:

* the frontier it reports is the join of everything learned, so it never regresses;
* topics matching ``pattern`` and partitions added while running join as soon as metadata shows
  them, with their whole high watermark: data a partition already holds binds at one time;
* a high watermark that goes back (topic deleted and re-created, unclean leader election), once
  confirmed by a second fresh consumer, is a :class:`~reclock.errors.DefiniteSourceError`, and so
  is a listed topic that disappears.

Start positions (``earliest``, ``latest``, explicit offsets, a timestamp) apply only to a
partition the lower frontier has never advanced. ``latest`` is the first probe's answer and a
timestamp is looked up once per partition, both per source instance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from reclock.errors import DefiniteSourceError, describe
from reclock.sources.kafka.clients import KafkaClients, SourceTimeout, bounded, close_client, is_transient
from reclock.sources.kafka.config import Routing
from reclock.sources.kafka.fetcher import lease
from reclock.sources.kafka.requests import ends, fetch_request, metadata
from reclock.sources.kafka.transactions import first_batch
from reclock.timeline.frontier import Frontier

__all__ = ["Prober", "low_watermarks"]

log = logging.getLogger(__name__)

#: Longest a probe waits for the partitions' fetch answers (those that answered are reported).
_PROBE_WAIT_S = 5.0


def low_watermarks(
    client: Any, partitions: Sequence[tuple[str, int]], clients: KafkaClients
) -> dict[tuple[str, int], int]:
    """First offset still held by the broker per partition (``beginning_offsets``), asked with
    ``client``. Raises :class:`SourceTimeout` when the broker does not answer."""
    from kafka import TopicPartition

    if not partitions:
        return {}
    try:
        tps = [TopicPartition(t, p) for t, p in partitions]
        lows = client.beginning_offsets(tps, timeout_ms=int(clients.read_timeout_s * 1000))
    except Exception as exc:
        if is_transient(exc):
            raise SourceTimeout(f"kafka low watermarks: {describe(exc)} ({clients.where()})") from exc
        raise
    return {(tp.topic, tp.partition): int(o) for tp, o in lows.items() if o is not None}


class Prober:
    """What the driver has learned about the source's partitions, and the probe that learns it.

    ``start`` is the source's checked ``start`` option. Lives on the driver; pickled with the
    source, it carries what it learned but no client.
    """

    def __init__(
        self,
        clients: KafkaClients,
        routing: Routing,
        start: str | dict[Any, int],
        *,
        open_transaction_warning_s: float = 60.0,
    ) -> None:
        self._clients = clients
        self._routing = routing
        self._start = start
        self._warn_after_s = open_transaction_warning_s
        #: ``partition -> (last stable offset, since when (monotonic), high watermark)`` while the
        #: LSO stays below the HW at one offset.
        self._held: dict[tuple[str, int], tuple[int, float, int]] = {}
        #: ``partition -> (held offset, producer (id, epoch) of its batch)``, asked once per offset.
        self._holders: dict[tuple[str, int], tuple[int, tuple[int, int] | None]] = {}
        self._warnings: list[str] = []
        self._known: dict[tuple[str, int], int] = {}
        self._seen_topics: set[str] = set()
        self._latest_start: dict[tuple[str, int], int] | None = None
        self._timestamp_start: dict[tuple[str, int], int] = {}
        self._unrouted_warned: set[str] = set()

    def upper(self) -> Frontier:
        """The end (high watermark, or last stable offset when reading committed) of every
        partition of every routed topic, joined with all earlier probes. Raises
        :class:`SourceTimeout` if the broker does not answer, :class:`DefiniteSourceError` if a
        partition's end went back or a listed topic was deleted."""
        from kafka import TopicPartition

        clients = self._clients
        fresh = _Fresh(clients)  # a fresh consumer, only for what the fetch cannot answer
        try:
            # Step 1: discover. A topic (or partition) that appears joins the frontier now.
            partitions = self._discover()
            tps = [TopicPartition(t, p) for t, p in partitions]
            # Step 2: probe the fetch-response end of each partition.
            answers = self._probe(fresh, tps)
            learned = {key: end for key, (end, _) in answers.items()}
            regressed = [tp for tp, hw in learned.items() if hw < self._known.get(tp, 0)]
            if regressed:  # confirm with a second probe (a fresh consumer) before calling it definite
                again = _Fresh(clients)
                try:
                    again_answers = self._probe(again, [TopicPartition(t, p) for t, p in regressed])
                    learned.update({key: end for key, (end, _) in again_answers.items()})
                finally:
                    again.close()
                regressed = [tp for tp in regressed if learned[tp] < self._known.get(tp, 0)]
            if regressed:
                t, p = regressed[0]
                raise DefiniteSourceError(
                    f"kafka partition {t}[{p}]: {self._end_name()} went back from {self._known[(t, p)]} to "
                    f"{learned[(t, p)]} (topic deleted and re-created, or records lost on the broker)"
                )
            if tps and not learned:
                raise SourceTimeout(
                    f"kafka probe: none of {len(tps)} partitions answered a fetch within "
                    f"{min(clients.read_timeout_s, _PROBE_WAIT_S)}s ({clients.where()})"
                )
        except (SourceTimeout, DefiniteSourceError):
            clients.drop_probe()
            raise
        except Exception as exc:
            clients.drop_probe()
            if is_transient(exc):
                raise SourceTimeout(f"kafka probe failed: {describe(exc)} ({clients.where()})") from exc
            raise
        finally:
            fresh.close()
        # Step 3: join into what we knew; the first probe also fixes start="latest".
        for key, hw in learned.items():
            if hw > self._known.get(key, 0):
                self._known[key] = hw
        if self._latest_start is None:
            self._latest_start = dict(learned)
        if self._clients.read_committed:
            self._note_held(answers)
        return Frontier({key: hw for key, hw in self._known.items() if hw > 0})

    def low_watermarks(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """:func:`low_watermarks` asked with the long-lived probe client (dropped on failure)."""
        if not partitions:
            return {}
        client = self._clients.probe()
        try:
            return low_watermarks(client, partitions, self._clients)
        except Exception:
            self._clients.drop_probe()
            raise

    def start_positions(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, bool]]:
        """``partition -> (start offset, explicit)`` for partitions the lower never advanced.

        Only explicit offsets may fall below the low watermark and report a loss; a missing
        partition starts at its low watermark (``earliest``)."""
        start = self._start
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
            consumer = self._clients.probe()
            try:
                found = consumer.offsets_for_times(
                    {TopicPartition(t, p): ts for t, p in todo}, timeout_ms=int(self._clients.read_timeout_s * 1000)
                )
            except Exception as exc:
                self._clients.drop_probe()
                if is_transient(exc):
                    raise SourceTimeout(f"kafka offsets_for_times: {describe(exc)} ({self._clients.where()})") from exc
                raise
            for tp, hit in found.items():
                key = (tp.topic, tp.partition)
                # No record at or after ts: start at the end known now.
                self._timestamp_start[key] = hit.offset if hit is not None else self._known.get(key, 0)
        return {p: self._timestamp_start[p] for p in partitions if p in self._timestamp_start}

    def _discover(self) -> list[tuple[str, int]]:
        """Every partition of the routed topics that exist: one metadata request, on a pooled
        client (the one the fetch probe then uses, with the leaders just learned), for the
        listed topics only, or for every topic when the source has a ``pattern``."""
        routing = self._routing
        timeout = self._clients.read_timeout_s
        with lease(self._clients, time.monotonic() + timeout) as client:
            # kafka-python's wait is bounded, the connection's is not always: bound it here.
            found = bounded(
                lambda: metadata(client, None if routing.pattern else list(routing.topics), timeout),
                timeout,
                f"kafka metadata request ({self._clients.where()})",
            )
        topics = found.keys()
        partitions: list[tuple[str, int]] = []
        present = set()
        for topic in sorted(topics):
            if not routing.selected(topic):
                continue
            if routing.route(topic) is None:
                if topic not in self._unrouted_warned:
                    self._unrouted_warned.add(topic)
                    log.warning("kafka topic %r matches the pattern but no output; ignored", topic)
                continue
            present.add(topic)
            for p in found[topic]:
                partitions.append((topic, p))
        missing = [t for t in routing.topics if t not in present]
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

    def _probe(self, fresh: _Fresh, tps: list[Any]) -> dict[tuple[str, int], tuple[int, int]]:
        """``(end, high watermark)`` per partition (those that answered in time).

        Each partition is fetched from its last known end, or for a partition seen for the first
        time from offset 0; the answer is what the fetch response carries. The fetch caps its
        response at one byte (:func:`~reclock.sources.kafka.requests.ends`), so where it asks
        costs the broker nothing (``end_offsets() - 1`` was asked as a hint before the cap, one
        more round trip). First one raw fetch per leader on a pooled client
        (:meth:`_fetch_probe`). The partitions it leaves unanswered (no leader known to the
        pooled client yet, an offset out of range: retention deleted offset 0) are polled
        through a fresh consumer (:meth:`_poll_probe`) when reading uncommitted; a consumer knows
        no last stable offset, so when reading committed they are fetched again from their low
        watermark instead.

        The consumer must be fresh (see the module docstring), and this must never ``pause()`` a
        partition: kafka-python 3.0 parks the buffered fetch of a paused partition and, once another
        partition's drained fetch sits in line, never releases it, so the parked partition is never
        fetched again and the probe waits out its deadline.
        """
        if not tps:
            return {}
        positions = {tp: self._known.get((tp.topic, tp.partition), 0) for tp in tps}
        answered = self._fetch_probe(positions)
        rest = [tp for tp in tps if (tp.topic, tp.partition) not in answered]
        if rest and self._clients.read_committed:
            lows = low_watermarks(fresh.get(), [(tp.topic, tp.partition) for tp in rest], self._clients)
            answered.update(self._fetch_probe({tp: lows.get((tp.topic, tp.partition), 0) for tp in rest}))
        elif rest:
            answered.update({key: (hw, hw) for key, hw in self._poll_probe(fresh.get(), rest, positions).items()})
        return answered

    def _fetch_probe(self, positions: dict[Any, int]) -> dict[tuple[str, int], tuple[int, int]]:
        """Ends from one fetch request per leader on a pooled client: a thousand partitions in one
        round trip. What it cannot answer (no leader known to the pooled client yet, an offset
        out of range, a broker that does not answer) is left to the caller."""
        timeout = min(self._clients.read_timeout_s, _PROBE_WAIT_S)
        asks = {(tp.topic, tp.partition): offset for tp, offset in positions.items()}
        try:
            with lease(self._clients, time.monotonic() + timeout) as client:
                return ends(client, asks, timeout, read_committed=self._clients.read_committed)
        except Exception as exc:
            if not (is_transient(exc) or isinstance(exc, SourceTimeout)):
                raise
            log.debug("kafka probe by fetch failed, asking another way: %s", describe(exc))
            return {}

    def _poll_probe(self, consumer: Any, tps: list[Any], positions: dict[Any, int]) -> dict[tuple[str, int], int]:
        """High watermarks through ``consumer``'s own fetches: it resets an offset out of range
        to the log's start (``auto_offset_reset="earliest"``) and still answers."""
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, positions[tp])
        # A partition whose leader does not answer keeps its last known end for this probe.
        deadline = time.monotonic() + min(self._clients.read_timeout_s, _PROBE_WAIT_S)
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

    # -- open transactions ------------------------------------------------------------------------

    def warnings(self) -> list[str]:
        """One line per partition an open transaction has held for ``open_transaction_warning_s``
        or longer (as of the last probe)."""
        return list(self._warnings)

    def _note_held(self, answers: dict[tuple[str, int], tuple[int, int]]) -> None:
        """Track how long each partition's last stable offset has stayed below its high watermark
        at one offset (a moving LSO is transactions ending, not one held open), and word the
        warnings for those held too long."""
        now = time.monotonic()
        for key, (end, hw) in answers.items():
            held = self._held.get(key)
            if end >= hw:
                self._held.pop(key, None)
                self._holders.pop(key, None)
            else:
                self._held[key] = (end, now if held is None or held[0] != end else held[1], hw)
        warnings = []
        for key, (lso, since, hw) in sorted(self._held.items()):
            if now - since < self._warn_after_s:
                continue
            fresh = self._holders.get(key, (None,))[0] != lso
            if fresh:  # once per held offset: one fetch, one log line
                self._holders[key] = (lso, self._holder(key, lso))
            holder = self._holders[key][1]
            who = f"producer id {holder[0]}, epoch {holder[1]}" if holder else "producer unknown"
            warnings.append(
                f"kafka partition {key[0]}[{key[1]}]: an open transaction ({who}) has held the last stable "
                f"offset at {lso} for {now - since:.0f} s (high watermark {hw}); records from {lso} on wait "
                f"until it commits or aborts"
            )
            if fresh:
                log.warning("%s", warnings[-1])
        self._warnings = warnings

    def _holder(self, partition: tuple[str, int], offset: int) -> tuple[int, int] | None:
        """``(producer id, epoch)`` of the transactional batch at ``offset``: the open
        transaction's first batch, read uncommitted. None if the broker does not say."""
        timeout = min(self._clients.read_timeout_s, _PROBE_WAIT_S)
        try:
            with lease(self._clients, time.monotonic() + timeout) as client:
                client.partitions_for_topic(partition[0])
                leader = client._client.cluster.leader_for_partition(_topic_partition(partition))
                if leader is None or leader < 0:
                    return None
                manager = client._client._manager
                request = fetch_request({partition: (offset, 1024)}, read_committed=False)
                future = manager.call_soon(lambda: manager.send(request, node_id=leader))
                response = manager.run(lambda: manager.wait_for(future, int(timeout * 1000)))
        except Exception as exc:
            if not (is_transient(exc) or isinstance(exc, SourceTimeout)):
                raise
            log.debug("kafka: cannot read the open transaction's producer: %s", describe(exc))
            return None
        for topic_data in response.responses:
            for data in topic_data.partitions:
                if data.error_code == 0 and data.records:
                    return first_batch(data.records, offset)
        return None

    def _end_name(self) -> str:
        return "last stable offset" if self._clients.read_committed else "high watermark"


def _topic_partition(partition: tuple[str, int]) -> Any:
    from kafka import TopicPartition

    return TopicPartition(*partition)


class _Fresh:
    """A fresh probe consumer (:meth:`KafkaClients.for_probe`), made on first use and closed
    with :meth:`close`: most probes never need one."""

    def __init__(self, clients: KafkaClients) -> None:
        self._clients = clients
        self._consumer: Any = None

    def get(self) -> Any:
        if self._consumer is None:
            self._consumer = self._clients.for_probe()
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            close_client(self._consumer)
            self._consumer = None
