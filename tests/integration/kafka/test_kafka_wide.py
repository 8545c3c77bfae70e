"""Wide topics against a real broker (embedded Tansu): what a thousand small partitions cost.

The cost is measured where it is paid, in the broker process: its CPU time (``/proc/<pid>/stat``)
while the source probes, against its CPU time while the same topic is read whole. Record counts
are checked against the producer's delivery coordinates.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import pyarrow as pa

from reclock.sources.kafka import KafkaSource
from reclock.timeline.frontier import OFFSET, PARTITION, Frontier
from tests.waiting import PATIENCE_S

PARTITIONS = 1_000


def _broker_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the broker process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_first_probe_of_a_wide_topic_asks_for_ends_not_records(broker, topic, produce):
    """A first probe fetches each new partition from inside its last batch, which on a topic of
    small partitions is all of it: before the probe capped its response, the first probe of 1,000
    partitions made the broker send the whole topic, as much work as reading it."""
    name = topic(partitions=PARTITIONS)
    values = [json.dumps({"id": i, "pad": "x" * 80}).encode() for i in range(20 * PARTITIONS)]
    # A partition's records one after the other: the producer batches each partition whole, as
    # a topic of small partitions mostly is (round robin would make batches of one record here).
    delivered = produce.send(name, values, partition=lambda i: i // 20)
    expected = dict(Counter((t, p) for t, p, _ in delivered))
    source = KafkaSource(broker.bootstrap, topics=[name], format="json", schema=pa.schema([("id", pa.int64())]))
    try:
        before = _broker_cpu_s(broker.pid)
        upper = source.upper()
        probe_cpu = _broker_cpu_s(broker.pid) - before
        deadline = time.monotonic() + PATIENCE_S
        while any(upper.offset(p) < n for p, n in expected.items()) and time.monotonic() < deadline:
            upper = source.upper()
        assert {p: upper.offset(p) for p in expected} == expected
        splits = source.splits(Frontier(), upper)
        before = _broker_cpu_s(broker.pid)
        rows = sum(batch.num_rows for _, batch in source.read_group(splits))
        read_cpu = _broker_cpu_s(broker.pid) - before
    finally:
        source.close()
    assert rows == len(delivered)
    print(f"broker CPU: first probe {probe_cpu:.3f} s, reading the topic {read_cpu:.3f} s")
    assert probe_cpu * 4 < read_cpu, f"the first probe cost the broker {probe_cpu:.3f} s, reading {read_cpu:.3f} s"


def test_a_task_keeps_several_fetches_in_flight_to_one_leader(broker, topic, produce, monkeypatch):
    """One request in flight per leader, for all of a task's partitions, left the broker idle
    while each answer travelled and was parsed, and a big answer costs Tansu more than several
    small ones (0.81 s for 500 partitions in one request, 0.24 s in four pipelined). Counted on
    kafka-python's connection (requests written to the broker and not yet answered), not timed;
    the records must still come exactly once, in offset order, per partition."""
    from kafka.net.connection import KafkaConnection

    from reclock.sources.kafka.fetcher import FETCHES_IN_FLIGHT, SHARE_PARTITIONS

    partitions = 4 * SHARE_PARTITIONS  # four shares of a task's partitions, one request each
    name = topic(partitions=partitions)
    values = [json.dumps({"id": i, "pad": "x" * 80}).encode() for i in range(partitions * 5)]
    delivered = produce.send(name, values, partition=lambda i: i % partitions)
    expected = Counter((t, p) for t, p, _ in delivered)
    most: list[int] = [0]
    send = KafkaConnection.send_request

    def counting(self, request, *args, **kwargs):
        future = send(self, request, *args, **kwargs)
        if type(request).__name__.startswith("FetchRequest"):
            most[0] = max(most[0], len(self.in_flight_requests))
        return future

    source = KafkaSource(broker.bootstrap, topics=[name], format="json", schema=pa.schema([("id", pa.int64())]))
    try:
        upper = source.upper()
        deadline = time.monotonic() + PATIENCE_S
        while any(upper.offset(p) < n for p, n in expected.items()) and time.monotonic() < deadline:
            upper = source.upper()
        splits = source.splits(Frontier(), upper)
        monkeypatch.setattr(KafkaConnection, "send_request", counting)
        batches = [batch for _, batch in source.read_group(splits)]
    finally:
        source.close()
    rows = pa.Table.from_batches(batches).to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(len(values)))
    by_partition: dict[str, list[int]] = {}
    for row in rows:
        by_partition.setdefault(row[PARTITION], []).append(row[OFFSET])
    assert all(offsets == list(range(len(offsets))) for offsets in by_partition.values())
    print(f"at most {most[0]} fetch requests in flight on one connection")
    assert 2 <= most[0] <= FETCHES_IN_FLIGHT, f"at most {most[0]} fetch requests were in flight on a connection"


def test_a_probe_is_one_metadata_request_for_its_own_topics_and_one_fetch(broker, topic, produce, monkeypatch):
    """A probe made a fresh consumer (its bootstrap: a connection, API versions, metadata), asked
    for the metadata of every topic of the cluster (10,000-partition topics of other pipelines
    included, parsed in Python) after waiting out the client's retry backoff, and asked
    ``ListOffsets`` for a hint the capped fetch no longer needs; and a later probe, asking at the
    known ends, let the broker wait 100 ms for records. Counted on kafka-python's connections,
    by request: the first probe and the next one alike."""
    from kafka.net.connection import KafkaConnection

    name = topic(partitions=50)
    topic(partitions=500)  # another pipeline's topic on the same broker
    delivered = produce.send(name, [b"x"] * 200, partition=lambda i: i % 50)
    expected = dict(Counter((t, p) for t, p, _ in delivered))
    sent: list[object] = []
    send = KafkaConnection.send_request

    def recording(self, request, *args, **kwargs):
        sent.append(request)
        return send(self, request, *args, **kwargs)

    warm = KafkaSource(broker.bootstrap, topics=[name])
    warm.upper()  # the process's pool holds a read client from here on, as in a running pipeline
    warm.close()
    source = KafkaSource(broker.bootstrap, topics=[name])
    try:
        for _ in range(2):
            sent.clear()
            monkeypatch.setattr(KafkaConnection, "send_request", recording)
            upper = source.upper()
            monkeypatch.undo()
            asked = [r for r in sent if type(r).__name__ == "MetadataRequest"]
            kinds = Counter(type(r).__name__.removesuffix("Request") for r in sent if r not in asked)
            assert kinds == {"Fetch": 1}, kinds
            # The probe's one metadata request names its own topic; kafka-python may refresh its
            # cluster view on its own meanwhile (seen once under the suite's load), and that
            # refresh names no topic (never every topic, as the old probe's consumer asked).
            names = [None if r.topics is None else [t.name for t in r.topics] for r in asked]
            assert names.count([name]) == 1 and all(n in ([name], []) for n in names), names
            (fetch,) = [r for r in sent if type(r).__name__ == "FetchRequest"]
            assert fetch.max_wait_ms <= 1  # nothing new must not make the broker wait for records
        assert {p: upper.offset(p) for p in expected} == expected
    finally:
        source.close()
