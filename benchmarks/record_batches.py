"""Kafka record batches in memory, and two ways to decode them: the least Python can do, and kafka-python's.

The yardstick of the Kafka scenario's per-record parsing cost (no broker, no network: the same bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["kafka_python_decode", "lean_decode", "record_batches"]


def record_batches(values: Sequence[bytes], batch_bytes: int = 1 << 20) -> bytes:
    """``values`` as consecutive Kafka v2 record batches (the bytes a Fetch response carries)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    def builder() -> Any:
        return DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=batch_bytes,
        )

    out = bytearray()
    current, base = builder(), 0
    for offset, value in enumerate(values):
        if current.append(offset - base, timestamp=1_700_000_000_000, key=None, value=value, headers=[]) is None:
            data = current.build()
            data[0:8] = base.to_bytes(8, "big")
            out += data
            current, base = builder(), offset
            current.append(0, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    data = current.build()
    data[0:8] = base.to_bytes(8, "big")
    out += data
    return bytes(out)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def lean_decode(buf: bytes) -> tuple[list[int], list[bytes | None]]:
    """Offsets and values of uncompressed v2 record batches: the least per-record work possible
    in Python (no record objects, no timestamps, keys or headers kept; no CRC check).

    Only a yardstick for what kafka-python's per-record parsing costs on top of that; a real
    reader would also check each batch's CRC32C, skip control batches and handle compression.
    """
    offsets: list[int] = []
    values: list[bytes | None] = []
    pos, end = 0, len(buf)
    while pos + 61 <= end:
        base = int.from_bytes(buf[pos : pos + 8], "big")
        stop = pos + 12 + int.from_bytes(buf[pos + 8 : pos + 12], "big")
        count = int.from_bytes(buf[pos + 57 : pos + 61], "big")
        p = pos + 61
        for _ in range(count):
            # One-byte varints (most fields of small records) are decoded inline.
            b = buf[p]
            length, q = ((b >> 1) ^ -(b & 1), p + 1) if b < 0x80 else _varint(buf, p)
            record_end = q + length
            q += 1  # attributes
            q = q + 1 if buf[q] < 0x80 else _varint(buf, q)[1]  # timestamp delta
            b = buf[q]
            delta, q = ((b >> 1) ^ -(b & 1), q + 1) if b < 0x80 else _varint(buf, q)
            b = buf[q]
            key_length, q = ((b >> 1) ^ -(b & 1), q + 1) if b < 0x80 else _varint(buf, q)
            q += max(key_length, 0)
            b = buf[q]
            value_length, q = ((b >> 1) ^ -(b & 1), q + 1) if b < 0x80 else _varint(buf, q)
            offsets.append(base + delta)
            values.append(buf[q : q + value_length] if value_length >= 0 else None)
            p = record_end
        pos = stop
    return offsets, values


def kafka_python_decode(buf: bytes) -> tuple[list[int], list[bytes | None]]:
    """The same through kafka-python's own record classes (what its fetcher iterates)."""
    from kafka.record.memory_records import MemoryRecords

    records = MemoryRecords(buf)
    offsets: list[int] = []
    values: list[bytes | None] = []
    while records.has_next():
        for record in records.next_batch():
            offsets.append(record.offset)
            values.append(record.value)
    return offsets, values
