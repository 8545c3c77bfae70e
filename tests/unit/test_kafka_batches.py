"""The columnar record-batch parser against kafka-python's record classes, the reference.

For random fetches (several v2 batches: every codec, null and empty keys and values, headers,
compaction gaps, control batches, log-append time, a cut-off last batch) :func:`parse` must return
exactly what kafka-python's ``MemoryRecords`` yields, record for record, and damaged bytes must
raise :class:`CorruptBatch`, never parse into something else.
"""

from __future__ import annotations

import struct

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from reclock.sources.decode.values import Values
from reclock.sources.kafka.batches import CorruptBatch, parse, parse_many

CODECS = [0, 1, 2, 3, 4]  # none, gzip, snappy, lz4, zstd

_payload = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=200, max_size=3000))
_header = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=12)))
_record = st.tuples(
    st.integers(min_value=1, max_value=3),  # offset step (> 1: a compaction gap)
    st.integers(min_value=-5, max_value=10**6),  # timestamp delta
    _payload,
    _payload,
    st.lists(_header, max_size=3),
)
_batch = st.tuples(
    st.sampled_from(CODECS),
    st.lists(_record, min_size=1, max_size=40),
    st.sampled_from(["plain", "control", "log_append"]),
)


def _build(base: int, codec: int, records: list, kind: str) -> tuple[bytes, int]:
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 30)
    offset = 0
    for step, ts, key, value, headers in records:
        builder.append(offset, 1_700_000_000_000 + ts, key, value, headers)
        offset += step
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, base)
    if kind != "plain":
        (attributes,) = struct.unpack_from(">h", buf, 21)
        attributes |= 0x20 if kind == "control" else 0x08
        struct.pack_into(">h", buf, 21, attributes)
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf), base + offset - records[-1][0] + 1


def _fetch(batches: list) -> bytes:
    out, base = [], 7
    for codec, records, kind in batches:
        buf, base = _build(base, codec, records, kind)
        out.append(buf)
    return b"".join(out)


def _reference(buf: bytes) -> list[tuple]:
    records = MemoryRecords(buf)
    out = []
    while (batch := records.next_batch()) is not None:
        if batch.is_control_batch:
            continue
        out.extend((r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch)
    return out


def _parsed(buf: bytes) -> list[tuple]:
    got = parse(buf, keys=True, headers=True)
    return [
        (int(o), int(t), got.keys[i], got.values[i], got.headers[i])
        for i, (o, t) in enumerate(zip(got.offsets, got.timestamps, strict=True))
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_batch, min_size=1, max_size=6))
def test_parse_equals_kafka_python(batches: list) -> None:
    buf = _fetch(batches)
    assert _parsed(buf) == _reference(buf)


@settings(max_examples=40, deadline=None)
@given(st.lists(_batch, min_size=2, max_size=5), st.integers(min_value=1, max_value=200))
def test_a_cut_off_last_batch_is_left_for_the_next_fetch(batches: list, cut: int) -> None:
    whole = _fetch(batches)
    last = _fetch(batches[:-1])
    cut_buf = whole[: max(len(last), len(whole) - cut)]
    got = parse(cut_buf)
    assert got.offsets.tolist() == [r[0] for r in _reference(last)]
    expected_next = parse(last).next_offset
    assert got.next_offset == expected_next


def test_many_batches_take_the_vectorised_path_and_agree() -> None:
    # More batches than the lane threshold: the starts are found by NumPy steps.
    rng = np.random.default_rng(7)
    batches = [
        (
            0,
            [
                (1, int(rng.integers(0, 99)), b"k%d" % i, b"v" * int(rng.integers(0, 300)), [])
                for i in range(int(rng.integers(1, 30)))
            ],
            "plain",
        )
        for _ in range(300)
    ]
    buf = _fetch(batches)
    assert _parsed(buf) == _reference(buf)


def test_next_offset_passes_a_trailing_control_batch() -> None:
    buf = _fetch([(0, [(1, 0, None, b"a", [])] * 3, "plain"), (0, [(1, 0, None, b"", [])], "control")])
    got = parse(buf)
    assert got.offsets.tolist() == [7, 8, 9]
    assert got.next_offset == 11


def test_a_flipped_bit_fails_the_crc() -> None:
    buf = bytearray(_fetch([(0, [(1, 0, b"key", b"value", [])] * 5, "plain")]))
    buf[-3] ^= 0x10
    with pytest.raises(CorruptBatch, match="CRC"):
        parse(bytes(buf))


def test_values_join_and_convert_like_a_list() -> None:
    values = [b'{"a": 1}', None, b"", b"x\ny"]
    packed = Values.of(values)
    assert list(packed) == values
    assert packed.to_arrow().to_pylist() == values
    assert packed.joined() is None
    clean = Values.of([b'{"a": 1}', b'{"a": 2}'])
    assert clean.joined() == b'{"a": 1}\n{"a": 2}'
    assert list(Values.concat([clean, packed]).window(1, 4)) == [b'{"a": 2}', b'{"a": 1}', None]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.lists(_batch, min_size=0, max_size=4), min_size=1, max_size=5))
def test_parsing_several_partitions_at_once_equals_parsing_each(partitions: list) -> None:
    bufs = [_fetch(batches) if batches else b"" for batches in partitions]
    together = parse_many([(buf, None) for buf in bufs], keys=True, headers=True)
    for buf, got in zip(bufs, together, strict=True):
        alone = parse(buf, keys=True, headers=True)
        assert got.offsets.tolist() == alone.offsets.tolist() and got.next_offset == alone.next_offset
        assert list(got.values) == list(alone.values) and list(got.keys) == list(alone.keys)
        assert got.headers == alone.headers and got.timestamps.tolist() == alone.timestamps.tolist()
