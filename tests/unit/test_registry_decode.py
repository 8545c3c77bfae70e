"""Registry formats decoded (issue 23): values framed by confluent-kafka's own serializers, their
writer schemas resolved through the registry stand-in (a local HTTP server, no broker).

The columnar Avro path is pinned against the datum-by-datum one (fastavro) by a property test:
whatever the records and whatever a corruption does to one of them, both give the same rows and
the same faults, so a batch can never land a row made of a neighbour's bytes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import pickle

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reclock.demo.registry import RegistryStandIn
from reclock.errors import ConfigError
from reclock.sources.decode import make_registry_decoder
from reclock.sources.decode.avro import decode_avro, reading_schema
from reclock.sources.decode.protobuf import message_indexes
from reclock.sources.decode.registry import RegistryUnavailable, check_registry
from reclock.sources.decode.values import Values
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


@pytest.fixture(scope="module")
def registry():
    with RegistryStandIn() as running:
        yield running


def _record(i: int) -> dict:
    return {"id": i, "customer": f"c{i % 7}", "amount": i * 1.25, "placed_at": 1_700_000_000_000 + i, "note": None}


def test_avro_values_decode_with_their_writer_schema_and_bad_ones_are_faults_of_their_kind(registry):
    reg = client(registry.url)
    v1, v2 = avro_serializer(reg, AVRO_V1), avro_serializer(reg, AVRO_V2)
    values = [v1("a", _record(i)) for i in range(3)] + [v2("a", {**_record(3), "color": "red"})]
    values += [None, b"\x00\x00\x00\x03\xe7" + values[0][5:], b"plain", values[0][:6]]
    decoder = make_registry_decoder(
        "avro", None, schema_registry=registry.url, reader_schema={"version": 1}, default_subject="a-value"
    )
    assert decoder.schema.field("placed_at").type == pa.timestamp("ms", tz="UTC")
    for given_values in (values, Values.of(values)):
        decoded = dataclasses.replace(decoder, unknown_fields=True).decode(given_values)
        assert decoded.good.tolist() == [0, 1, 2, 3, 4]
        assert [(i, kind) for i, kind, _ in decoded.errors] == [(5, "unknown_schema"), (6, "decode"), (7, "decode")]
        rows = decoded.batch.to_pylist()
        assert [r["id"] for r in rows] == [0, 1, 2, 3, None]
        assert [r["_unknown_fields"] for r in rows] == [None, None, None, '{"color":"red"}', None]
        assert int(rows[1]["placed_at"].timestamp() * 1000) == 1_700_000_000_001
    first = decoder.decode(values, fail_fast=True)
    assert first.batch.num_rows == 0 and [(i, k) for i, k, _ in first.errors] == [(5, "unknown_schema")]


def test_a_decoder_travels_pickled_without_its_client_and_resolves_again(registry):
    reg = client(registry.url)
    value = avro_serializer(reg, AVRO_V1)("p", _record(1))
    decoder = make_registry_decoder("avro", {"id": "int64"}, schema_registry=registry.url)
    decoder.decode([value])
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy == decoder and copy._readers == {}
    assert copy.decode([value]).batch.to_pylist() == [{"id": 1}]


def test_an_unreachable_registry_is_transient_and_names_no_password(registry):
    with RegistryStandIn(username="u", password="hunter2-secret") as guarded:
        value = avro_serializer(client(guarded.url, "u", "hunter2-secret"), AVRO_V1)("g", _record(1))
        wrong = make_registry_decoder(
            "avro", {"id": "int64"}, schema_registry={"url": guarded.url, "username": "u", "password": "nope-nope"}
        )
        with pytest.raises(RegistryUnavailable, match="refused the credentials") as refused:
            wrong.decode([value])
        assert "nope-nope" not in str(refused.value) and "nope-nope" not in repr(wrong)
        right = make_registry_decoder(
            "avro",
            {"id": "int64"},
            schema_registry={"url": guarded.url, "username": "u", "password": "hunter2-secret", "timeout_s": 1},
        )
        guarded.stop()
        with pytest.raises(RegistryUnavailable, match="unreachable"):
            right.decode([value])
        guarded.start()
        assert right.decode([value]).batch.to_pylist() == [{"id": 1}]  # the same batch, once it is back


def test_protobuf_messages_land_by_the_mapping_table(registry):
    reg = client(registry.url)
    c1, c2 = order_classes(1), order_classes(2)
    p1, p2 = protobuf_serializer(reg, c1["Order"]), protobuf_serializer(reg, c2["Order"])
    values = [p1("o", order_message(c1, i)) for i in range(6)] + [p2("o", order_message(c2, 6, color="red"))]
    assert message_indexes(values[0][5:])[0] == (1,)  # Order is the file's second message
    decoder = make_registry_decoder(
        "protobuf",
        None,
        schema_registry=registry.url,
        reader_schema={"version": 1, "message": "shop.Order"},
        default_subject="o-value",
    )
    schema = decoder.schema
    assert schema.field("status").type == pa.string()
    assert schema.field("placed_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("lines").type == pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int32())]))
    assert schema.field("attrs").type == pa.map_(pa.string(), pa.int64())
    assert schema.field("discount").type == pa.float64()
    decoded = dataclasses.replace(decoder, unknown_fields=True).decode([*values, values[0][:5] + b"\x02\xff\xff"])
    assert [(i, kind) for i, kind, _ in decoded.errors] == [(7, "decode")]
    rows = decoded.batch.to_pylist()
    for i, row in enumerate(rows):
        moment = row.pop("placed_at")
        row["placed_at_us"] = int(moment.timestamp()) * 1_000_000 + moment.microsecond
        assert {k: v for k, v in row.items() if k != "_unknown_fields"} == expected_order(i)
    assert rows[6]["_unknown_fields"] == '{"color":"red"}' and rows[0]["_unknown_fields"] is None


def test_protobuf_output_needs_a_message_when_the_file_has_several(registry):
    reg = client(registry.url)
    classes = order_classes(1)
    protobuf_serializer(reg, classes["Order"])("m", order_message(classes, 1))
    with pytest.raises(ConfigError, match=r"reader_schema: .*shop.Line, shop.Order"):
        make_registry_decoder(
            "protobuf", None, schema_registry=registry.url, reader_schema={"version": 1, "subject": "m-value"}
        )


def test_json_schema_values_decode_through_the_json_path(registry):
    reg = client(registry.url)
    j1, j2 = json_serializer(reg, JSON_V1), json_serializer(reg, JSON_V2)
    values = [j1("j", {"id": 1, "customer": "a", "amount": 2.5, "tags": ["x"]}), j2("j", {"id": 2, "color": "red"})]
    values.append(values[0][:5] + b'{"id": "not a number"}')
    decoder = make_registry_decoder(
        "json", None, schema_registry=registry.url, reader_schema={"version": 1}, default_subject="j-value"
    )
    assert decoder.schema.names == ["id", "customer", "amount", "tags"]
    decoded = dataclasses.replace(decoder, unknown_fields=True).decode(values)
    # a string where the writer schema says integer: the rule it breaks, not a failed parse (issue 40)
    assert [(i, kind) for i, kind, _ in decoded.errors] == [(2, "schema_mismatch")]
    assert decoded.batch.to_pylist() == [
        {"id": 1, "customer": "a", "amount": 2.5, "tags": ["x"], "_unknown_fields": None},
        {"id": 2, "customer": None, "amount": None, "tags": None, "_unknown_fields": '{"color":"red"}'},
    ]


def test_a_schema_of_another_kind_is_a_schema_fault(registry):
    reg = client(registry.url)
    value = json_serializer(reg, JSON_V1)("k", {"id": 1})
    decoder = make_registry_decoder("avro", {"id": "int64"}, schema_registry=registry.url)
    assert [(i, kind) for i, kind, _ in decoder.decode([value]).errors] == [(0, "schema")]


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"url": "ftp://x"}, "schema_registry.url"),
        ({"url": "http://u:p@x"}, "schema_registry.url"),
        ({"url": "http://x", "password": "p"}, "schema_registry.password"),
        ({"url": "http://x", "token": "t"}, "schema_registry.token"),
    ],
)
def test_bad_registry_settings_are_config_errors_naming_the_field(value, field):
    with pytest.raises(ConfigError) as error:
        check_registry(value, "schema_registry")
    assert error.value.field == field and "p@" not in str(error.value)


def test_a_reader_schema_must_be_pinned_to_a_version(registry):
    with pytest.raises(ConfigError, match=r"reader_schema.version: must be a version number"):
        make_registry_decoder("avro", None, schema_registry=registry.url, reader_schema={"subject": "s"})
    with pytest.raises(ConfigError, match=r"reader_schema: give the output's schema"):
        make_registry_decoder("avro", None, schema_registry=registry.url)


# -- the columnar Avro path against the datum-by-datum one ----------------------------------------

RICH = {
    "type": "record",
    "name": "Rich",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "s", "type": "string"},
        {"name": "by", "type": "bytes"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 2}},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "n", "type": ["null", "long"]},
        {"name": "o", "type": ["string", "null"]},
        {"name": "ob", "type": ["null", "boolean"]},
    ],
}

_records = st.fixed_dictionaries(
    {
        "b": st.booleans(),
        "i": st.integers(-(2**31), 2**31 - 1),
        "l": st.integers(-(2**63), 2**63 - 1),
        "f": st.floats(width=32, allow_nan=False),
        "s": st.text(max_size=12),
        "by": st.binary(max_size=12),
        "e": st.sampled_from(["A", "B", "C"]),
        "fx": st.binary(min_size=2, max_size=2),
        "d": st.integers(-100_000, 100_000),
        "ts": st.integers(-(2**50), 2**50),
        "n": st.none() | st.integers(-(2**63), 2**63 - 1),
        "o": st.none() | st.text(max_size=5),
        "ob": st.none() | st.booleans(),
    }
)
_corruption = st.sampled_from(["none", "append", "truncate", "flip", "swap"])


#: A float whose flipped exponent byte makes it NaN (a run of the suite found it): both paths must
#: give the same NaN, which ``RecordBatch.equals`` never calls equal to anything.
_NAN_BY_A_FLIP = {
    "b": False,
    "i": 64,
    "l": 134217728,
    "f": 1.7014120374287884e38,
    "s": "00",
    "by": b"\x00\x00",
    "e": "A",
    "fx": b"\x00\x00",
    "d": 0,
    "ts": 64,
    "n": 8192,
    "o": "00",
    "ob": None,
}


@settings(max_examples=150)
@given(st.lists(_records, min_size=1, max_size=30), _corruption, st.integers(0, 1000), st.integers(0, 255))
@example(records=[_NAN_BY_A_FLIP], corruption="flip", at=538, byte=128)
def test_columnar_avro_gives_exactly_the_datum_by_datum_rows_and_faults(registry, records, corruption, at, byte):
    value_of = _rich_serializer(registry.url)
    values = [value_of(r) for r in records]
    k = at % len(values)
    payload = bytearray(values[k])
    if corruption == "append":
        payload.append(byte)
    elif corruption == "truncate" and len(payload) > 5:
        payload = payload[: -1 - at % (len(payload) - 5)]
    elif corruption == "flip" and len(payload) > 5:
        payload[5 + at % (len(payload) - 5)] ^= byte or 1
    elif corruption == "swap" and len(values) > 1:  # two datums' bytes traded across the boundary
        other = bytearray(values[(k + 1) % len(values)])
        if len(other) > 6:
            payload.append(other[5])
            values[(k + 1) % len(values)] = bytes(other[:5] + other[6:])
    values[k] = bytes(payload)
    decoder = make_registry_decoder("avro", _rich_schema(), schema_registry=registry.url)
    fast = decoder.decode(Values.of(values))
    faults: list = []
    slow = decode_avro(values, reading_schema(RICH), decoder.schema, True, faults)
    assert fast.good.tolist() == slow.good.tolist()
    assert [i for i, _, _ in fast.errors] == [i for i, _, _ in slow.errors]
    assert fast.batch.schema == slow.batch.schema
    assert _rows(fast.batch) == _rows(slow.batch)


def _rows(batch: pa.RecordBatch) -> list[dict]:
    """The batch's rows, a NaN as the text ``NaN``: NaN equals nothing, itself included."""
    return [
        {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in batch.to_pylist()
    ]


def test_columnar_avro_is_the_path_clean_batches_take(registry, monkeypatch):
    from reclock.sources.decode import confluent

    value_of = _rich_serializer(registry.url)
    record = {"b": True, "i": 1, "l": 2, "f": 0.5, "s": "é", "by": b"", "e": "B", "fx": b"ab", "d": 3, "ts": 4}
    extra = {"ob": None}
    values = [value_of({**record, **extra, "n": None, "o": None}), value_of({**record, **extra, "n": 5, "o": "z"})]
    calls = []
    monkeypatch.setattr(confluent, "decode_avro", lambda *a, **k: calls.append(a) or pytest.fail("slow path"))
    decoded = make_registry_decoder("avro", _rich_schema(), schema_registry=registry.url).decode(values)
    assert decoded.good.tolist() == [0, 1] and not calls
    assert decoded.batch.column("n").to_pylist() == [None, 5]


_serializers: dict[str, object] = {}


def _rich_serializer(url: str):
    if url not in _serializers:
        serialize = avro_serializer(client(url), RICH)
        _serializers[url] = lambda record: serialize("rich", record)
    return _serializers[url]


def _rich_schema() -> pa.Schema:
    from reclock.sources.decode.avro import avro_to_arrow_schema

    return avro_to_arrow_schema(json.dumps(RICH))


def test_rich_records_round_trip_through_fastavro_as_the_serializer_wrote_them(registry):
    value = _rich_serializer(registry.url)(
        {
            "b": False,
            "i": -1,
            "l": 1,
            "f": 1.0,
            "s": "",
            "by": b"x",
            "e": "C",
            "fx": b"zz",
            "d": 0,
            "ts": 0,
            "n": None,
            "o": "q",
        }
    )
    datum = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(RICH), None)
    assert datum["e"] == "C" and datum["o"] == "q" and np.int64(datum["l"]) == 1


def test_registry_keys_land_as_a_struct_column_and_a_bad_key_is_its_records_fault(registry):
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from reclock.sources.base import ERRORS
    from reclock.sources.kafka import KafkaSource
    from reclock.sources.kafka.batches import Fetched

    reg = client(registry.url)
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}
    key_of = AvroSerializer(reg, json.dumps(key_schema))
    value_of = avro_serializer(reg, AVRO_V1)
    keys = [key_of({"id": i}, SerializationContext("kt", MessageField.KEY)) for i in range(3)] + [None, b"bad key"]
    values = [value_of("kt", _record(i)) for i in range(5)]
    source = KafkaSource(
        "127.0.0.1:1",
        topics=["kt"],
        format="avro",
        schema_registry=registry.url,
        reader_schema={"version": 1},
        key_format="avro",
        key_schema={"version": 1},
        metadata={"key": "k"},
    )
    assert source.outputs()[0].schema.field("k").type == pa.struct([("id", pa.int64())])
    offsets = np.arange(5, dtype=np.int64)
    records = Fetched(offsets, offsets + 1000, Values.of(keys), Values.of(values), None, None)
    out = dict(source._shape(records, '["kt",0]', "kt", 0))
    assert out["kt"].column("k").to_pylist() == [{"id": 0}, {"id": 1}, {"id": 2}, None]
    assert out["kt"].column("id").to_pylist() == [0, 1, 2, 3]
    errors = out[ERRORS].to_pylist()
    assert [(e["_offset"], e["kind"]) for e in errors] == [(4, "decode")] and errors[0]["message"].startswith("key: ")


# -- Avro schema resolution: the reader's defaults -------------------------------------------------


def test_a_field_its_writer_lacks_takes_the_reader_schemas_default_on_either_path(registry):
    reg = client(registry.url)
    v1, v2, v3 = (avro_serializer(reg, s) for s in (AVRO_V1, READER_V2, WRITER_V3))
    full = {"color": "red", "qty": 2, "tag": b"t", "since": 5}
    values = [v1("rd", _record(i)) for i in range(3)] + [v2("rd", {**_record(3), **full})]
    values += [v3("rd", {k: v for k, v in {**_record(4), **full}.items() if k != "amount"}), None]
    decoder = make_registry_decoder(
        "avro", None, schema_registry=registry.url, reader_schema={"version": 2}, default_subject="rd-value"
    )
    assert decoder.schema.names == [f["name"] for f in READER_V2["fields"]]
    broken = [*values[:2], values[2][:-1] + b"\xff\xff", *values[3:]]  # version 1 read datum by datum
    for batch, bad in ((values, []), (Values.of(values), []), (broken, [2])):
        decoded = decoder.decode(batch)
        assert [i for i, _, _ in decoded.errors] == bad
        rows = {int(i): row for i, row in zip(decoded.good, decoded.batch.to_pylist(), strict=True)}
        for i in (0, 1, 2):
            if i not in bad:
                assert rows[i]["amount"] == i * 1.25 and (rows[i]["color"], rows[i]["qty"]) == ("none", 7)
                assert rows[i]["tag"] == b"\xff\x01" and rows[i]["since"].timestamp() == 1.0
        assert (rows[3]["color"], rows[3]["qty"], rows[3]["tag"], rows[3]["amount"]) == ("red", 2, b"t", 3.75)
        assert (rows[4]["color"], rows[4]["amount"], rows[4]["since"].timestamp()) == ("red", -1.0, 1.0)
        assert set(rows[5].values()) == {None}  # a tombstone is a row of nulls, defaults or not


def test_a_reader_default_that_does_not_fit_its_field_is_a_config_error(registry):
    bad = {**AVRO_V1, "name": "Bad", "fields": [{"name": "n", "type": "long", "default": "seven"}]}
    client(registry.url).register_schema("bad-value", Schema(json.dumps(bad), "AVRO"))
    with pytest.raises(ConfigError, match=r"reader_schema: bad-value version 1: .*Default value <seven>"):
        make_registry_decoder(
            "avro", None, schema_registry=registry.url, reader_schema={"subject": "bad-value", "version": 1}
        )
