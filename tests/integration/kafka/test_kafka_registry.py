"""Registry formats from a real broker (issue 23, acceptance 2): Avro, Protobuf and JSON Schema
topics written by confluent-kafka's own serializers, whose producer moves to a second schema
mid-stream, under each ``schema_evolution`` mode. Bad records ride along: an unknown schema id,
a payload that does not match its schema, a value without framing.

Every check is from outside: the ``_delta_log`` replayed by hand (tests.delta_log) against the
coordinates the broker acknowledged and the records the test sent. Each test has its own
registry stand-in (reclock.demo.registry) on a free port.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from typing import Any

import pytest

from reclock.demo.registry import RegistryStandIn
from reclock.job import lifecycle
from reclock.job.config import load_config
from reclock.persist.evolution import SchemaEvolutionError
from reclock.persist.lake import Lake
from reclock.persist.layout import OutputLayout
from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Settings
from reclock.sources.kafka import KafkaSource, output_name_for
from reclock.timeline.frontier import Frontier
from tests.delta_log import lake_file_schema_mismatches, replay
from tests.integration.helpers import write_config
from tests.integration.kafka.test_kafka_pipeline import _status
from tests.registry_payloads import (
    AVRO_V1,
    AVRO_V2,
    JSON_V1,
    JSON_V2,
    READER_V2,
    WRITER_V3,
    avro_serializer,
    client,
    expected_order,
    json_serializer,
    order_classes,
    order_message,
    protobuf_serializer,
)
from tests.tls import make_authority
from tests.waiting import PATIENCE_S

pytestmark = pytest.mark.kafka

V1_RECORDS = 40
V2_RECORDS = 30


@pytest.fixture
def registry():
    with RegistryStandIn() as running:
        yield running


class Stream:
    """One format's producer: version-1 and version-2 values, and what each row must read back."""

    def __init__(self, fmt: str, url: str, topic: str) -> None:
        self.format, self.topic = fmt, topic
        reg = client(url)
        if fmt == "avro":
            v1, v2 = avro_serializer(reg, AVRO_V1), avro_serializer(reg, AVRO_V2)
            self.v1 = lambda i: v1(topic, _avro_record(i))
            self.v2 = lambda i: v2(topic, {**_avro_record(i), "color": _color(i)})
        elif fmt == "json":
            j1, j2 = json_serializer(reg, JSON_V1), json_serializer(reg, JSON_V2)
            self.v1 = lambda i: j1(topic, _json_record(i))
            self.v2 = lambda i: j2(topic, {**_json_record(i), **({"color": _color(i)} if _color(i) else {})})
        else:
            c1, c2 = order_classes(1), order_classes(2)
            p1, p2 = protobuf_serializer(reg, c1["Order"]), protobuf_serializer(reg, c2["Order"])
            self.v1 = lambda i: p1(topic, order_message(c1, i))
            self.v2 = lambda i: p2(topic, order_message(c2, i, color=_color(i) or None))

    def reader_schema(self) -> dict[str, Any]:
        return {"version": 1, **({"message": "shop.Order"} if self.format == "protobuf" else {})}

    def expected(self, i: int) -> dict[str, Any]:
        if self.format == "avro":
            return {**_avro_record(i), "placed_at": _avro_record(i)["placed_at"] * 1000}
        if self.format == "json":
            return _json_record(i)
        return expected_order(i)

    def row(self, landed: dict[str, Any]) -> dict[str, Any]:
        """A landed row's payload columns, in the units of :meth:`expected`."""
        out = {k: v for k, v in landed.items() if not k.startswith("_") and k != "color"}
        if "placed_at" in out and out["placed_at"] is not None:
            moment = out.pop("placed_at")
            micros = int(moment.timestamp()) * 1_000_000 + moment.microsecond
            out["placed_at" if self.format == "avro" else "placed_at_us"] = micros
        return out


def _avro_record(i: int) -> dict[str, Any]:
    return {"id": i, "customer": f"c{i % 7}", "amount": i * 1.25, "placed_at": 1_700_000_000_000 + i, "note": None}


def _json_record(i: int) -> dict[str, Any]:
    return {"id": i, "customer": f"c{i % 7}", "amount": i * 1.25, "tags": [f"t{i % 3}"]}


def _color(i: int) -> str:
    return "" if i % 3 == 0 else ["red", "blue"][i % 2]


def _step_until(pipeline: Pipeline, topic: str, end: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not pipeline.resume_frontier().covers((topic, 0), end - 1):
        assert time.monotonic() < deadline, f"offsets below {end} not in after {timeout}s"
        if pipeline.step().idle:
            time.sleep(0.05)


def _tables(tmp_path, output: str) -> tuple[dict[int, dict], dict[int, dict]]:
    lake = Lake.at(tmp_path)
    rows = {r["_offset"]: r for r in replay(lake.output_path("p", output)).rows()}
    errors = {r["_offset"]: r for r in replay(lake.output_path("p", "_errors")).rows()}
    return rows, errors


def _source(broker, registry: RegistryStandIn, stream: Stream) -> KafkaSource:
    return KafkaSource(
        broker.bootstrap,
        topics=[stream.topic],
        format=stream.format,
        schema_registry={"url": registry.url, "timeout_s": 2},
        reader_schema=stream.reader_schema(),
        read_timeout_s=5.0,
    )


def _send_mixed(produce, stream: Stream) -> tuple[dict[int, int], dict[int, str]]:
    """Version-1 records, then version-2 records with three bad ones among them (four for JSON:
    one that does not validate); returns
    ``{offset: record number}`` of the good ones and ``{offset: kind}`` of the bad ones."""
    first = produce.send(stream.topic, [stream.v1(i) for i in range(V1_RECORDS)])
    good = {offset: i for i, (_, _, offset) in enumerate(first)}
    values: list[bytes] = [stream.v2(V1_RECORDS + i) for i in range(V2_RECORDS)]
    framed = values[0][:5]
    bad = {
        5: b"\x00\x00\x00\x03\xe7" + values[5][5:],  # schema id 999: not in the registry
        12: framed + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a payload its schema cannot read
        20: b"not framed at all",
    }
    kinds = {5: "unknown_schema", 12: "decode", 20: "decode"}
    if stream.format == "json":  # parses, and converts to the columns, but breaks `required`
        bad[25], kinds[25] = framed + b'{"customer": "no id", "amount": 1.5}', "schema_mismatch"
    later = produce.send(stream.topic, [bad.get(i, v) for i, v in enumerate(values)])
    faults = {}
    for i, (_, _, offset) in enumerate(later):
        if i in bad:
            faults[offset] = kinds[i]
        else:
            good[offset] = V1_RECORDS + i
    return good, faults


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "json"])
@pytest.mark.parametrize("mode", ["none", "add", "rescue"])
def test_a_registry_topic_whose_producer_changes_schema_lands_every_record_once(
    broker, topic, produce, registry, tmp_path, fmt, mode
):
    stream = Stream(fmt, registry.url, topic())
    output = output_name_for(stream.topic)
    good, faults = _send_mixed(produce, stream)  # the serializers register the subject's versions
    layouts = {output: OutputLayout(schema_evolution=mode)}
    pipeline = Pipeline("p", tmp_path, _source(broker, registry, stream), layouts=layouts)
    _step_until(pipeline, stream.topic, max([*good, *faults]) + 1)

    rows, errors = _tables(tmp_path, output)
    assert set(rows) == set(good) and set(errors) == set(faults)  # every record once: here or there
    assert {o: e["kind"] for o, e in errors.items()} == faults
    for offset, i in good.items():
        assert stream.row(rows[offset]) == stream.expected(i), (offset, i)
    # Version 2 sends "" as itself in Avro; a proto3 string has no presence, so an unset one reads
    # "" too; the JSON producer leaves the key out. Version 1 has no such field: null.
    color = {o: (_color(i) or (None if fmt == "json" else "")) if i >= V1_RECORDS else None for o, i in good.items()}
    if mode == "add":
        assert {o: r["color"] for o, r in rows.items()} == color
    elif mode == "rescue":
        rescued = {o: r["_rescued"] for o, r in rows.items()}
        assert rescued == {o: None if c is None else f'{{"color":"{c}"}}' for o, c in color.items()}
    else:
        assert "color" not in replay(Lake.at(tmp_path).output_path("p", output)).column_names
    # one physical type per column (Avro's timestamp-millis in microseconds in every file, those
    # of the batch that added the column included), read file by file by pyarrow
    assert lake_file_schema_mismatches(tmp_path) == []


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "json"])
def test_under_fail_a_new_writer_field_stops_the_batch_then_add_lands_it_whole(
    broker, topic, produce, registry, tmp_path, fmt
):
    stream = Stream(fmt, registry.url, topic())
    output = output_name_for(stream.topic)
    first = produce.send(stream.topic, [stream.v1(i) for i in range(V1_RECORDS)])
    source = _source(broker, registry, stream)
    pipeline = Pipeline("p", tmp_path, source, layouts={output: OutputLayout(schema_evolution="fail")})
    _step_until(pipeline, stream.topic, first[-1][2] + 1)
    later = produce.send(stream.topic, [stream.v2(V1_RECORDS + i) for i in (1, 4)])  # both have a color
    with pytest.raises(SchemaEvolutionError, match="new field 'color'"):
        _step_until(pipeline, stream.topic, later[-1][2] + 1)
    rows, _ = _tables(tmp_path, output)
    assert sorted(rows) == [o for _, _, o in first]  # nothing of the failed batch landed

    again = Pipeline(
        "p", tmp_path, _source(broker, registry, stream), layouts={output: OutputLayout(schema_evolution="add")}
    )
    _step_until(again, stream.topic, later[-1][2] + 1)
    rows, errors = _tables(tmp_path, output)
    assert not errors and sorted(rows) == sorted(o for _, _, o in first + later)
    assert [rows[o]["color"] for _, _, o in later] == ["blue", "red"]


@pytest.mark.parametrize("mode", ["fail", "add", "rescue"])
def test_fields_a_writer_lacks_land_as_the_reader_schemas_defaults_under_every_mode(
    broker, topic, produce, registry, tmp_path, mode
):
    name = topic()
    output = output_name_for(name)
    reg = client(registry.url)
    v1, v2, v3 = (avro_serializer(reg, s) for s in (AVRO_V1, READER_V2, WRITER_V3))  # versions 1, 2, 3
    full = {"color": "red", "qty": 2, "tag": b"t", "since": 5}
    records = {i: _avro_record(i) for i in range(30)}
    by_version = {i: 1 + i % 3 for i in records}  # the three producers interleaved
    values = []
    for i, record in records.items():
        if by_version[i] == 1:
            values.append(v1(name, record))
        elif by_version[i] == 2:
            values.append(v2(name, {**record, **full}))
        else:
            values.append(v3(name, {k: v for k, v in {**record, **full}.items() if k != "amount"}))
    sent = produce.send(name, values)
    source = KafkaSource(
        broker.bootstrap,
        topics=[name],
        format="avro",
        schema_registry=registry.url,
        reader_schema={"version": 2},
        read_timeout_s=5.0,
    )
    pipeline = Pipeline("p", tmp_path, source, layouts={output: OutputLayout(schema_evolution=mode)})
    _step_until(pipeline, name, sent[-1][2] + 1)  # no field is new: `fail` lands it all

    rows, errors = _tables(tmp_path, output)
    assert not errors and sorted(rows) == [o for _, _, o in sent]
    for (_, _, offset), (i, record) in zip(sent, records.items(), strict=True):
        row, version = rows[offset], by_version[i]
        assert (row["id"], row["customer"]) == (i, record["customer"])
        assert row["amount"] == (-1.0 if version == 3 else record["amount"])  # removed in version 3
        assert row["color"] == ("none" if version == 1 else "red")  # added in version 2
        assert (row["qty"], row["tag"]) == ((7, b"\xff\x01") if version == 1 else (2, b"t"))
        assert row["since"].timestamp() == (0.005 if version == 2 else 1.0)
        assert row.get("_rescued") is None
    columns = replay(Lake.at(tmp_path).output_path("p", output)).column_names
    assert [c for c in columns if not c.startswith("_")] == [f["name"] for f in READER_V2["fields"]]


def test_a_registry_outage_stalls_the_pipeline_and_it_resumes_exactly(broker, topic, produce, registry, tmp_path):
    stream = Stream("avro", registry.url, topic())
    output = output_name_for(stream.topic)
    first = produce.send(stream.topic, [stream.v1(i) for i in range(V1_RECORDS)])
    settings = Settings(batch_interval=0.05, retry_backoff=0.1, max_backoff=0.3)
    pipeline = Pipeline("p", tmp_path, _source(broker, registry, stream), settings=settings)
    healths: list[Health] = []
    stop = threading.Event()
    watch = {"stop": stop, "on_health": lambda p: healths.append(p.health)}
    runner = threading.Thread(target=pipeline.run, kwargs=watch)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while not pipeline.resume_frontier().covers((stream.topic, 0), first[-1][2]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        v2 = [stream.v2(V1_RECORDS + i) for i in range(V2_RECORDS)]  # the producer registers version 2 ...
        registry.stop()  # ... then the registry goes away before the pipeline could resolve it
        later = produce.send(stream.topic, v2)
        deadline = time.monotonic() + PATIENCE_S
        while Health.STALLED not in healths:
            assert time.monotonic() < deadline, healths
            time.sleep(0.05)
        assert "schema registry" in (pipeline.last_error or "")
        rows, errors = _tables(tmp_path, output)
        assert sorted(rows) == [o for _, _, o in first] and not errors  # nothing of version 2: no guess
        registry.start()
        deadline = time.monotonic() + 60
        while not pipeline.resume_frontier().covers((stream.topic, 0), later[-1][2]):
            assert time.monotonic() < deadline, pipeline.last_error
            time.sleep(0.05)
    finally:
        stop.set()
        runner.join(timeout=60)
    rows, errors = _tables(tmp_path, output)
    expected = {o: i for i, (_, _, o) in enumerate(first + later)}
    assert not errors and set(rows) == set(expected)
    assert all(stream.row(rows[o]) == stream.expected(i) for o, i in expected.items())


SECRET = "reg-s3cret-7f3a"


def test_the_registry_password_is_in_no_log_status_or_definition(broker, topic, produce, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("RECLOCK_TEST_REGISTRY_PASSWORD", SECRET)
    caplog.set_level(logging.DEBUG)
    with RegistryStandIn(username="reclock", password=SECRET) as registry:
        stream = Stream("avro", registry.url, topic())
        stream_client = client(registry.url, "reclock", SECRET)
        serialize = avro_serializer(stream_client, AVRO_V1)
        sent = produce.send(stream.topic, [serialize(stream.topic, _avro_record(i)) for i in range(20)])
        name, lake = "secret", tmp_path / "lake"
        config = write_config(
            tmp_path / "p.toml",
            pipeline={"name": name, "lake": str(lake), "engine": "local", "batch_interval": 0.1},
            source={
                "kind": "kafka",
                "bootstrap_servers": broker.bootstrap,
                "topics": [stream.topic],
                "format": "avro",
                "read_timeout_s": 5.0,
                "schema_registry": {
                    "url": registry.url,
                    "username": "reclock",
                    "password": "${RECLOCK_TEST_REGISTRY_PASSWORD}",
                },
                "reader_schema": {"version": 1},
            },
        )
        lifecycle.create(load_config(config))
        _run_until(lake, name, stream.topic, sent[-1][2] + 1)
        rows = {r["_offset"]: r for r in replay(Lake.at(lake).output_path(name, output_name_for(stream.topic))).rows()}
        assert sorted(rows) == [o for _, _, o in sent]  # the credentials really were used ...
        assert any(p.startswith("/schemas/ids/") or p.startswith("/subjects/") for _, p in registry.requests)
    definition = Lake.at(lake).definition_path(name).read_text()
    assert "${RECLOCK_TEST_REGISTRY_PASSWORD}" in definition and SECRET not in definition
    assert SECRET not in caplog.text
    lake_ = Lake.at(lake)
    assert SECRET not in lake_.status_path(name).read_text()


def _run_until(lake, name: str, topic: str, end: int) -> None:
    def stop_when_in() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            resume = Frontier.from_json(_status(lake, name).get("resume_frontier", "{}"))
            if resume.covers((topic, 0), end - 1):
                break
            time.sleep(0.1)
        lifecycle.request_stop(Lake.at(lake), name)

    watcher = threading.Thread(target=stop_when_in, daemon=True)
    watcher.start()
    pipeline = lifecycle.run(Lake.at(lake), name, progress=io.StringIO(), max_seconds=90)
    watcher.join()
    pipeline.source.close()
    assert SECRET not in repr(pipeline.source)


def test_registry_keys_land_as_struct_columns_next_to_their_values(broker, topic, produce, registry, tmp_path):
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    stream = Stream("avro", registry.url, topic())
    classes = order_classes(1)
    key_of = ProtobufSerializer(classes["Line"], client(registry.url), {"use.deprecated.format": False})
    keys = [
        key_of(classes["Line"](sku=f"k{i}", qty=i), SerializationContext(stream.topic, MessageField.KEY))
        for i in range(20)
    ]
    sent = produce.send(stream.topic, [stream.v1(i) for i in range(20)], keys=[*keys[:19], None])
    source = KafkaSource(
        broker.bootstrap,
        topics=[stream.topic],
        format="avro",
        schema_registry=registry.url,
        reader_schema={"version": 1},
        key_format="protobuf",
        key_schema={"version": 1, "message": "shop.Line"},
        metadata={"key": "line"},
        read_timeout_s=5.0,
    )
    pipeline = Pipeline("p", tmp_path, source)
    _step_until(pipeline, stream.topic, sent[-1][2] + 1)
    rows, errors = _tables(tmp_path, output_name_for(stream.topic))
    assert not errors and sorted(rows) == [o for _, _, o in sent]
    expected = [{"sku": f"k{i}", "qty": i} for i in range(19)] + [None]
    assert [rows[o]["line"] for _, _, o in sent] == expected
    assert [rows[o]["id"] for _, _, o in sent] == list(range(20))


TLS_PASSWORD_ENV = "RECLOCK_TEST_REGISTRY_KEY_PASSWORD"


def test_a_pipeline_reads_through_a_registry_over_mutual_tls(broker, topic, produce, tmp_path, caplog, monkeypatch):
    ours = make_authority(tmp_path / "pki", key_password=SECRET)
    monkeypatch.setenv(TLS_PASSWORD_ENV, SECRET)
    caplog.set_level(logging.DEBUG)
    tls = {
        "ca_location": str(ours.ca),
        "certificate_location": str(ours.client_cert),
        "key_location": str(ours.client_key),
    }
    with RegistryStandIn(tls=(ours.server_cert, ours.server_key), client_ca=ours.ca) as registry:
        name = topic()
        serialize = avro_serializer(client(registry.url, key_password=SECRET, **tls), AVRO_V1)
        sent = produce.send(name, [serialize(name, _avro_record(i)) for i in range(20)])
        pipeline_name, lake = "tls", tmp_path / "lake"
        config = write_config(
            tmp_path / "p.toml",
            pipeline={"name": pipeline_name, "lake": str(lake), "engine": "local", "batch_interval": 0.1},
            source={
                "kind": "kafka",
                "bootstrap_servers": broker.bootstrap,
                "topics": [name],
                "format": "avro",
                "read_timeout_s": 5.0,
                "schema_registry": {"url": registry.url, **tls, "key_password": f"${{{TLS_PASSWORD_ENV}}}"},
                "reader_schema": {"version": 1},
            },
        )
        lifecycle.create(load_config(config))
        _run_until(lake, pipeline_name, name, sent[-1][2] + 1)
    rows = replay(Lake.at(lake).output_path(pipeline_name, output_name_for(name))).rows()
    assert sorted(r["_offset"] for r in rows) == [o for _, _, o in sent]
    assert sorted(r["id"] for r in rows) == list(range(20))
    assert SECRET not in Lake.at(lake).definition_path(pipeline_name).read_text()
    assert SECRET not in Lake.at(lake).status_path(pipeline_name).read_text() and SECRET not in caplog.text


def test_a_registry_whose_certificate_is_not_trusted_stalls_the_pipeline_naming_it(broker, topic, produce, tmp_path):
    ours, stranger = make_authority(tmp_path / "pki"), make_authority(tmp_path / "pki", "stranger")
    with RegistryStandIn(tls=(ours.server_cert, ours.server_key)) as registry:
        name = topic()
        serialize = avro_serializer(client(registry.url, ca_location=str(ours.ca)), AVRO_V1)
        produce.send(name, [serialize(name, _avro_record(i)) for i in range(5)])
        source = KafkaSource(
            broker.bootstrap,
            topics=[name],
            format="avro",
            schema={"id": "int64"},
            schema_registry={"url": registry.url, "ca_location": str(stranger.ca), "timeout_s": 2},
            read_timeout_s=5.0,
        )
        settings = Settings(batch_interval=0.05, retry_backoff=0.1, max_backoff=0.3)
        pipeline = Pipeline("p", tmp_path, source, settings=settings)
        healths: list[Health] = []
        stop = threading.Event()
        runner = threading.Thread(
            target=pipeline.run, kwargs={"stop": stop, "on_health": lambda p: healths.append(p.health)}
        )
        runner.start()
        try:
            deadline = time.monotonic() + PATIENCE_S
            while Health.STALLED not in healths:
                assert time.monotonic() < deadline, healths
                time.sleep(0.05)
        finally:
            stop.set()
            runner.join(timeout=60)
    error = pipeline.last_error or ""
    assert f"schema registry {registry.url}: TLS handshake failed" in error, error
    assert "schema_registry.ca_location" in error
    rows, errors = _tables(tmp_path, output_name_for(name))
    assert not rows and not errors  # nothing decoded with a schema it could not fetch
