"""Read of the Kafka source (Spark task): one split's records, exactly ``[start, end)``, shaped
into ``(output, Arrow batch)`` pairs.

The records come from the task's :class:`~sources.kafka.fetcher.Fetcher`, which fetches every
split of the task in shared requests and parses record batches into columns
(:mod:`sources.kafka.batches`); a split read on its own gets a fetcher of its own. The read stops
on the fetch *position* reaching ``end``: transaction markers and compaction gaps take offsets
but hold no record, so counting records would never finish. Records outside ``[start, end)``
(fetches return whole batches) are cut off by offset, so a split always yields the same records.
If no progress is made for ``read_timeout_s`` the read raises
:class:`~sources.kafka.clients.SourceTimeout` (retryable) instead of hanging.

Shaping (:func:`shape`) hands the values to the route's decoder and turns every record into a row
of its output (``_partition``/``_offset`` lineage, the decoded payload, then the metadata columns)
or a row of :data:`~sources.base.ERRORS` with its coordinates: a bad value or a bad text key.
Offsets deleted before they were read become one errors row (kind :data:`OFFSET_LOST`) unless
the source's ``on_offset_lost`` says ``fail``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from reclock.errors import DefiniteSourceError
from reclock.sources.base import ERRORS, LINEAGE_FIELDS, RecordError, Split, error_batch
from reclock.sources.decode.values import Values
from reclock.sources.kafka.batches import Fetched
from reclock.sources.kafka.clients import KafkaClients
from reclock.sources.kafka.config import METADATA_COLUMNS, KafkaRoute, Policy, Routing
from reclock.sources.kafka.fetcher import Fetcher, OffsetLost, lease
from reclock.sources.kafka.probe import low_watermarks
from reclock.time import encode_partition

__all__ = ["OFFSET_LOST", "concat", "lost_batch", "read_split", "shape"]

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
    fetcher: Fetcher | None = None,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Yield the records of ``split`` as ``(output, batch)`` pairs, a batch every ``flush_rows``
    rows at most. Replayable: the same split yields the same rows every time. ``fetcher`` is the
    task's, if it holds this split; otherwise the split is fetched on its own."""
    topic = split.partition[0]
    route = routing.route(topic)
    if route is None:
        raise ValueError(f"topic {topic!r} is not routed to any output of this source")
    encoded = encode_partition(split.partition)
    lost_from = getattr(split, "lost_from", None)
    if lost_from is not None and lost_from < split.start:
        yield ERRORS, lost_batch(encoded, split.partition, lost_from, split.start)
    if split.start >= split.end:
        return
    read = _Read(split, route, clients, encoded, flush_rows, on_offset_lost, on_record_error == "fail")
    if fetcher is not None:
        yield from read.run(fetcher)
        return
    wanted = {meta for meta, _ in route.metadata}
    with lease(clients, time.monotonic() + clients.read_timeout_s) as client:
        ranges = [(split.partition, split.start, split.end)]
        yield from read.run(Fetcher(client, clients, ranges, keys="key" in wanted, headers="headers" in wanted))


class _Read:
    """One split's read: the fetcher's chunks cut to ``[start, end)``, shaped every ``flush_rows``."""

    def __init__(
        self,
        split: Split,
        route: KafkaRoute,
        clients: KafkaClients,
        encoded: str,
        flush_rows: int,
        on_offset_lost: Policy,
        fail: bool,
    ) -> None:
        self.split = split
        self.route = route
        self.clients = clients
        self.encoded = encoded
        self.flush_rows = flush_rows
        self.on_offset_lost = on_offset_lost
        self.fail = fail

    def run(self, fetcher: Fetcher) -> Iterator[tuple[str, pa.RecordBatch]]:
        split, end = self.split, self.split.end
        topic, kpart = split.partition
        pending: list[Fetched] = []
        rows = 0
        position = split.start
        while position < end:
            try:
                for chunk in fetcher.chunks(split.partition, position, self.clients.read_timeout_s):
                    lo, hi = np.searchsorted(chunk.offsets, [split.start, end])
                    if lo or hi < len(chunk):
                        chunk = chunk.window(int(lo), int(hi))
                    if len(chunk):
                        pending.append(chunk)
                        rows += len(chunk)
                    if rows >= self.flush_rows:
                        merged, cut = concat(pending), 0
                        while rows - cut >= self.flush_rows:
                            piece = merged.window(cut, cut + self.flush_rows)
                            yield from shape(piece, self.route, self.encoded, topic, kpart, fail=self.fail)
                            cut += self.flush_rows
                        pending, rows = ([merged.window(cut, rows)] if cut < rows else []), rows - cut
                position = end
            except OffsetLost as lost:
                # Retention deleted what this split needs after it was planned.
                low = self._low_watermark(lost.offset)
                if self.on_offset_lost == "fail":
                    raise DefiniteSourceError(
                        f"kafka partition {topic}[{kpart}]: offset {lost.offset} is below the low watermark "
                        f"{low}; records [{lost.offset}, {min(low, end)}) were deleted before they were read"
                    ) from None
                yield ERRORS, lost_batch(self.encoded, split.partition, lost.offset, min(low, end))
                position = min(low, end)
                fetcher.skip_to(split.partition, position)
        if pending:
            yield from shape(concat(pending), self.route, self.encoded, topic, kpart, fail=self.fail)

    def _low_watermark(self, offset: int) -> int:
        """The partition's low watermark, which must lie past ``offset`` for the offset to be lost:
        an offset out of range at the top (a truncated log) is not a loss but an error."""
        from kafka.errors import OffsetOutOfRangeError

        probe = self.clients.consumer(deadline=time.monotonic() + self.clients.read_timeout_s)
        try:
            low = low_watermarks(probe, [self.split.partition], self.clients).get(self.split.partition, 0)
        finally:
            from reclock.sources.kafka.clients import close_client

            close_client(probe)
        if low <= offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {self.split.partition[0]}[{self.split.partition[1]}] is out of range "
                f"but not below the low watermark {low}"
            )
        return low


def concat(chunks: list[Fetched]) -> Fetched:
    """One :class:`Fetched` of several, in order."""
    if len(chunks) == 1:
        return chunks[0]
    keys = None if chunks[0].keys is None else Values.concat([c.keys for c in chunks])  # type: ignore[misc]
    headers = None if chunks[0].headers is None else [h for c in chunks for h in c.headers]  # type: ignore[union-attr]
    return Fetched(
        np.concatenate([c.offsets for c in chunks]),
        np.concatenate([c.timestamps for c in chunks]),
        keys,
        Values.concat([c.values for c in chunks]),
        headers,
        chunks[-1].next_offset,
    )


def shape(
    records: Fetched, route: KafkaRoute, encoded: str, topic: str, kpart: int, *, fail: bool
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Decode ``records`` into the route's output batch plus an errors batch. With ``fail``, the
    first bad record (value or key) raises :class:`RecordError`."""
    offsets = records.offsets
    values = records.values
    decoded = route.decoder.decode(values, fail_fast=fail)
    meta_columns: list[pa.Array] = []
    key_faults: list[tuple[int, str, str]] = []
    names = [column for _, column in route.metadata]
    if route.metadata:
        meta_columns, key_faults = _metadata_columns(records, route, topic, kpart)
    if fail and (decoded.errors or key_faults):  # name the first bad record, value or key
        _fail(route, topic, kpart, offsets, min(decoded.errors[:1] + key_faults[:1]))
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


def lost_batch(encoded: str, partition: tuple[str, int], start: int, stop: int) -> pa.RecordBatch:
    """The errors row (and a warning) for offsets ``[start, stop)`` deleted before they were read."""
    message = (
        f"offsets [{start}, {stop}) of kafka partition {partition[0]}[{partition[1]}] were deleted "
        f"(below the low watermark {stop}) before they were read; skipped"
    )
    log.warning("%s", message)
    return error_batch(encoded, [start], [OFFSET_LOST], [message], [None])


def _fail(route: KafkaRoute, topic: str, kpart: int, offsets: np.ndarray, fault: tuple[int, str, str]) -> None:
    i, kind, message = fault
    raise RecordError(
        f"output {route.name!r}: record {topic}[{kpart}]@{int(offsets[i])} could not be decoded "
        f"({kind}): {message} (on_record_error='fail')"
    )


def _metadata_columns(
    records: Fetched, route: KafkaRoute, topic: str, kpart: int
) -> tuple[list[pa.Array], list[tuple[int, str, str]]]:
    n = len(records)
    columns: list[pa.Array] = []
    faults: list[tuple[int, str, str]] = []
    for meta, _ in route.metadata:
        if meta == "key":
            raw = records.keys
            keys = raw.to_arrow() if raw is not None else pa.nulls(n, pa.binary())
            if route.key_format == "text":
                try:
                    keys = keys.cast(pa.string())
                except (pa.ArrowInvalid, UnicodeDecodeError):
                    listed = keys.to_pylist()
                    for i, k in enumerate(listed):
                        try:
                            if k is not None:
                                k.decode("utf-8")
                        except UnicodeDecodeError as exc:
                            faults.append((i, "decode", f"invalid UTF-8 key: {exc}"))
                    bad = {i for i, _, _ in faults}
                    keys = pa.array([None if i in bad else k for i, k in enumerate(listed)], pa.binary()).cast(
                        pa.string()
                    )
            columns.append(keys)
        elif meta == "headers":
            headers = records.headers if records.headers is not None else [[] for _ in range(n)]
            columns.append(pa.array(headers, METADATA_COLUMNS["headers"]))
        elif meta == "topic":
            columns.append(pa.repeat(pa.scalar(topic, pa.string()), n))
        elif meta == "partition":
            columns.append(pa.repeat(pa.scalar(kpart, pa.int32()), n))
        elif meta == "offset":
            columns.append(pa.array(records.offsets, pa.int64()))
        elif meta == "timestamp":
            ts = records.timestamps
            columns.append(pa.array(ts, pa.int64(), mask=ts < 0).cast(METADATA_COLUMNS["timestamp"]))
    return columns, faults
