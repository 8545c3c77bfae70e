"""Transactions on the real (embedded Tansu) broker, written by confluent-kafka's transactional
producer: what the broker answers, and what ``read_committed`` makes of it.

Every check reads the broker's own answers with kafka-python's protocol classes and record
parser (no reclock code): the Fetch response's high watermark, last stable offset and aborted
transactions, and each batch's producer id and control flag. What Tansu does and does not do is
pinned in :func:`test_what_tansu_answers_about_transactions` (``docs/sources/kafka.md`` quotes
it); the aborted-transaction path it cannot exercise is pinned by
``tests/unit/test_kafka_transactions.py`` instead.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reclock.persist.lake import Lake
from reclock.sources.kafka import KafkaSource, output_name_for
from tests.cli import reclock_in_process
from tests.integration.helpers import write_config
from tests.waiting import run_until


@dataclass
class Batch:
    base: int
    last: int
    producer_id: int
    transactional: bool
    control: bool
    keys: list[bytes | None]
    values: list[bytes | None]

    @property
    def marker(self) -> str | None:
        """``"commit"`` or ``"abort"`` for a control batch (its record's key: version, type)."""
        if not self.control:
            return None
        return {0: "abort", 1: "commit"}[struct.unpack(">hh", self.keys[0])[1]]


@dataclass
class Answer:
    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[int, int]]
    batches: list[Batch]


class Raw:
    """Fetch and ListOffsets requests of our own, on a kafka-python client's connections."""

    def __init__(self, bootstrap: str) -> None:
        from kafka import KafkaConsumer

        self.client = KafkaConsumer(bootstrap_servers=bootstrap)

    def _send(self, topic: str, partition: int, request) -> object:
        from kafka import TopicPartition

        self.client.partitions_for_topic(topic)
        leader = self.client._client.cluster.leader_for_partition(TopicPartition(topic, partition))
        manager = self.client._client._manager
        return manager.run(lambda: manager.send(request, node_id=leader))

    def fetch(self, topic: str, partition: int, offset: int, *, committed: bool) -> Answer:
        from kafka.protocol.consumer import FetchRequest
        from kafka.record import MemoryRecords

        part = FetchRequest.FetchTopic.FetchPartition(
            partition=partition,
            current_leader_epoch=-1,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            partition_max_bytes=1 << 20,
        )
        request = FetchRequest(
            max_wait_ms=10,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=int(committed),
            session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])],
            forgotten_topics_data=[],
            rack_id="",
            min_version=4,
            max_version=12,
        )
        data = self._send(topic, partition, request).responses[0].partitions[0]
        assert data.error_code == 0, data
        batches = []
        records = MemoryRecords(bytes(data.records or b""))
        while (batch := records.next_batch()) is not None:
            found = list(batch)
            batches.append(
                Batch(
                    batch.base_offset,
                    batch.base_offset + batch.last_offset_delta,
                    batch.producer_id,
                    batch.is_transactional,
                    batch.is_control_batch,
                    [r.key for r in found],
                    [r.value for r in found],
                )
            )
        aborted = [(a.producer_id, a.first_offset) for a in data.aborted_transactions or []]
        return Answer(data.high_watermark, data.last_stable_offset, aborted, batches)

    def list_offsets(self, topic: str, partition: int, *, committed: bool) -> int:
        from kafka.protocol.consumer import ListOffsetsRequest

        request = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=int(committed),
            topics=[
                ListOffsetsRequest.ListOffsetsTopic(
                    name=topic,
                    partitions=[
                        ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=partition, current_leader_epoch=-1, timestamp=-1, max_num_offsets=1
                        )
                    ],
                )
            ],
            timeout_ms=1000,
            min_version=2,
        )
        answer = self._send(topic, partition, request).topics[0].partitions[0]
        assert answer.error_code == 0, answer
        return answer.offset

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def raw(broker) -> Iterator[Raw]:
    client = Raw(broker.bootstrap)
    yield client
    client.close()


def transactional(bootstrap: str, name: str):
    """A confluent-kafka transactional producer that sends only on flush (or commit): an abort
    before a flush leaves nothing in the log."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": name, "linger.ms": 5000, "logger": _quiet()}
    )
    producer.init_transactions(30)
    return producer


def _quiet():
    import logging

    log = logging.getLogger("tests.librdkafka")
    log.setLevel(logging.ERROR)
    return log


def _plain(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "logger": _quiet()})
    for v in values:
        producer.produce(topic, v, partition=partition)
    assert producer.flush(10) == 0


def _values(source: KafkaSource, upper, lower=None) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """What ``source`` reads of ``[lower, upper)``: ``partition -> [(offset, value)]``."""
    from reclock.timeline.frontier import Frontier

    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for split in source.splits(lower or Frontier({}), upper):
        for _, batch in source.read(split):
            rows = batch.to_pylist()
            out.setdefault(split.partition, []).extend((r["offset"], r["value"]) for r in rows)
    return out


def test_what_tansu_answers_about_transactions(broker, topic, raw):
    t = topic()
    a, b = transactional(broker.bootstrap, f"{t}-a"), transactional(broker.bootstrap, f"{t}-b")
    a.begin_transaction()
    for i in range(3):
        a.produce(t, b"a%d" % i, partition=0)
    a.flush(10)
    open_a = raw.fetch(t, 0, 0, committed=True)
    assert (open_a.high_watermark, open_a.last_stable_offset, open_a.batches) == (3, 0, [])
    assert raw.fetch(t, 0, 0, committed=False).batches[0].transactional
    a.commit_transaction(10)
    b.begin_transaction()
    for i in range(2):
        b.produce(t, b"b%d" % i, partition=0)
    b.flush(10)
    # A's commit marker took offset 3; B is open from offset 4.
    held = raw.fetch(t, 0, 0, committed=True)
    assert (held.high_watermark, held.last_stable_offset) == (6, 4)
    assert [(x.base, x.last, x.marker) for x in held.batches] == [(0, 2, None), (3, 3, "commit")]
    pid_a = held.batches[0].producer_id
    assert held.batches[1].producer_id == pid_a >= 0
    # Tansu's quirk: ListOffsets with isolation_level=1 answers 0 while a transaction is open (not
    # the LSO, 4); the Fetch response's last stable offset above is right, so the probe uses that.
    assert raw.list_offsets(t, 0, committed=True) == 0
    b.abort_transaction(10)  # flushed before the abort: B's records are in the log
    done = raw.fetch(t, 0, 0, committed=True)
    assert (done.high_watermark, done.last_stable_offset) == (7, 7)
    assert [(x.base, x.marker, x.values) for x in done.batches[2:]][::2] == [(4, None, [b"b0", b"b1"])]
    assert [(x.base, x.marker) for x in done.batches[3:]] == [(6, "abort")]
    # ...and the broker lists no aborted transaction, so no read_committed reader (reclock,
    # librdkafka, the Java client) can tell B's records from committed ones on Tansu.
    assert done.aborted == []
    assert raw.list_offsets(t, 0, committed=True) == 7
    # An abort before any flush sends nothing: the log is unchanged.
    b.begin_transaction()
    b.produce(t, b"never", partition=0)
    b.abort_transaction(10)
    assert raw.fetch(t, 0, 0, committed=False).high_watermark == 7


def test_the_upper_stops_at_an_open_transaction_and_moves_past_its_commit_marker(broker, topic, raw):
    t = topic(partitions=2)
    _plain(broker.bootstrap, t, [b"p%d" % i for i in range(5)])  # offsets 0-4
    producer = transactional(broker.bootstrap, f"{t}-x")
    producer.begin_transaction()
    for i in range(3):
        producer.produce(t, b"x%d" % i, partition=0)  # 5-7
    for i in range(2):
        producer.produce(t, b"y%d" % i, partition=1)  # 0-1
    producer.flush(10)
    _plain(broker.bootstrap, t, [b"q0", b"q1"])  # 8-9, after the open transaction
    committed = KafkaSource(broker.bootstrap, topics=[t], metadata=["offset"], open_transaction_warning_s=0)
    uncommitted = KafkaSource(broker.bootstrap, topics=[t], metadata=["offset"], isolation_level="read_uncommitted")
    try:
        upper = committed.upper()
        assert dict(upper.items()) == {(t, 0): 5}  # the LSO: partition 1 holds only the open transaction
        assert _values(committed, upper) == {(t, 0): [(i, b"p%d" % i) for i in range(5)]}
        assert dict(uncommitted.upper().items()) == {(t, 0): 10, (t, 1): 2}  # the high watermarks
        # Both partitions are held; the warning names the producer id the batches carry.
        pid = raw.fetch(t, 0, 5, committed=False).batches[0].producer_id
        assert raw.fetch(t, 1, 0, committed=False).batches[0].producer_id == pid
        warnings = committed.warnings()
        assert len(warnings) == 2, warnings
        assert f"{t}[0]" in warnings[0] and "offset at 5" in warnings[0] and "high watermark 10" in warnings[0]
        assert f"{t}[1]" in warnings[1] and "offset at 0" in warnings[1]
        assert all(f"producer id {pid}, epoch" in w for w in warnings)
        producer.commit_transaction(10)
        after = raw.fetch(t, 0, 0, committed=True)
        marker = after.batches[-1]
        assert (marker.marker, marker.base, after.last_stable_offset) == ("commit", 10, 11)
        later = committed.upper()
        assert dict(later.items()) == {(t, 0): 11, (t, 1): 3}  # past the markers
        assert _values(committed, later, upper) == {
            (t, 0): [(5, b"x0"), (6, b"x1"), (7, b"x2"), (8, b"q0"), (9, b"q1")],
            (t, 1): [(0, b"y0"), (1, b"y1")],
        }
        assert committed.warnings() == []
    finally:
        committed.close()
        uncommitted.close()


@pytest.mark.usefixtures("reclock_processes")
def test_status_warns_of_a_partition_an_open_transaction_holds(broker, topic, raw, tmp_path: Path):
    t = topic()
    _plain(broker.bootstrap, t, [json.dumps({"id": i}).encode() for i in range(3)])
    producer = transactional(broker.bootstrap, f"{t}-held")
    producer.begin_transaction()
    producer.produce(t, json.dumps({"id": 99}).encode(), partition=0)
    producer.flush(10)
    pid = raw.fetch(t, 0, 3, committed=False).batches[0].producer_id
    config = write_config(
        tmp_path / "held.toml",
        pipeline={"name": "held", "lake": "lake", "engine": "local", "batch_interval": 0.1},
        source={
            "kind": "kafka",
            "bootstrap_servers": broker.bootstrap,
            "topics": [t],
            "format": "json",
            "schema": {"id": "int64"},
            "open_transaction_warning_s": 0.5,
        },
    )
    lake = str(tmp_path / "lake")
    assert reclock_in_process("create", str(config)).returncode == 0
    warning = f"warning: held: kafka partition {t}[0]: an open transaction (producer id {pid}, epoch"
    run_until(  # the transaction stays open: the job runs until its status warns of it, then stops
        Lake.at(lake),
        "held",
        lambda: warning in reclock_in_process("--lake", lake, "status", "held").stdout,
        "the warning",
    )
    shown = reclock_in_process("--lake", lake, "status", "held")
    assert f"warning: held: kafka partition {t}[0]: an open transaction (producer id {pid}, epoch" in shown.stdout
    assert "offset at 3" in shown.stdout, shown.stdout
    row = json.loads(reclock_in_process("--lake", lake, "status", "held", "--json").stdout)[0]
    assert row["outputs"][output_name_for(t)][0] == 3  # the open transaction's record waits
    assert len(row["warnings"]) == 1
    producer.abort_transaction(10)


@pytest.mark.usefixtures("reclock_processes")
def test_a_killed_pipeline_over_concurrent_transactional_producers_lands_exactly_the_committed_records(
    broker, topic, tmp_path: Path, long_lane: bool
):
    """Acceptance 1 of issue 23, as far as Tansu lets it go (see :mod:`tests.faults.transactions`:
    the aborted records never reach Tansu, whose fetches list no aborted transaction; the unit
    differential test proves that path). 4 kills, 30 with ``--long``."""
    from tests.faults.transactions import PARTITIONS, Campaign, run_campaign

    campaign = Campaign(kills=30 if long_lane else 4)
    report = run_campaign(broker.bootstrap, topic(partitions=PARTITIONS), tmp_path, campaign)
    assert not report.problems, report.problems[:10]
    assert report.kills == campaign.kills
    assert report.committed_txns >= 5 and report.aborted_txns >= 3, report
    assert report.rows == report.committed_records > 0
    assert report.bindings > 0  # maintenance compacts the remap table: fewer rows than batches
