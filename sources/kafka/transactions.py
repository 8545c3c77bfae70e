"""Transactions of the Kafka source: which record batches a ``read_committed`` read drops.

A transactional producer's records sit in the partition before its commit or abort *marker* (a
control batch). A ``read_committed`` fetch returns records only below the last stable offset
(the first offset of the earliest open transaction), so every transaction it returns is decided;
the broker also sends the *aborted transactions* of the fetched range, ``(producer id, first
offset)`` each. The protocol's rule (KIP-98; the Java consumer's ``CompletedFetch`` and
librdkafka apply it the same way), batch by batch in offset order:

1. every aborted transaction whose first offset is at or below the batch's last offset becomes
   *open* for its producer id;
2. an abort marker of a producer id closes that producer's aborted range;
3. a transactional data batch of a producer id whose aborted range is open is dropped;
4. control batches (commit and abort markers) are never records.

Dropped batches and markers still take their offsets: the fetch position moves past them, so
the frontier has no gap and nothing is read twice. :class:`AbortedRanges` is that rule for one
fetch of one partition (each fetch response carries the aborted transactions its whole range
needs, so no state crosses fetches); :func:`~reclock.sources.kafka.batches.parse_many` asks it
about each batch. ``tests/unit/test_kafka_transactions.py`` checks it against a record-by-record
reference of the same rules on random interleavings of committed, aborted and open transactions.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

__all__ = ["ABORT", "COMMIT", "AbortedRanges", "control_type", "first_batch"]

#: Control record types (the marker's key: int16 version, int16 type).
ABORT, COMMIT = 0, 1

_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_KEY = struct.Struct(">hh")
_BATCH = struct.Struct(">qi")  # base offset, batch length
_PRODUCER = struct.Struct(">qh")  # producer id, producer epoch (at byte 43 of a v2 batch)


class AbortedRanges:
    """The ``read_committed`` filter over one fetch of one partition: ``aborted`` is the fetch
    response's list of ``(producer id, first offset)``."""

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        self._pending = sorted(aborted, key=lambda pair: pair[1])
        self._next = 0
        self._open: set[int] = set()

    def drops(self, attributes: int, producer_id: int, last_offset: int, records: bytes | memoryview) -> bool:
        """Whether a batch is left out of the records: a marker, or data of an aborted transaction.

        ``records`` is the batch's records section (decompressed), read only for a control batch
        of a producer whose aborted range is open (to tell an abort marker from a commit)."""
        if producer_id >= 0:
            pending = self._pending
            while self._next < len(pending) and pending[self._next][1] <= last_offset:
                self._open.add(pending[self._next][0])
                self._next += 1
            if attributes & _CONTROL:
                if producer_id in self._open and control_type(records) == ABORT:
                    self._open.discard(producer_id)
                return True
            if attributes & _TRANSACTIONAL and producer_id in self._open:
                return True
        return bool(attributes & _CONTROL)


def control_type(records: bytes | memoryview) -> int:
    """The type of a control batch's first record (:data:`ABORT`, :data:`COMMIT`, or another the
    protocol may add), from its key."""
    at = 0
    _, at = _varint(records, at)  # record length
    at += 1  # attributes
    _, at = _varint(records, at)  # timestamp delta
    _, at = _varint(records, at)  # offset delta
    length, at = _varint(records, at)
    if length < _KEY.size:
        return -1
    return _KEY.unpack_from(records, at)[1]


def _varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7


def first_batch(records: bytes | memoryview, offset: int) -> tuple[int, int] | None:
    """``(producer id, epoch)`` of the transactional batch that holds ``offset`` in a fetch's
    ``records``, or None when no such batch is there."""
    view = memoryview(records)
    pos = 0
    while pos + 61 <= len(view):
        base, length = _BATCH.unpack_from(view, pos)
        if view[pos + 16] != 2:
            return None
        (attributes,) = struct.unpack_from(">h", view, pos + 21)
        (last_delta,) = struct.unpack_from(">i", view, pos + 23)
        if base <= offset <= base + last_delta:
            if not attributes & _TRANSACTIONAL:
                return None
            pid, epoch = _PRODUCER.unpack_from(view, pos + 43)
            return pid, epoch
        pos += 12 + length
    return None
