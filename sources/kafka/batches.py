"""Record batches to columns: one fetched partition's bytes parsed into NumPy arrays and
:class:`~reclock.sources.decode.values.Values`, without a Python object per record.

kafka-python's record classes build a Python object per record (~15 us each here, 72% of a
worker's CPU in the issue 14 profile); librdkafka builds a ``Message`` per record too. A fetch
response already holds every record in a few large buffers, so this module parses them the way
a columnar engine would:

1. **Batches** (a Python loop per batch, a few hundred records each): the v2 header
   (``baseOffset``, ``attributes``, ``lastOffsetDelta``, timestamps, record count), the CRC-32C
   of the batch checked, the records section decompressed when the batch is compressed (gzip,
   snappy, lz4, zstd through ``cramjam``), and control batches (transaction markers) skipped:
   they take offsets but hold no record. Reading committed, batches of aborted transactions are
   skipped the same way (:mod:`~reclock.sources.kafka.transactions` says which).
2. **Record starts**: a record's position depends on the length of the one before, so the scan is
   sequential within a batch, but batches are independent: the scan steps through the k-th
   record of *every* batch at once (one NumPy step per record index), falling back to a plain
   loop when there are few batches to step together.
3. **Fields**: attributes, timestamp delta, offset delta, key and value lengths are varints at
   positions that the starts determine, decoded for all records at once; key and value bytes are
   copied out by one masked gather each.

The result equals what kafka-python's record classes return for the same bytes (offsets,
timestamps, keys, values, headers): ``tests/unit/test_kafka_batches.py`` checks that on random
batches with every codec, nulls, headers, control batches and compaction gaps. Legacy message
sets (magic 0 and 1, from brokers older than 0.11) are handed to kafka-python's classes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa

from reclock.sources.decode.values import NEWLINE, Values
from reclock.sources.kafka.transactions import AbortedRanges

__all__ = ["CorruptBatch", "Fetched", "next_offset", "parse", "parse_many"]

_HEADER = 61  # bytes of a v2 batch header, up to the first record
_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength
_TAIL = struct.Struct(">bIhiqqqhii")  # magic, crc, attributes, lastOffsetDelta, base/max timestamp, ...
_LAST_DELTA = struct.Struct(">i")
_COMPRESSION = 0x07
_LOG_APPEND_TIME = 0x08
_CONTROL = 0x20
_XERIAL = b"\x82SNAPPY\x00"
#: Below this many batches, scanning record starts batch by batch in Python is cheaper than
#: stepping NumPy arrays of that many lanes (measured: ~1.9M records/s either way at ~100 lanes).
_MIN_LANES = 96


class CorruptBatch(Exception):
    """A record batch failed its CRC or does not parse: the fetched bytes are damaged."""


@dataclass
class Fetched:
    """The records of one fetch of one partition, in offset order.

    ``next_offset`` is the offset after the last whole batch parsed (control batches included):
    where the next fetch starts. ``None`` when no whole batch was in the bytes.
    """

    offsets: np.ndarray
    timestamps: np.ndarray
    keys: Values | None
    values: Values
    headers: list[list[tuple[str, bytes | None]]] | None
    next_offset: int | None

    def __len__(self) -> int:
        return len(self.offsets)

    def window(self, lo: int, hi: int) -> Fetched:
        """Records ``lo`` to ``hi`` (excluded)."""
        return Fetched(
            self.offsets[lo:hi],
            self.timestamps[lo:hi],
            None if self.keys is None else self.keys.window(lo, hi),
            self.values.window(lo, hi),
            None if self.headers is None else self.headers[lo:hi],
            self.next_offset,
        )


def parse(buf: bytes | memoryview, *, keys: bool = False, headers: bool = False, until: int | None = None) -> Fetched:
    """Parse a fetch response's records for one partition; a trailing partial batch (a fetch cut
    at its size limit) is left for the next fetch, and so are the batches that start at or past
    ``until`` (a read that needs 20 records of a 5 MB response parses a batch or two). ``keys`` /
    ``headers`` say whether to extract them (values, offsets and timestamps always are)."""
    return parse_many([(buf, until)], keys=keys, headers=headers)[0]


def parse_many(
    parts: Sequence[tuple[bytes | memoryview, int | None]],
    *,
    keys: bool = False,
    headers: bool = False,
    aborted: Sequence[Iterable[tuple[int, int]] | None] | None = None,
) -> list[Fetched]:
    """:func:`parse` of several partitions' bytes (each with its ``until``) at once.

    One fetch response holds a piece of every partition a task asked for; parsed one by one, a
    thousand partitions of a few batches each would step a thousand tiny NumPy scans. Parsed
    together, their batches share one arena and one vectorised scan, and each partition gets a
    window of the result.

    ``aborted``, one entry per part, reads ``read_committed``: a part's entry is its fetch
    response's aborted transactions ``(producer id, first offset)``, and batches of aborted
    transactions are dropped by the protocol's rule
    (:class:`~reclock.sources.kafka.transactions.AbortedRanges`); ``None`` (or no ``aborted`` at
    all) reads ``read_uncommitted``. Either way markers are never records, and ``next_offset``
    passes dropped batches."""
    sections: list[memoryview | bytes] = []
    batches: list[tuple[int, int, int, int]] = []  # base offset, base timestamp, record count, flags
    nexts: list[int | None] = []
    records_of: list[int] = []  # records each part holds
    legacy: dict[int, Fetched] = {}
    for index, (buf, until) in enumerate(parts):
        view = memoryview(buf)
        committed = aborted[index] if aborted is not None else None
        ranges = AbortedRanges(committed) if committed is not None else None
        if len(view) >= 17 and view[16] != 2:
            legacy[index] = _legacy(bytes(view), keys=keys, headers=headers)
            nexts.append(None)
            records_of.append(0)
            continue
        next_offset = None
        held = 0
        for pos, end, base in _whole_batches(view, until):
            magic, crc, attributes, last_delta, base_ts, max_ts, pid, _, _, count = _TAIL.unpack_from(view, pos + 16)
            if magic != 2:
                raise CorruptBatch(f"record batch at offset {base}: magic {magic} inside a v2 fetch")
            if crc32c.crc32c(view[pos + 21 : end]) != crc:
                raise CorruptBatch(f"record batch at offset {base}: CRC-32C mismatch")
            next_offset = base + last_delta + 1
            if count <= 0:
                continue
            body: bytes | memoryview = view[pos + _HEADER : end]
            codec = attributes & _COMPRESSION
            if codec and (not attributes & _CONTROL or ranges is not None):
                body = _decompress(codec, view[pos + _HEADER : end], base)
            if ranges is not None and ranges.drops(attributes, pid, next_offset - 1, body):
                continue
            if not attributes & _CONTROL:
                sections.append(body)
                stamp = max_ts if attributes & _LOG_APPEND_TIME else base_ts
                batches.append((base, stamp, count, attributes & _LOG_APPEND_TIME))
                held += count
        nexts.append(next_offset)
        records_of.append(held)
    if batches:
        joined = b"".join(sections)
        arena = np.frombuffer(joined, np.uint8)
        sizes = np.fromiter((len(s) for s in sections), np.int64, len(sections))
        section_starts = np.zeros(len(sections), np.int64)
        np.cumsum(sizes[:-1], out=section_starts[1:])
        meta = np.array(batches, np.int64)
        every = _records(joined, arena, section_starts, sizes, meta, keys, headers, None)
    out: list[Fetched] = []
    at = 0
    for index, (held, next_offset) in enumerate(zip(records_of, nexts, strict=True)):
        if index in legacy:
            out.append(legacy[index])
        elif held == 0:
            out.append(_empty(keys, headers, next_offset))
        else:
            part = every.window(at, at + held)
            part.next_offset = next_offset
            out.append(part)
        at += held
    return out


def next_offset(buf: bytes | memoryview, *, until: int | None = None) -> int | None:
    """Where the next fetch continues after ``buf`` (what :func:`parse` would report as
    ``next_offset``), from the batch headers alone: no CRC, no record parsed."""
    view = memoryview(buf)
    if len(view) >= 17 and view[16] != 2:
        return _legacy(bytes(view), keys=False, headers=False).next_offset
    after = None
    for pos, _, base in _whole_batches(view, until):
        after = base + _LAST_DELTA.unpack_from(view, pos + 23)[0] + 1
    return after


def _whole_batches(view: memoryview, until: int | None) -> Iterator[tuple[int, int, int]]:
    """``(start, end, base offset)`` of each whole batch in ``view`` that starts below ``until``."""
    pos = 0
    while pos + _HEADER <= len(view):
        base, length = _PREFIX.unpack_from(view, pos)
        end = pos + 12 + length
        if end > len(view) or (until is not None and base >= until):
            return
        yield pos, end, base
        pos = end


def _records(
    joined: bytes,
    arena: np.ndarray,
    section_starts: np.ndarray,
    sizes: np.ndarray,
    meta: np.ndarray,
    want_keys: bool,
    want_headers: bool,
    next_offset: int | None,
) -> Fetched:
    counts = meta[:, 2]
    starts = _record_starts(joined, arena, section_starts, counts)
    batch_of = np.repeat(np.arange(len(counts)), counts)
    length, n0 = _varints(arena, starts)
    body = starts + n0
    ends = body + length
    if (length < 0).any() or (ends > (section_starts + sizes)[batch_of]).any():
        raise CorruptBatch("a record runs past the end of its batch")
    ts_delta, n1 = _varints(arena, body + 1)  # after the attributes byte
    off_delta, n2 = _varints(arena, body + 1 + n1)
    key_at = body + 1 + n1 + n2
    key_len, n3 = _varints(arena, key_at)
    key_begin = key_at + n3
    value_at = key_begin + np.maximum(key_len, 0)
    value_len, n4 = _varints(arena, value_at)
    value_begin = value_at + n4
    headers_at = value_begin + np.maximum(value_len, 0)
    header_count, n5 = _varints(arena, headers_at)
    if (headers_at + n5 > ends).any() or ((header_count == 0) & (headers_at + n5 != ends)).any():
        raise CorruptBatch("a record's fields do not add up to its length")
    offsets = meta[batch_of, 0] + off_delta
    appended = meta[batch_of, 3] != 0
    timestamps = np.where(appended, meta[batch_of, 1], meta[batch_of, 1] + ts_delta)
    timestamps[meta[batch_of, 1] < 0] = -1
    values = _gather(arena, value_begin, value_len)
    keys = _gather(arena, key_begin, key_len) if want_keys else None
    headers: list[list[tuple[str, bytes | None]]] | None = None
    if want_headers:
        headers = [[] for _ in range(len(starts))]
        for i in np.nonzero(header_count)[0].tolist():
            headers[i] = _headers(arena, int(headers_at[i] + n5[i]), int(header_count[i]))
    return Fetched(offsets, timestamps, keys, values, headers, next_offset)


def _record_starts(joined: bytes, arena: np.ndarray, section_starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Where every record begins (its length varint), batch after batch. ``joined`` is the bytes
    under ``arena``: indexing ``bytes`` is what a Python loop does fastest."""
    first = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    starts = np.empty(int(counts.sum()), np.int64)
    position = section_starts.copy()
    lanes = np.arange(len(counts))
    k = 0
    while len(lanes) >= _MIN_LANES:
        at = position[lanes]
        starts[first[lanes] + k] = at
        length, n = _varints(arena, at)
        if (length < 0).any():
            raise CorruptBatch("a record has a negative length")
        position[lanes] = at + n + length
        k += 1
        lanes = lanes[counts[lanes] > k]
    try:
        for lane in lanes.tolist():
            cursor = int(position[lane])
            lo, hi = int(first[lane]) + k, int(first[lane] + counts[lane])
            found: list[int] = []
            append = found.append
            for _ in range(hi - lo):
                append(cursor)
                b = joined[cursor]
                if b < 0x80 and not b & 1:
                    cursor += 1 + (b >> 1)
                    continue
                c = joined[cursor + 1]
                if b >= 0x80 and c < 0x80 and not b & 1:  # two bytes: records of 64 B to 8 KiB
                    cursor += 2 + (((b & 0x7F) | (c << 7)) >> 1)
                else:
                    cursor = _skip_record(joined, cursor)
            starts[lo:hi] = found
    except IndexError:
        raise CorruptBatch("a batch holds fewer records than its header says") from None
    if len(starts) and (starts >= len(arena)).any():
        raise CorruptBatch("a batch holds fewer records than its header says")
    return starts


def _skip_record(data: Any, at: int) -> int:
    """The position after the record at ``at`` (its length varint, then that many bytes)."""
    b = data[at]
    if b < 0x80:
        if b & 1:
            raise CorruptBatch("a record has a negative length")
        return at + 1 + (b >> 1)
    value, shift, at = b & 0x7F, 7, at + 1
    while True:
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value & 1:
                raise CorruptBatch("a record has a negative length")
            return at + (value >> 1)
        shift += 7
        if shift > 35:
            raise CorruptBatch("a record length varint is longer than 5 bytes")


def _varints(arena: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints at positions ``at``: ``(values, byte lengths)``, all at once.

    One- and two-byte varints (every length under 8 KiB, every offset delta under 8,192) take
    a few whole-array operations; longer ones are finished for the positions that need them."""
    last = len(arena) - 1
    if len(at) and (at > last).any():
        raise CorruptBatch("a varint lies past the end of the records")
    b0 = arena[at]
    longer = b0 >= 0x80
    if not longer.any():
        value = b0.astype(np.int64)
        return (value >> 1) ^ -(value & 1), np.ones(len(at), np.int64)
    b1 = arena[np.minimum(at + 1, last)]
    value = np.where(longer, (b0 & 0x7F).astype(np.int64) | (b1 & 0x7F).astype(np.int64) << 7, b0)
    count = 1 + longer.astype(np.int64)
    more = np.nonzero(longer & (b1 >= 0x80))[0]
    if len(more) and (at[more] + 1 > last).any():
        raise CorruptBatch("a varint runs past the end of the records")
    shift = 14
    while len(more):
        if shift > 63:
            raise CorruptBatch("a varint is longer than 10 bytes")
        where = at[more] + count[more]
        if (where > last).any():
            raise CorruptBatch("a varint runs past the end of the records")
        b = arena[where].astype(np.uint64)
        value[more] = (value[more].astype(np.uint64) | (b & np.uint64(0x7F)) << np.uint64(shift)).view(np.int64)
        count[more] += 1
        more = more[b >= 0x80]
        shift += 7
    unsigned = value.view(np.uint64)
    return ((unsigned >> np.uint64(1)) ^ (np.uint64(0) - (unsigned & np.uint64(1)))).view(np.int64), count


def _gather(arena: np.ndarray, begin: np.ndarray, length: np.ndarray) -> Values:
    """Copy the byte ranges ``[begin, begin + length)`` (length -1: a null) into one buffer, each
    followed by a newline.

    The copy is Arrow's: the ranges become a ``binary_view`` array over the arena (16 bytes of
    NumPy work per value, the bytes themselves untouched), cast to a plain binary array in C++.
    Each range takes one byte more, the byte after it, which then becomes the newline.
    """
    n = len(begin)
    valid = length >= 0
    size = np.where(valid, length, 0)
    span = size + 1
    if (begin + span > len(arena)).any():
        raise CorruptBatch("a key or value runs past the end of the records")
    views = np.zeros((n, 16), np.uint8)
    words = views.view(np.int32)
    words[:, 0] = span
    long_ = np.nonzero(span > 12)[0]
    if len(long_):
        at = begin[long_]
        for j in range(4):
            views[long_, 4 + j] = arena[at + j]
        words[long_, 3] = at
    short = np.nonzero(span <= 12)[0]
    if len(short):
        inline = arena[np.minimum(begin[short, None] + _TWELVE, len(arena) - 1)]
        inline[span[short, None] <= _TWELVE] = 0
        views[short[:, None], 4 + _TWELVE] = inline
    spans = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(arena)])
    packed = spans.cast(pa.binary())
    offsets = np.frombuffer(packed.buffers()[1], np.int32, n + 1)
    data = np.frombuffer(packed.buffers()[2], np.uint8, int(offsets[-1])).copy()
    starts = offsets[:-1].astype(np.int64)
    data[starts + size] = NEWLINE
    return Values(data, starts, size, None if valid.all() else valid)


_TWELVE = np.arange(12)


def _headers(arena: np.ndarray, at: int, count: int) -> list[tuple[str, bytes | None]]:
    """A record's headers (rare: parsed one by one). Keys are UTF-8 text, values may be null."""
    data = arena
    out = []
    for _ in range(count):
        key_len, at = _varint(data, at)
        key = data[at : at + key_len].tobytes().decode("utf-8")
        at += key_len
        value_len, at = _varint(data, at)
        value = None if value_len < 0 else data[at : at + value_len].tobytes()
        at += max(value_len, 0)
        out.append((key, value))
    return out


def _varint(data: Any, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = int(data[at])
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7


def _decompress(codec: int, body: memoryview, base: int) -> bytes:
    import cramjam

    try:
        if codec == 1:
            return bytes(cramjam.gzip.decompress(body))
        if codec == 2:
            if bytes(body[:8]) == _XERIAL:
                return _xerial(body)
            return bytes(cramjam.snappy.decompress_raw(body))
        if codec == 3:
            return bytes(cramjam.lz4.decompress(body))
        if codec == 4:
            return bytes(cramjam.zstd.decompress(body))
    except cramjam.DecompressionError as exc:
        raise CorruptBatch(f"record batch at offset {base}: cannot decompress: {exc}") from exc
    raise CorruptBatch(f"record batch at offset {base}: unknown compression codec {codec}")


def _xerial(body: memoryview) -> bytes:
    """Snappy in the Java client's xerial framing: a 16-byte header, then length-prefixed blocks."""
    import cramjam

    out = []
    pos = 16
    while pos + 4 <= len(body):
        (size,) = struct.unpack_from(">i", body, pos)
        out.append(bytes(cramjam.snappy.decompress_raw(body[pos + 4 : pos + 4 + size])))
        pos += 4 + size
    return b"".join(out)


def _empty(keys: bool, headers: bool, next_offset: int | None) -> Fetched:
    none = np.zeros(0, np.int64)
    values = Values(np.zeros(0, np.uint8), none, none, None)
    return Fetched(none, none, values if keys else None, values, [] if headers else None, next_offset)


def _legacy(buf: bytes, *, keys: bool, headers: bool) -> Fetched:
    """Message sets of magic 0 and 1 (brokers before 0.11): kafka-python's classes parse them."""
    from kafka.record import MemoryRecords

    records = MemoryRecords(buf)
    offsets, stamps, key_list, value_list, header_list = [], [], [], [], []
    next_offset = None
    while (batch := records.next_batch()) is not None:
        for record in batch:
            offsets.append(record.offset)
            stamps.append(record.timestamp if record.timestamp is not None else -1)
            key_list.append(record.key)
            value_list.append(record.value)
            header_list.append(list(record.headers))
            next_offset = record.offset + 1
    return Fetched(
        np.asarray(offsets, np.int64),
        np.asarray(stamps, np.int64),
        Values.of(key_list) if keys else None,
        Values.of(value_list),
        header_list if headers else None,
        next_offset,
    )
