"""``read_committed`` against an independent reference of Kafka's transaction rules.

Real brokers return aborted records to a ``read_committed`` reader only together with the fetch
response's aborted-transactions list, and the embedded Tansu broker never sends that list, so the
aborted path is pinned here. Hypothesis writes a partition's log: committed, aborted and open
transactions of several producers interleaved with plain and idempotent batches, commit and abort
markers, compaction gaps inside and between batches, every codec, encoded as real Kafka v2 record
batches by kafka-python's builder (the test shares no code with the reader). A model broker serves
it as a Kafka broker does: ``read_committed`` fetches stop at the last stable offset (the first
offset of the earliest open transaction), start at the batch holding the fetch offset, and carry
the aborted transactions whose range ``[first offset, marker]`` meets the fetched range.

Two plain references decide every record on its own:

* the *ground truth*: the generator knows which transaction wrote each record and how that
  transaction ended;
* the *protocol*, record by record: a transactional record of producer ``p`` at offset ``o`` is
  aborted iff the fetch's list holds ``(p, first)`` with ``first <= o`` and no abort marker of
  ``p`` lies in ``[first, o)``; markers are no records.

:func:`parse_many`, fed the fetches one after the other as the fetcher feeds them, must return
exactly the records both references keep, and its ``next_offset`` must pass every dropped batch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from reclock.sources.kafka.batches import parse, parse_many

PRODUCERS = (1, 2, 3, 40)  # transactional producer ids
IDEMPOTENT = 77  # an idempotent producer: a producer id, never transactional


@dataclass
class Record:
    offset: int
    value: bytes
    producer: int  # -1: a plain producer
    txn: int | None  # which transaction wrote it (None: not transactional)


@dataclass
class Batch:
    base: int
    last: int
    producer: int
    transactional: bool
    marker: int | None  # 0 abort, 1 commit (a control batch), None for data
    codec: int
    records: list[Record] = field(default_factory=list)
    raw: bytes = b""


@dataclass
class Log:
    batches: list[Batch]
    outcome: dict[int, str]  # txn -> "commit" | "abort" | "open"
    first: dict[int, int]  # txn -> its first offset
    ended: dict[int, int]  # txn -> its marker's offset

    @property
    def end(self) -> int:
        return self.batches[-1].last + 1 if self.batches else 0

    @property
    def lso(self) -> int:
        opened = [self.first[t] for t, how in self.outcome.items() if how == "open"]
        return min(opened, default=self.end)


_step = st.tuples(
    st.sampled_from(["plain", "idempotent", "data", "data", "data", "commit", "abort", "abort"]),
    st.sampled_from(PRODUCERS),
    st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=6),  # offset steps (> 1: compacted)
    st.integers(min_value=0, max_value=3),  # gap before the batch (compaction)
    st.sampled_from([0, 0, 1, 2, 3, 4]),
)


def _log(steps: list, ending: list[tuple[int, str]]) -> list:
    """``steps``, then the markers of ``ending``: ``(producer, "commit" | "abort" | "open")`` (a
    producer without an open transaction by then is passed over)."""
    return [*steps, *((how, producer, [1], 0, 0) for producer, how in ending if how != "open")]


_ending = st.lists(st.tuples(st.sampled_from(PRODUCERS), st.sampled_from(["commit", "abort", "abort", "open"])))


def _write(steps: list) -> Log:
    """The partition's log the steps describe, with every batch encoded."""
    batches: list[Batch] = []
    open_txn: dict[int, int] = {}
    outcome: dict[int, str] = {}
    first: dict[int, int] = {}
    ended: dict[int, int] = {}
    offset = 0
    sequence = 0
    for kind, producer, steps_, gap, codec in steps:
        offset += gap
        if kind in ("commit", "abort"):
            if producer not in open_txn:
                continue
            txn = open_txn.pop(producer)
            outcome[txn] = kind
            ended[txn] = offset
            batch = Batch(offset, offset, producer, True, 1 if kind == "commit" else 0, 0)
            batch.raw = _control(batch)
            batches.append(batch)
            offset += 1
            continue
        pid, transactional, txn = -1, False, None
        if kind == "idempotent":
            pid = IDEMPOTENT
        elif kind == "data":
            pid, transactional = producer, True
            if producer not in open_txn:
                open_txn[producer] = len(outcome)
                outcome[len(outcome)] = "open"
                first[open_txn[producer]] = offset
            txn = open_txn[producer]
        records = []
        at = offset
        for i, step in enumerate(steps_):
            records.append(Record(at, b"%d:%d" % (sequence, i), pid, txn))
            if i < len(steps_) - 1:
                at += step
        sequence += 1
        batch = Batch(offset, at, pid, transactional, None, codec, records)
        batch.raw = _data(batch)
        batches.append(batch)
        offset = at + 1
    return Log(batches, outcome, first, ended)


def _data(batch: Batch) -> bytes:
    pid = batch.producer
    builder = DefaultRecordBatchBuilder(
        2, batch.codec, batch.transactional, pid, 0 if pid >= 0 else -1, 0 if pid >= 0 else -1, 1 << 30
    )
    for record in batch.records:
        builder.append(record.offset - batch.base, 1_700_000_000_000, None, record.value, [])
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, batch.base)
    return bytes(buf)


def _control(batch: Batch) -> bytes:
    """A marker as a broker writes it: a transactional control batch of one record whose key is
    ``(version 0, type)`` and whose value is ``(version 0, coordinator epoch)``."""
    builder = DefaultRecordBatchBuilder(2, 0, True, batch.producer, 0, -1, 1 << 30)
    builder.append(0, 1_700_000_000_000, struct.pack(">hh", 0, batch.marker), struct.pack(">hi", 0, 5), [])
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, batch.base)
    (attributes,) = struct.unpack_from(">h", buf, 21)
    struct.pack_into(">h", buf, 21, attributes | 0x20)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def _fetch(log: Log, offset: int, most: int) -> tuple[bytes, list[tuple[int, int]], int]:
    """A model broker's ``read_committed`` answer at ``offset``: whole batches from the one that
    holds ``offset``, at most ``most`` of them, none at or past the last stable offset; the
    aborted transactions that meet ``[offset, last stable offset)``; the last stable offset."""
    lso = log.lso
    chosen = [b for b in log.batches if b.last >= offset and b.base < lso][:most]
    aborted = [
        (_producer_of(log, t), log.first[t])
        for t, how in log.outcome.items()
        if how == "abort" and log.ended[t] >= offset and log.first[t] < lso
    ]
    return b"".join(b.raw for b in chosen), aborted, lso


def _producer_of(log: Log, txn: int) -> int:
    return next(r.producer for b in log.batches for r in b.records if r.txn == txn)


def _truth(log: Log, start: int, stop: int) -> list[tuple[int, bytes]]:
    """What the producers committed in ``[start, stop)``, record by record."""
    return [
        (r.offset, r.value)
        for b in log.batches
        for r in b.records
        if start <= r.offset < stop and (r.txn is None or log.outcome[r.txn] == "commit")
    ]


def _protocol(log: Log, fetches: list[tuple[int, list[tuple[int, int]]]], stop: int) -> list[tuple[int, bytes]]:
    """The protocol's rule applied to each record of each fetch on its own (see the module doc)."""
    kept = []
    for (start, aborted), (end, _) in zip(fetches, [*fetches[1:], (stop, [])][: len(fetches)], strict=True):
        for b in log.batches:
            for r in b.records:
                if not start <= r.offset < end:
                    continue
                if b.transactional and any(
                    pid == b.producer
                    and first <= r.offset
                    and not any(m.marker == 0 and m.producer == pid and first <= m.base < r.offset for m in log.batches)
                    for pid, first in aborted
                ):
                    continue
                kept.append((r.offset, r.value))
    return kept


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_step, min_size=1, max_size=40),
    _ending,
    st.integers(min_value=0, max_value=60),
    st.integers(min_value=1, max_value=5),
)
def test_read_committed_keeps_exactly_the_committed_records(steps: list, ending: list, start: int, most: int) -> None:
    log = _write(_log(steps, ending))
    lso = log.lso
    start = min(start, lso)
    # The fetcher's loop: fetch at the position, parse, continue where the batches end.
    position, got, fetches = start, [], []
    while position < lso:
        buf, aborted, _ = _fetch(log, position, most)
        if not buf:  # a compaction gap right below an open transaction: nothing to read until it ends
            assert not any(position <= r.offset < lso for b in log.batches for r in b.records)
            lso = position
            break
        fetches.append((position, aborted))
        (parsed,) = parse_many([(buf, lso)], aborted=[aborted])
        got += [(int(o), parsed.values[i]) for i, o in enumerate(parsed.offsets) if o >= start]
        assert parsed.next_offset is not None and parsed.next_offset > position, "a fetch must make progress"
        position = parsed.next_offset
    assert position == lso, "dropped batches and markers take their offsets: the read ends on the LSO"
    truth = _truth(log, start, lso)
    assert _protocol(log, fetches, lso) == truth, "the two references disagree: the model broker is wrong"
    assert got == truth


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_step, min_size=1, max_size=30))
def test_read_uncommitted_keeps_every_data_record_and_no_marker(steps: list) -> None:
    log = _write(steps)
    buf = b"".join(b.raw for b in log.batches)
    parsed = parse(buf)
    assert [(int(o), parsed.values[i]) for i, o in enumerate(parsed.offsets)] == [
        (r.offset, r.value) for b in log.batches for r in b.records
    ]
    assert parsed.next_offset == (log.end if log.batches else None)


def test_an_aborted_range_ends_at_the_abort_marker_and_the_producer_commits_after_it() -> None:
    # producer 1: aborted [0, 1], abort marker 2, committed 3, commit marker 4; producer 2 plain-committed.
    log = _write(
        [
            ("data", 1, [1, 1], 0, 0),
            ("abort", 1, [1], 0, 0),
            ("data", 1, [1], 0, 0),
            ("data", 2, [1], 0, 0),
            ("commit", 1, [1], 0, 0),
            ("commit", 2, [1], 0, 0),
        ]
    )
    buf, aborted, lso = _fetch(log, 0, 10)
    assert aborted == [(1, 0)] and lso == log.end == 7
    (parsed,) = parse_many([(buf, None)], aborted=[aborted])
    assert parsed.offsets.tolist() == [3, 4] and parsed.next_offset == 7
