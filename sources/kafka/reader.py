"""Read of the Kafka source (Spark task): one split's records, exactly ``[start, end)``, shaped
into ``(output, Arrow batch)`` pairs.

A fresh consumer assigns the partition, seeks to ``start`` (mid-batch seeks work) and polls until
its *position* reaches ``end``: transaction markers and compaction gaps take offsets but yield no
record, so counting records would never finish. Records at or past ``end`` (fetches return whole
batches) are dropped, so a split always yields the same records; a poll never asks for more
records than the range has left, so the rest of a fetch is never decoded (kafka-python decodes
records in Python, ~15 us each). If no progress is made for ``read_timeout_s`` the read raises
:class:`~sources.kafka.clients.SourceTimeout` (retryable) instead of hanging.

Shaping (:func:`shape`) hands the buffered values to the route's decoder and turns every record
into a row of its output (``_partition``/``_offset`` lineage, the decoded payload, then the
metadata columns) or a row of :data:`~sources.base.ERRORS` with its coordinates: a bad value or a
bad text key. Offsets deleted before they were read become one errors row (kind
:data:`OFFSET_LOST`) unless the source's ``on_offset_lost`` says ``fail``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from reclock.errors import DefiniteSourceError
from reclock.sources.base import ERRORS, LINEAGE_FIELDS, RecordError, Split, error_batch
from reclock.sources.kafka.clients import KafkaClients, SourceTimeout, close_client
from reclock.sources.kafka.config import METADATA_COLUMNS, KafkaRoute, Policy, Routing
from reclock.sources.kafka.probe import low_watermarks
from reclock.time import encode_partition

__all__ = ["OFFSET_LOST", "lost_batch", "read_split", "shape"]

log = logging.getLogger(__name__)

#: ``kind`` of the errors row that reports offsets deleted before they were read.
OFFSET_LOST = "offset_lost"


def read_split(
    split: Split,
    routing: Routing,
    clients: KafkaClients,
    *,
    flush_rows: int,
    on_offset_lost: Policy,
    on_record_error: Policy,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Yield the records of ``split`` as ``(output, batch)`` pairs, a batch every ``flush_rows``
    rows at most. Replayable: the same split yields the same rows every time."""
    from kafka import TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    topic, kpart = split.partition
    route = routing.route(topic)
    if route is None:
        raise ValueError(f"topic {topic!r} is not routed to any output of this source")
    encoded = encode_partition(split.partition)
    lost_from = getattr(split, "lost_from", None)
    if lost_from is not None and lost_from < split.start:
        yield ERRORS, lost_batch(encoded, split.partition, lost_from, split.start)
    if split.start >= split.end:
        return

    fail = on_record_error == "fail"
    tp = TopicPartition(topic, kpart)
    end = split.end
    timeout = clients.read_timeout_s
    deadline = time.monotonic() + timeout
    consumer = clients.for_read(deadline, flush_rows)
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
                    f"at offset {position} (high watermark {hw}; {clients.where()})"
                )
            try:
                # Never decode past the end: a fetch returns whole batches, often far beyond it.
                fetched = consumer.poll(
                    timeout_ms=int(min(remaining, 0.5) * 1000) + 1,
                    max_records=max(1, min(flush_rows, end - position)),
                )
            except OffsetOutOfRangeError:
                # Retention deleted what this split needs after it was planned.
                low = low_watermarks(consumer, [split.partition], clients).get(split.partition, 0)
                if low <= position:
                    raise
                if on_offset_lost == "fail":
                    raise DefiniteSourceError(
                        f"kafka partition {topic}[{kpart}]: offset {position} is below the low watermark "
                        f"{low}; records [{position}, {min(low, end)}) were deleted before they were read"
                    ) from None
                yield ERRORS, lost_batch(encoded, split.partition, position, min(low, end))
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
            if len(buf) >= flush_rows:
                yield from shape(buf, encoded, topic, kpart, fail=fail)
        if len(buf):
            yield from shape(buf, encoded, topic, kpart, fail=fail)
    finally:
        close_client(consumer)


def shape(buf: _Buffer, encoded: str, topic: str, kpart: int, *, fail: bool) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Decode the buffered records into the route's output batch plus an errors batch, and
    empty ``buf``. With ``fail``, the first bad record (value or key) raises :class:`RecordError`."""
    route = buf.route
    offsets = np.asarray(buf.offsets, dtype=np.int64)
    values = buf.values
    decoded = route.decoder.decode(values, fail_fast=fail)
    meta_columns: list[pa.Array] = []
    key_faults: list[tuple[int, str, str]] = []
    names = [column for _, column in route.metadata]
    if route.metadata:
        meta_columns, key_faults = _metadata_columns(buf, route, topic, kpart, offsets)
    if fail and (decoded.errors or key_faults):  # name the first bad record, value or key
        _fail(route, topic, kpart, offsets, min(decoded.errors[:1] + key_faults[:1]), buf)
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


def lost_batch(encoded: str, partition: tuple[str, int], start: int, stop: int) -> pa.RecordBatch:
    """The errors row (and a warning) for offsets ``[start, stop)`` deleted before they were read."""
    message = (
        f"offsets [{start}, {stop}) of kafka partition {partition[0]}[{partition[1]}] were deleted "
        f"(below the low watermark {stop}) before they were read; skipped"
    )
    log.warning("%s", message)
    return error_batch(encoded, [start], [OFFSET_LOST], [message], [None])


def _fail(
    route: KafkaRoute, topic: str, kpart: int, offsets: np.ndarray, fault: tuple[int, str, str], buf: _Buffer
) -> None:
    i, kind, message = fault
    buf.clear()
    raise RecordError(
        f"output {route.name!r}: record {topic}[{kpart}]@{int(offsets[i])} could not be decoded "
        f"({kind}): {message} (on_record_error='fail')"
    )


def _metadata_columns(
    buf: _Buffer, route: KafkaRoute, topic: str, kpart: int, offsets: np.ndarray
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


# Positions of the fields the buffer keeps in kafka-python's ``ConsumerRecord`` (a namedtuple).
_OFFSET = itemgetter(3)
_TIMESTAMP = itemgetter(4)
_KEY = itemgetter(6)
_VALUE = itemgetter(7)
_HEADERS = itemgetter(8)
