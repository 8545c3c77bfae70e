"""KafkaSource against a real broker (embedded Tansu): probe, splits, exact reads, commit.

Every count is checked against an independent one: the broker's own delivery coordinates
returned to the producer.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import signal
import time
from collections import Counter

import pyarrow as pa
import pytest

from reclock.demo.broker import EmbeddedBroker
from reclock.errors import ConfigError, DefiniteSourceError, TransientError
from reclock.sources.base import ERRORS, RecordError
from reclock.sources.kafka import KafkaSource, KafkaSplit, SourceTimeout, output_name_for
from reclock.sources.kafka.fetcher import Fetcher, lease
from reclock.sources.kafka.reader import read_splits
from reclock.timeline.frontier import Frontier, encode_partition
from tests.waiting import PATIENCE_S, returned

SCHEMA = pa.schema([("id", pa.int64())])


def _source(broker: EmbeddedBroker, **kwargs) -> KafkaSource:
    kwargs.setdefault("read_timeout_s", 5.0)
    return KafkaSource(broker.bootstrap, **kwargs)


def _read_all(source: KafkaSource, splits) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for split in splits:
        for output, batch in source.read(split):
            out.setdefault(output, []).extend(batch.to_pylist())
    return out


def _offsets(rows: list[dict]) -> list[tuple[str, int]]:
    return [(r["_partition"], r["_offset"]) for r in rows]


def _values(n: int, start: int = 0) -> list[bytes]:
    return [json.dumps({"id": i}).encode() for i in range(start, start + n)]


# -- exact ranges -------------------------------------------------------------------------------


def test_read_returns_exactly_the_split_range_even_when_it_starts_mid_batch(broker, topic, produce):
    name = topic()
    for chunk in range(4):  # four producer batches of five records each
        produce.send(name, _values(5, 5 * chunk))
    source = _source(broker, topics=[name], format="json", schema=SCHEMA)
    out = _read_all(source, [KafkaSplit((name, 0), 3, 13)])
    assert [r["_offset"] for r in out[output_name_for(name)]] == list(range(3, 13))
    assert [r["id"] for r in out[output_name_for(name)]] == list(range(3, 13))
    assert _read_all(source, [KafkaSplit((name, 0), 7, 8)])[output_name_for(name)][0]["id"] == 7
    assert _read_all(source, [KafkaSplit((name, 0), 19, 20)])[output_name_for(name)][0]["id"] == 19


def test_read_of_the_same_split_is_replayable(broker, topic, produce):
    name = topic(partitions=2)
    produce.send(name, _values(40), partition=lambda i: i % 2)
    source = _source(broker, topics=[name], format="json", schema=SCHEMA)
    splits = source.splits(Frontier(), source.upper())
    assert _read_all(source, splits) == _read_all(source, splits)


def test_a_short_read_does_not_decode_the_rest_of_a_long_fetch(broker, topic, produce):
    """A fetch returns whole batches, far past a short split's end (Tansu sends the whole log up to
    its limit whatever the partition's byte budget); parsing them all would make every short split
    as slow as reading the partition. Counted, not timed: the parser's work is deterministic."""
    name = topic()
    produce.send(name, _values(30_000))
    source = _source(broker, topics=[name], format="json", schema=SCHEMA)

    def parsed(end: int) -> int:
        split = KafkaSplit((name, 0), 0, end)
        with lease(source._clients, time.monotonic() + PATIENCE_S) as client:
            fetcher = Fetcher(client, source._clients, [(split.partition, 0, end)], keys=False, headers=False)
            reading = read_splits(
                [split],
                source._routing,
                source._clients,
                flush_rows=50_000,
                on_offset_lost="fail",
                on_record_error="skip",
                fetcher=fetcher,
            )
            assert sum(b.num_rows for _, b in reading) == end
            return fetcher.records_parsed

    whole = parsed(30_000)
    assert whole == 30_000
    assert parsed(20) < whole / 20  # a batch or two of the producer's (it batches ~16 KiB)


def test_read_flushes_bounded_batches(broker, topic, produce):
    name = topic()
    produce.send(name, _values(30))
    source = _source(broker, topics=[name], format="json", schema=SCHEMA)
    source.flush_rows = 7
    sizes = [b.num_rows for s in source.splits(Frontier(), source.upper()) for _, b in source.read(s)]
    assert sum(sizes) == 30 and max(sizes) <= 7 + 30 % 7  # a poll may overshoot by at most one chunk
    assert len(sizes) >= 3


# -- the probe ----------------------------------------------------------------------------------


def test_upper_reports_every_produced_record_on_tansu(broker, topic, produce):
    name = topic(partitions=3)
    delivered = produce.send(name, _values(237), partition=lambda i: i % 3)
    expected = Counter((t, p) for t, p, _ in delivered)
    source = _source(broker, topics=[name])
    deadline = time.monotonic() + PATIENCE_S
    upper = source.upper()
    while any(upper.offset(p) < n for p, n in expected.items()) and time.monotonic() < deadline:
        upper = source.upper()
    assert {p: upper.offset(p) for p in expected} == dict(expected)
    # ListOffsets(LATEST) is wrong on Tansu (last batch base + 1); the probe must not use it.
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    listed = consumer.end_offsets([TopicPartition(name, p) for p in range(3)])
    consumer.close()
    print("end_offsets on this broker:", {tp.partition: o for tp, o in listed.items()}, "true:", dict(expected))


def test_upper_never_regresses_and_grows_with_new_records(broker, topic, produce):
    name = topic()
    source = _source(broker, topics=[name])
    assert source.upper() == Frontier()  # an empty partition is at offset 0
    produce.send(name, _values(3))
    first = source.upper()
    assert first == Frontier({(name, 0): 3})
    produce.send(name, _values(4))
    second = source.upper()
    assert first.less_equal(second) and second.offset((name, 0)) == 7
    assert source.upper() == second


def test_repeated_probes_of_many_partitions_answer_promptly_and_see_every_new_record(broker, topic, produce):
    """Each probe must hear from every partition again, not only the first time: records arriving
    between probes are seen at once, and a probe never waits out its deadline on a quiet partition.
    (kafka-python parks the fetch of a paused partition; the probe must not rely on ``pause``.)"""
    names = [topic(partitions=4), topic(partitions=3)]
    source = _source(broker, topics=names, read_timeout_s=10 * PATIENCE_S)  # a probe that waits it out hangs
    delivered: list[tuple[str, int, int]] = []
    for round_ in range(6):
        if round_ % 2 == 0:  # every other probe finds nothing new
            for name, partitions in zip(names, (4, 3), strict=True):
                delivered += produce.send(name, _values(40), partition=lambda i, n=partitions: i % n)
        upper = returned(source.upper, f"probe {round_}")
        assert {p: upper.offset(p) for p in upper.partitions()} == dict(Counter((t, p) for t, p, _ in delivered))
    source.close()


def test_splits_and_reads_give_every_offset_exactly_once_across_topics(broker, topic, produce):
    names = [topic(partitions=4), topic(partitions=4)]
    delivered = []
    source = _source(broker, topics=names, format="json", schema=SCHEMA, max_split_offsets=17)
    lower = Frontier()
    seen: list[tuple[str, int]] = []
    for round_ in range(2):  # two batches, records produced in between
        for n, name in enumerate(names):
            delivered += produce.send(name, _values(150, 1000 * n + 500 * round_), partition=lambda i: (i * 7) % 4)
        upper = source.upper()
        splits = source.splits(lower, upper)
        assert all(s.end - s.start <= 17 for s in splits)
        out = _read_all(source, splits)
        for name in names:
            seen += _offsets(out[output_name_for(name)])
        lower = upper
    expected = sorted((encode_partition((t, p)), o) for t, p, o in delivered)
    assert Counter(seen) == Counter(expected)  # each offset exactly once
    assert len(seen) == 600


def test_pattern_discovers_a_topic_created_while_running(broker, topic, produce):
    prefix = f"disc{time.monotonic_ns() % 10**8}"
    first = topic(name=f"{prefix}-a")
    topic(name=f"other{prefix}")  # does not match
    produce.send(first, _values(5))
    source = _source(broker, pattern=rf"{prefix}-.*", format="json", schema=SCHEMA)
    (output,) = source.outputs()
    upper = source.upper()
    assert set(upper.partitions()) == {(first, 0)}
    second = topic(name=f"{prefix}-b", partitions=2)
    produce.send(second, _values(6), partition=lambda i: i % 2)
    later = source.upper()
    # The new topic joins with everything it already holds, at once.
    assert later == Frontier({(first, 0): 5, (second, 0): 3, (second, 1): 3})
    rows = _read_all(source, source.splits(upper, later))[output.name]
    assert sorted(r["id"] for r in rows) == list(range(6))


# -- start positions ----------------------------------------------------------------------------


def test_start_earliest_latest_and_explicit_offsets(broker, topic, produce):
    name = topic()
    produce.send(name, _values(5))
    out = output_name_for(name)

    earliest = _source(broker, topics=[name], format="json", schema=SCHEMA)
    assert [r["id"] for r in _read_all(earliest, earliest.splits(Frontier(), earliest.upper()))[out]] == [0, 1, 2, 3, 4]

    latest = _source(broker, topics=[name], format="json", schema=SCHEMA, start="latest")
    first = latest.upper()
    assert latest.splits(Frontier(), first) == []  # what existed at the first probe is skipped
    produce.send(name, _values(3, 5))
    second = latest.upper()
    assert [r["id"] for r in _read_all(latest, latest.splits(first, second))[out]] == [5, 6, 7]

    explicit = _source(broker, topics=[name], format="json", schema=SCHEMA, start={(name, 0): 6})
    assert [r["id"] for r in _read_all(explicit, explicit.splits(Frontier(), explicit.upper()))[out]] == [6, 7]
    # The start position applies only to a partition the lower frontier never advanced.
    assert explicit.splits(Frontier({(name, 0): 2}), Frontier({(name, 0): 4}))[0].start == 2


def test_start_timestamp_includes_every_record_at_or_after_it(broker, topic, produce):
    name = topic()
    produce.send(name, _values(3), timestamp_ms=1_000_000)
    produce.send(name, _values(3, 3), timestamp_ms=2_000_000)
    source = _source(broker, topics=[name], format="json", schema=SCHEMA, start={"timestamp": 1_500_000})
    ids = [r["id"] for r in _read_all(source, source.splits(Frontier(), source.upper()))[output_name_for(name)]]
    # Kafka answers offset 3; Tansu's offsets_for_times always answers 0 (all six records).
    assert ids[-3:] == [3, 4, 5] and ids in ([3, 4, 5], [0, 1, 2, 3, 4, 5])


# -- markers, lost offsets, bad records ---------------------------------------------------------


def test_transaction_commit_marker_takes_an_offset_and_reads_still_finish(broker, topic, produce):
    from kafka import KafkaProducer

    name = topic()
    tx = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"tx-{name}")
    tx.init_transactions()
    tx.begin_transaction()
    for v in _values(3):
        tx.send(name, v, partition=0)
    tx.flush()
    tx.commit_transaction()
    tx.close()
    after = produce.send(name, _values(2, 3))
    assert [o for _, _, o in after] == [4, 5]  # offset 3 is the commit marker
    source = _source(broker, topics=[name], format="json", schema=SCHEMA)
    upper = source.upper()
    assert upper == Frontier({(name, 0): 6})
    rows = _read_all(source, source.splits(Frontier(), upper))[output_name_for(name)]
    assert [(r["_offset"], r["id"]) for r in rows] == [(0, 0), (1, 1), (2, 2), (4, 3), (5, 4)]
    # A range that ends on the marker completes on position, not on a record count.
    assert [r["_offset"] for r in _read_all(source, [KafkaSplit((name, 0), 2, 4)])[output_name_for(name)]] == [2]
    assert [r["_offset"] for r in _read_all(source, [KafkaSplit((name, 0), 3, 5)])[output_name_for(name)]] == [4]
    assert _read_all(source, [KafkaSplit((name, 0), 3, 4)]) == {}  # only the marker: nothing, but it finishes


class _RetainedSource(KafkaSource):
    """Tansu cannot delete records (delete_records panics, retention never runs), so this test
    double reports a raised low watermark; the data and every other call are the real broker's."""

    low = 4

    def _low_watermarks(self, partitions, consumer=None):
        return {p: self.low for p in partitions}


def test_offset_below_the_low_watermark_is_a_definite_error_naming_partition_and_offsets(broker, topic, produce):
    name = topic()
    produce.send(name, _values(10))
    source = _RetainedSource(broker.bootstrap, topics=[name], format="json", schema=SCHEMA, start={(name, 0): 1})
    with pytest.raises(DefiniteSourceError) as info:
        source.splits(Frontier(), source.upper())
    message = str(info.value)
    assert f"{name}[0]" in message and "offset 1" in message and "low watermark 4" in message
    # The same holds for a resume frontier that fell behind retention.
    earliest = _RetainedSource(broker.bootstrap, topics=[name], format="json", schema=SCHEMA)
    with pytest.raises(DefiniteSourceError):
        earliest.splits(Frontier({(name, 0): 2}), Frontier({(name, 0): 10}))
    # start="earliest" means "from the low watermark": nothing is lost.
    assert [s.start for s in earliest.splits(Frontier(), earliest.upper())] == [4]


def test_offset_lost_skip_reports_the_skipped_range_to_errors(broker, topic, produce):
    name = topic()
    produce.send(name, _values(10))
    source = _RetainedSource(
        broker.bootstrap, topics=[name], format="json", schema=SCHEMA, on_offset_lost="skip", max_split_offsets=3
    )
    splits = source.splits(Frontier({(name, 0): 1}), Frontier({(name, 0): 10}))
    assert splits[0] == KafkaSplit((name, 0), 4, 7, lost_from=1)
    assert all(s.lost_from is None for s in splits[1:])
    out = _read_all(source, splits)
    assert [r["_offset"] for r in out[output_name_for(name)]] == list(range(4, 10))
    (lost,) = out[ERRORS]
    assert lost["kind"] == "offset_lost" and lost["_offset"] == 1 and "[1, 4)" in lost["message"]
    # Entirely lost: an empty split that only reports.
    source.low = 20
    (only,) = source.splits(Frontier({(name, 0): 2}), Frontier({(name, 0): 10}))
    assert (only.start, only.end, only.lost_from) == (10, 10, 2)
    assert list(_read_all(source, [only])) == [ERRORS]


def test_bad_records_go_to_errors_with_coordinates_or_fail_the_read(broker, topic, produce):
    name = topic()
    produce.send(name, [b'{"id": 1}', b"garbage", b'{"id": "x"}', b'{"id": 4}'])
    skip = _source(broker, topics=[name], format="json", schema=SCHEMA, on_record_error="skip")
    out = _read_all(skip, skip.splits(Frontier(), skip.upper()))
    assert [r["id"] for r in out[output_name_for(name)]] == [1, 4]
    assert [(r["_partition"], r["_offset"], r["raw"]) for r in out[ERRORS]] == [
        (encode_partition((name, 0)), 1, b"garbage"),
        (encode_partition((name, 0)), 2, b'{"id": "x"}'),
    ]
    fail = _source(broker, topics=[name], format="json", schema=SCHEMA, on_record_error="fail")
    with pytest.raises(RecordError, match=rf"{re.escape(name)}\[0\]@1"):
        _read_all(fail, fail.splits(Frontier(), fail.upper()))


def test_the_fail_policy_names_the_first_bad_record_whether_its_value_or_its_key_is_bad(broker, topic, produce):
    name = topic()
    # Offset 0's value has a wrong type, offset 1's is no object: a cheaper check finds 1 first.
    produce.send(name, [b'{"id": "x"}', b"null", b'{"id": 2}'])
    fail = _source(broker, topics=[name], format="json", schema=SCHEMA, on_record_error="fail")
    with pytest.raises(RecordError, match=rf"{re.escape(name)}\[0\]@0 could not be decoded"):
        _read_all(fail, fail.splits(Frontier(), fail.upper()))
    keyed = topic()
    produce.send(keyed, [b'{"id": 1}', b"null"], keys=[b"\xff", b"k"])  # offset 0: a text key that is not UTF-8
    options = {"format": "json", "schema": SCHEMA, "metadata": ["key"], "key_format": "text"}
    fail = _source(broker, topics=[keyed], on_record_error="fail", **options)
    first = rf"{re.escape(keyed)}\[0\]@0 could not be decoded \(decode\): invalid UTF-8 key"
    with pytest.raises(RecordError, match=first):
        _read_all(fail, fail.splits(Frontier(), fail.upper()))


def test_metadata_columns_carry_key_headers_and_timestamp(broker, topic, produce):
    name = topic()
    produce.send(
        name,
        [b"a", b"b", b"c"],
        keys=[b"k1", None, b"\xff"],
        headers=[[("h", b"v")], [], []],
        timestamp_ms=1_700_000_000_000,
    )
    source = _source(
        broker,
        topics=[name],
        format="text",
        metadata={"key": "k", "headers": "headers", "timestamp": "ts", "topic": "topic", "partition": "part"},
        key_format="text",
    )
    (output,) = source.outputs()
    assert output.schema.names == ["value", "k", "headers", "ts", "topic", "part"]
    out = _read_all(source, source.splits(Frontier(), source.upper()))
    rows = out[output.name]
    assert [r["k"] for r in rows] == ["k1", None]
    assert [(r["_offset"], r["raw"]) for r in out[ERRORS]] == [(2, b"c")]  # a text key that is not UTF-8
    assert rows[0]["headers"] == [{"key": "h", "value": b"v"}] and rows[1]["headers"] == []
    assert rows[0]["ts"].timestamp() == 1_700_000_000 and rows[0]["topic"] == name and rows[0]["part"] == 0


# -- commit, secrets, pickling ------------------------------------------------------------------


def test_commit_writes_the_frontier_to_the_consumer_group(broker, topic, produce, admin):
    name = topic(partitions=2)
    produce.send(name, _values(9), partition=lambda i: i % 2)
    group = f"group-{name}"
    source = _source(broker, topics=[name], group_id=group)
    upper = source.upper()
    source.commit(upper)
    committed = admin.list_group_offsets(group)[group]
    assert {(tp.topic, tp.partition): m.offset for tp, m in committed.items()} == {(name, 0): 5, (name, 1): 4}
    source.commit(Frontier({(name, 0): 6, ("not-ours", 0): 3}))
    committed = admin.list_group_offsets(group)[group]
    assert {(tp.topic, tp.partition): m.offset for tp, m in committed.items()} == {(name, 0): 6, (name, 1): 4}
    source.close()


def test_commit_failure_is_logged_never_raised(caplog):
    source = KafkaSource("127.0.0.1:1", topics=["t"], group_id="g", read_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="reclock.sources.kafka"):
        source.commit(Frontier({("t", 0): 5}))
    assert "commit" in caplog.text and "failed" in caplog.text


def test_client_settings_never_appear_in_repr_or_logs(broker, topic, produce, caplog):
    secret = "hunter2-SECRET-sasl-password"
    name = topic()
    produce.send(name, [b"x"])
    settings = {"sasl_plain_username": "reclock", "sasl_plain_password": secret, "sasl_mechanism": "PLAIN"}
    caplog.set_level(logging.DEBUG)
    source = _source(broker, topics=[name], group_id=f"g-{name}", client_settings=settings)
    assert secret not in repr(source) and secret not in str(source)
    assert "<redacted>" in repr(source)
    upper = source.upper()
    _read_all(source, source.splits(Frontier(), upper))
    source.commit(upper)
    dead = KafkaSource("127.0.0.1:1", topics=[name], group_id="g", client_settings=settings, read_timeout_s=1.0)
    dead.commit(upper)  # the failure path logs a warning
    with pytest.raises(ConfigError) as info:
        KafkaSource(broker.bootstrap, topics=[name], client_settings={**settings, "group_id": "x"})
    assert secret not in str(info.value)
    assert caplog.records and secret not in caplog.text
    assert all(secret not in str(r.args) for r in caplog.records)
    source.close()


def test_source_and_splits_are_picklable_and_drop_clients(broker, topic, produce):
    name = topic()
    produce.send(name, _values(4))
    source = _source(broker, topics=[name], format="json", schema=SCHEMA, group_id=f"g-{name}")
    upper = source.upper()
    source.commit(upper)
    source._low_watermarks([(name, 0)])  # opens the long-lived driver client
    assert source._probe_client is not None and source._commit_client is not None
    clone = pickle.loads(pickle.dumps(source))
    assert clone._probe_client is None and clone._commit_client is None
    splits = pickle.loads(pickle.dumps(source.splits(Frontier(), upper)))
    assert [r["id"] for r in _read_all(clone, splits)[output_name_for(name)]] == [0, 1, 2, 3]
    source.close()


def test_deleted_topic_is_a_definite_error(broker, topic, produce, admin):
    name = topic()
    produce.send(name, [b"x"])
    source = _source(broker, topics=[name])
    source.upper()
    admin.delete_topics([name])
    deadline = time.monotonic() + PATIENCE_S
    with pytest.raises(DefiniteSourceError, match="deleted"):
        while time.monotonic() < deadline:
            source.upper()
            time.sleep(0.1)


# -- a broker that stops answering ----------------------------------------------------------------


@pytest.mark.kafka  # a broker of its own, paused
def test_paused_broker_makes_read_and_upper_time_out_with_a_retryable_error():
    with EmbeddedBroker() as own:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=own.bootstrap)
        admin.create_topics([NewTopic("paused", 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=own.bootstrap)
        for v in _values(20):
            producer.send("paused", v, partition=0)
        producer.flush()
        producer.close()
        source = KafkaSource(own.bootstrap, topics=["paused"], read_timeout_s=1.5)
        upper = source.upper()
        (split,) = source.splits(Frontier(), upper)
        own.pause()
        try:
            # How soon each gives up (its read_timeout_s, not kafka-python's own 10 s wait for a new
            # connection's first answer) is measured in benchmarks/scenarios/kafka_timeouts.py;
            # here, that each gives up at all, with the retryable error that names its wait.
            for attempt, said in (
                (lambda: list(source.read(split)), r"made no progress for 1\.5s at offset 0"),
                (source.upper, r"cannot reach the brokers"),
            ):
                with pytest.raises(SourceTimeout, match=said) as info:
                    returned(attempt, "a read of a paused broker")
                assert isinstance(info.value, TransientError)
        finally:
            own.resume()
        assert sum(b.num_rows for _, b in source.read(split)) == 20
        assert source.upper() == upper
        # Paused in the middle of a read, with the consumer already connected.
        source.flush_rows = 5
        reading = source.read(KafkaSplit(("paused", 0), 0, 25))  # 5 more than exist: must fetch again
        assert next(reading)[1].num_rows == 5
        own.pause()
        try:
            with pytest.raises(SourceTimeout, match=r"no progress for 1\.5s at offset 20"):
                returned(lambda: list(reading), "a read paused in its middle")
        finally:
            own.resume()
        source.close()


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "topics"),
        ({"topics": ["a"], "pattern": "a.*"}, "topics"),
        ({"topics": "a"}, "topics"),
        ({"pattern": "("}, "pattern"),
        ({"topics": ["a"], "format": "xml"}, "outputs.a.format"),
        ({"topics": ["a"], "format": "json"}, "outputs.a.format.schema"),
        ({"topics": ["a"], "start": "middle"}, "start"),
        ({"topics": ["a"], "start": {("a", 0): -1}}, 'start.["a",0]'),
        ({"topics": ["a"], "start": {"timestamp": "now"}}, "start.timestamp"),
        ({"topics": ["a"], "on_record_error": "ignore"}, "on_record_error"),
        ({"topics": ["a"], "on_offset_lost": "maybe"}, "on_offset_lost"),
        ({"topics": ["a"], "client_settings": {"enable_auto_commit": True}}, "client_settings.enable_auto_commit"),
        ({"topics": ["a"], "client_settings": {"no_such_setting": 1}}, "client_settings.no_such_setting"),
        ({"topics": ["a"], "metadata": ["colour"]}, "outputs.a.metadata"),
        ({"topics": ["a"], "max_split_offsets": 0}, "max_split_offsets"),
        ({"topics": ["a"], "read_timeout_s": 0}, "read_timeout_s"),
        ({"topics": ["a"], "outputs": {"x": {"topics": ["b"]}}}, "outputs"),
        ({"topics": ["a"], "outputs": {"x": {"topics": ["a"], "colour": 1}}}, "outputs.x.colour"),
        ({"topics": ["a.b", "a_b"]}, "outputs"),
    ],
)
def test_invalid_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as info:
        KafkaSource("127.0.0.1:9092", **kwargs)
    assert info.value.field == field


def test_outputs_route_topics_by_name_and_pattern():
    source = KafkaSource(
        "127.0.0.1:9092",
        pattern=r"shop\..*",
        outputs={
            "orders": {"topics": ["shop.orders"], "format": "json", "schema": {"id": "int64"}, "key": ["id"]},
            "events": {"pattern": r"shop\.ev-.*", "format": "text"},
            "rest": {},
        },
    )
    assert [o.name for o in source.outputs()] == ["orders", "events", "rest"]
    assert source._route("shop.orders").name == "orders"
    assert source._route("shop.ev-1").name == "events"
    assert source._route("shop.misc").name == "rest"
    assert source.outputs()[0].key == ("id",)
    assert output_name_for("Shop.Orders-v2") == "shop_orders_v2" and output_name_for("9lives") == "t_9lives"


# -- the embedded broker --------------------------------------------------------------------------


@pytest.mark.kafka  # a broker of its own, that cannot start
def test_broker_that_cannot_start_fails_fast_with_its_log_tail():
    import socket

    from reclock.demo.broker import BrokerError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = EmbeddedBroker(port=taken.getsockname()[1], startup_timeout_s=10 * PATIENCE_S)
        with pytest.raises(BrokerError, match="Address in use"):  # said at once, not after its timeout
            returned(broker.start, "the broker's start")


def test_broker_stop_ends_its_own_process_even_with_clients_connected(broker):
    import os

    from kafka import KafkaProducer

    own = EmbeddedBroker().start()
    pid = own.pid
    producer = KafkaProducer(bootstrap_servers=own.bootstrap)
    producer.send("t", b"x").get(timeout=PATIENCE_S)
    process = own._proc
    returned(own.stop, "the broker's stop")
    # Tansu drains connected clients for about 5 s on SIGTERM; the stop does not wait that out but
    # SIGKILLs after its own second (how long it takes: benchmarks/scenarios/kafka_timeouts.py).
    assert process is not None and process.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    producer.close(timeout=PATIENCE_S)
    assert broker.running  # the session broker is untouched
