"""Read of the Kafka source (Spark task): one split's records, exactly ``[start, end)``, shaped
into ``(output, Arrow batch)`` pairs.

The records come from the task's :class:`~reclock.sources.kafka.fetcher.Fetcher`, which fetches every
split of the task in shared requests and parses record batches into columns
(:mod:`reclock.sources.kafka.batches`); a split read on its own gets a fetcher of its own. The read stops
on the fetch *position* reaching ``end``: transaction markers and compaction gaps take offsets
but hold no record, so counting records would never finish. Records outside ``[start, end)``
(fetches return whole batches) are cut off by offset, so a split always yields the same records.
If no progress is made for ``read_timeout_s`` the read raises
:class:`~reclock.sources.kafka.clients.SourceTimeout` (retryable) instead of hanging.

A task reads its splits as one stream (:func:`read_splits`): the records of one route wait in
a :class:`~reclock.sources.kafka.decoding.Pending` across partitions and are shaped ``flush_rows`` at a
time, so a thousand partitions of a hundred records cost a few decodes, not a thousand.
Offsets deleted before they were read become one errors row (kind :data:`OFFSET_LOST`) unless
the source's ``on_offset_lost`` says ``fail``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from reclock.errors import DefiniteSourceError
from reclock.sources.base import ERRORS, RecordErrorPolicy, Split, error_batch
from reclock.sources.kafka.batches import Fetched
from reclock.sources.kafka.clients import KafkaClients, close_client
from reclock.sources.kafka.config import KafkaRoute, Policy, Routing, kafka_partition
from reclock.sources.kafka.decoding import Pending
from reclock.sources.kafka.fetcher import Fetcher, OffsetLost, lease
from reclock.sources.kafka.probe import low_watermarks
from reclock.timeline.frontier import encode_partition

__all__ = ["OFFSET_LOST", "lost_batch", "read_splits"]

log = logging.getLogger(__name__)

#: ``kind`` of the errors row that reports offsets deleted before they were read.
OFFSET_LOST = "offset_lost"


def read_splits(
    splits: Sequence[Split],
    routing: Routing,
    clients: KafkaClients,
    *,
    flush_rows: int,
    on_offset_lost: Policy,
    on_record_error: RecordErrorPolicy,
    fetcher: Fetcher | None = None,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Yield the records of ``splits`` (each exactly ``[start, end)``) as ``(output, batch)``
    pairs of at most ``flush_rows`` rows; a batch may hold records of several splits. Replayable:
    the same splits yield the same rows every time. ``fetcher`` is the task's, if it holds these
    splits; otherwise they are fetched on a client of their own."""
    routes = []
    for split in splits:
        route = routing.route(_kafka(split)[0])
        if route is None:
            raise ValueError(f"topic {_kafka(split)[0]!r} is not routed to any output of this source")
        routes.append(route)
    read = _Read(clients, flush_rows, on_offset_lost, on_record_error == "fail")
    if fetcher is not None:
        yield from read.run(splits, routes, fetcher)
        return
    wanted = {meta for route in routes for meta, _ in route.metadata}
    ranges = [(_kafka(s), s.start, s.end) for s in splits if s.end > s.start]
    with lease(clients, time.monotonic() + clients.read_timeout_s) as client:
        own = Fetcher(client, clients, ranges, keys="key" in wanted, headers="headers" in wanted)
        yield from read.run(splits, routes, own)


class _Read:
    """The reads of a task: each split's records cut to ``[start, end)``, pending per route."""

    def __init__(self, clients: KafkaClients, flush_rows: int, on_offset_lost: Policy, fail: bool) -> None:
        self.clients = clients
        self.flush_rows = flush_rows
        self.on_offset_lost = on_offset_lost
        self.fail = fail

    def run(
        self, splits: Sequence[Split], routes: Sequence[KafkaRoute], fetcher: Fetcher
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        pending: dict[str, Pending] = {}
        for split, route in zip(splits, routes, strict=True):
            encoded = encode_partition(split.partition)
            lost_from = getattr(split, "lost_from", None)
            if lost_from is not None and lost_from < split.start:
                yield ERRORS, lost_batch(encoded, _kafka(split), lost_from, split.start)
            waiting = pending.setdefault(route.name, Pending(route, fail=self.fail))
            for piece in self._pieces(split, encoded, fetcher):
                if isinstance(piece, pa.RecordBatch):
                    yield ERRORS, piece
                    continue
                waiting.add(_kafka(split), encoded, piece)
                yield from waiting.take(self.flush_rows)
        for waiting in pending.values():
            yield from waiting.take(0)

    def _pieces(self, split: Split, encoded: str, fetcher: Fetcher) -> Iterator[Fetched | pa.RecordBatch]:
        """The split's records in fetched chunks, and an errors batch for offsets found lost."""
        kafka = _kafka(split)
        topic, kpart = kafka
        end = split.end
        position = split.start
        while position < end:
            try:
                for chunk in fetcher.chunks(kafka, position, self.clients.read_timeout_s):
                    lo, hi = np.searchsorted(chunk.offsets, [split.start, end])
                    if lo or hi < len(chunk):
                        chunk = chunk.window(int(lo), int(hi))
                    if len(chunk):
                        yield chunk
                position = end
            except OffsetLost as lost:
                # Retention deleted what this split needs after it was planned.
                low = self._low_watermark(kafka, lost.offset)
                if self.on_offset_lost == "fail":
                    raise DefiniteSourceError(
                        f"kafka partition {topic}[{kpart}]: offset {lost.offset} is below the low watermark "
                        f"{low}; records [{lost.offset}, {min(low, end)}) were deleted before they were read"
                    ) from None
                yield lost_batch(encoded, kafka, lost.offset, min(low, end))
                position = min(low, end)
                fetcher.skip_to(kafka, position)

    def _low_watermark(self, partition: tuple[str, int], offset: int) -> int:
        """The partition's low watermark, which must lie past ``offset`` for the offset to be lost:
        an offset out of range at the top (a truncated log) is not a loss but an error."""
        from kafka.errors import OffsetOutOfRangeError

        probe = self.clients.consumer(deadline=time.monotonic() + self.clients.read_timeout_s)
        try:
            low = low_watermarks(probe, [partition], self.clients).get(partition, 0)
        finally:
            close_client(probe)
        if low <= offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {partition[0]}[{partition[1]}] is out of range "
                f"but not below the low watermark {low}"
            )
        return low


def _kafka(split: Split) -> tuple[str, int]:
    """The Kafka partition a split reads: its own, or the one a re-read partition copies."""
    return kafka_partition(split.partition)


def lost_batch(encoded: str, partition: tuple[str, int], start: int, stop: int) -> pa.RecordBatch:
    """The errors row (and a warning) for offsets ``[start, stop)`` deleted before they were read."""
    message = (
        f"offsets [{start}, {stop}) of kafka partition {partition[0]}[{partition[1]}] were deleted "
        f"(below the low watermark {stop}) before they were read; skipped"
    )
    log.warning("%s", message)
    return error_batch(encoded, [start], [OFFSET_LOST], [message], [None])
