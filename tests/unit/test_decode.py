"""Decoding raw values into an output's schema: every value is a row or a fault, never neither."""

from __future__ import annotations

import io
import json
import pickle
import struct

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.errors import ConfigError
from reclock.sources.decode import Decoded, avro_to_arrow_schema, make_decoder
from reclock.sources.decode.isolate import ALONE, PIECE

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def _check_partition(decoded: Decoded, n: int) -> None:
    """Every input index is in exactly one of good/errors, and the batch is aligned with good."""
    bad = [i for i, _, _ in decoded.errors]
    assert sorted([*decoded.good.tolist(), *bad]) == list(range(n))
    assert decoded.batch.num_rows == len(decoded.good)
    assert list(decoded.good) == sorted(decoded.good)


# -- json ---------------------------------------------------------------------------------------


def test_json_good_values_decode_in_one_batch_with_missing_fields_null_and_unknown_ignored():
    dec = make_decoder("json", SCHEMA)
    values = [b'{"id": 1, "name": "a", "score": 1.5}', b'{"id": 2, "extra": [1, 2]}', b'{"name": "c"}']
    out = dec.decode(values)
    _check_partition(out, 3)
    assert out.errors == []
    assert out.batch.schema == SCHEMA
    assert out.batch.to_pylist() == [
        {"id": 1, "name": "a", "score": 1.5},
        {"id": 2, "name": None, "score": None},
        {"id": None, "name": "c", "score": None},
    ]


def test_json_bad_values_are_isolated_and_good_rows_keep_their_indices():
    dec = make_decoder("json", SCHEMA)
    values = [
        b'{"id": 1}',
        b'{"id": "not a number"}',
        b"not json at all",
        b'{"id": 4}',
        b"",
        b"null",
        b"[1, 2]",
        b'{"id": 8}{"id": 9}',
        b'{"id": 9',
        b'{"id": 10}',
        b'{"name": "\xff"}',
        b"42",
    ]
    out = dec.decode(values)
    _check_partition(out, len(values))
    assert out.good.tolist() == [0, 3, 9]
    assert out.batch.column("id").to_pylist() == [1, 4, 10]
    assert [i for i, _, _ in out.errors] == [1, 2, 4, 5, 6, 7, 8, 10, 11]
    assert all(kind == "decode" for _, kind, _ in out.errors)
    messages = dict((i, m) for i, _, m in out.errors)
    assert "empty" in messages[4]
    assert "expected an object" in messages[5]


def test_json_pretty_printed_values_with_newlines_decode():
    dec = make_decoder("json", SCHEMA)
    out = dec.decode([b'{\n  "id": 1,\r\n  "name": "x"\n}', b'{"id": 2}'])
    assert out.errors == []
    assert out.batch.column("id").to_pylist() == [1, 2]


def test_json_nested_types_and_timestamps_decode():
    schema = pa.schema(
        [("tags", pa.list_(pa.string())), ("pos", pa.struct([("x", pa.float64())])), ("ts", pa.timestamp("ms"))]
    )
    out = make_decoder("json", schema).decode([b'{"tags": ["a"], "pos": {"x": 1.0}, "ts": "2024-01-02T03:04:05"}'])
    assert out.errors == []
    row = out.batch.to_pylist()[0]
    assert row["tags"] == ["a"] and row["pos"] == {"x": 1.0} and row["ts"].year == 2024


def test_tombstone_decodes_to_a_null_row_not_an_error():
    out = make_decoder("json", SCHEMA).decode([None, b'{"id": 1}'])
    assert out.errors == []
    assert out.batch.to_pylist() == [{"id": None, "name": None, "score": None}, {"id": 1, "name": None, "score": None}]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=5), st.none()), max_size=30))
def test_json_verdict_for_a_value_does_not_depend_on_its_batch(ids):
    dec = make_decoder("json", SCHEMA)
    values = [json.dumps({"id": v}).encode() for v in ids]
    together = dec.decode(values)
    _check_partition(together, len(values))
    alone_good = [i for i, v in enumerate(values) if not dec.decode([v]).errors]
    assert together.good.tolist() == alone_good
    assert together.batch.column("id").to_pylist() == [ids[i] for i in alone_good]


# -- csv ----------------------------------------------------------------------------------------


def test_csv_good_rows_decode_with_types_and_quotes():
    dec = make_decoder("csv", SCHEMA)
    out = dec.decode([b"1,alice,2.5", b'2,"smith, bob",3', b'3,"multi\nline",4', b"4,,"])
    _check_partition(out, 4)
    assert out.errors == []
    assert out.batch.to_pylist() == [
        {"id": 1, "name": "alice", "score": 2.5},
        {"id": 2, "name": "smith, bob", "score": 3.0},
        {"id": 3, "name": "multi\nline", "score": 4.0},
        {"id": 4, "name": "", "score": None},
    ]


def test_csv_malformed_rows_become_faults():
    dec = make_decoder("csv", SCHEMA)
    values = [b"1,a,1", b"2,b", b"x,c,3", b"", b"5,e,5,extra", b'6,"open,6', b"7,g,7", b"8,\xff,8", b"9\n10,i,9"]
    out = dec.decode(values)
    _check_partition(out, len(values))
    assert out.good.tolist() == [0, 6]
    assert out.batch.column("id").to_pylist() == [1, 7]


def test_csv_custom_delimiter():
    out = make_decoder("csv", SCHEMA, delimiter=";").decode([b"1;a,b;2"])
    assert out.batch.to_pylist() == [{"id": 1, "name": "a,b", "score": 2.0}]


# -- text and bytes -----------------------------------------------------------------------------


def test_text_decodes_utf8_and_faults_invalid_bytes():
    dec = make_decoder("text")
    out = dec.decode([b"h\xc3\xa9llo", b"\xff\xfe", None, b""])
    _check_partition(out, 4)
    assert out.batch.schema == pa.schema([("value", pa.string())])
    assert out.batch.column("value").to_pylist() == ["héllo", None, ""]
    assert [(i, k) for i, k, _ in out.errors] == [(1, "decode")]
    assert "UTF-8" in out.errors[0][2]


def test_bytes_keeps_raw_values():
    out = make_decoder("bytes").decode([b"\x00\xff", None, b""])
    assert out.errors == []
    assert out.batch.column("value").to_pylist() == [b"\x00\xff", None, b""]
    assert out.batch.schema.field("value").type == pa.binary()


# -- avro ---------------------------------------------------------------------------------------

AVRO = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    ],
}


def _avro(datum: dict, schema: dict = AVRO) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), datum)
    return buf.getvalue()


def test_avro_schema_maps_to_arrow():
    schema = avro_to_arrow_schema(AVRO)
    assert schema.names == ["id", "item", "ts", "tags", "kind"]
    assert schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("kind").type == pa.string()


def test_avro_time_of_day_decodes_to_integers_a_delta_table_can_hold(tmp_path):
    """Delta has no time-of-day type: ``time-millis``/``time-micros`` stay ms/us after midnight."""
    from deltalake import DeltaTable

    schema = {
        "type": "record",
        "name": "T",
        "fields": [
            {"name": "ms", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "us", "type": {"type": "long", "logicalType": "time-micros"}},
        ],
    }
    out = make_decoder("avro", avro_schema=schema).decode([_avro({"ms": 3_600_000, "us": 86_399_999_999}, schema)])
    assert out.batch.schema.types == [pa.int32(), pa.int64()]
    assert out.batch.to_pylist() == [{"ms": 3_600_000, "us": 86_399_999_999}]
    DeltaTable.create(str(tmp_path / "t"), schema=out.batch.schema)


def test_avro_good_and_malformed_values():
    dec = make_decoder("avro", avro_schema=AVRO)
    good = _avro({"id": 7, "item": "x", "ts": 1_700_000_000_000, "tags": ["a"], "kind": "B"})
    values = [good, b"\x01", good + b"\x00", None]
    out = dec.decode(values)
    _check_partition(out, 4)
    assert out.good.tolist() == [0, 3]
    row = out.batch.to_pylist()[0]
    assert row["id"] == 7 and row["item"] == "x" and row["kind"] == "B" and row["tags"] == ["a"]
    assert out.batch.to_pylist()[1]["id"] is None
    assert "trailing" in dict((i, m) for i, _, m in out.errors)[2]


def test_avro_confluent_framing_is_stripped_and_required():
    dec = make_decoder("avro", avro_schema=json.dumps(AVRO), confluent=True)
    datum = _avro({"id": 1, "item": None, "ts": 0, "tags": [], "kind": "A"})
    framed = b"\x00" + struct.pack(">I", 42) + datum
    out = dec.decode([framed, datum, b"\x00\x00"])
    _check_partition(out, 3)
    assert out.good.tolist() == [0]
    assert out.batch.column("id").to_pylist() == [1]
    assert all("Confluent" in m for _, _, m in out.errors)


def test_a_field_an_older_writer_lacks_takes_the_avro_schemas_default():
    reader = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "color", "type": "string", "default": "none"},
            {"name": "n", "type": ["null", "long"], "default": None},
        ],
    }
    old = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
    dec = make_decoder("avro", avro_schema=reader, confluent=True, avro_writer_schemas={"2": old})

    def framed(schema: dict, schema_id: int, record: dict) -> bytes:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
        return b"\x00" + struct.pack(">I", schema_id) + buffer.getvalue()

    out = dec.decode([framed(old, 2, {"id": 1}), framed(reader, 1, {"id": 2, "color": "red", "n": 3}), None])
    assert out.batch.to_pylist() == [
        {"id": 1, "color": "none", "n": None},
        {"id": 2, "color": "red", "n": 3},
        {"id": None, "color": None, "n": None},
    ]


def test_avro_primitive_schema_decodes_into_value_column():
    dec = make_decoder("avro", avro_schema='"string"')
    out = dec.decode([_avro("hi", "string")])  # type: ignore[arg-type]
    assert out.batch.to_pylist() == [{"value": "hi"}]


# -- configuration and shape --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        (("xml",), {}, "format"),
        (("json",), {}, "format.schema"),
        (("csv", SCHEMA), {"delimiter": "ab"}, "format.delimiter"),
        (("text", SCHEMA), {}, "format.schema"),
        (("avro",), {}, "format.avro_schema"),
        (("avro",), {"avro_schema": {"type": "nonsense"}}, "format.avro_schema"),
        (("avro",), {"avro_schema": ["int", "string"]}, "format.avro_schema"),
        (
            ("avro",),
            {"avro_schema": {"type": "bytes", "logicalType": "decimal", "precision": 40}},
            "format.avro_schema",
        ),
    ],
)
def test_invalid_decoder_config_names_the_field(args, kwargs, field):
    with pytest.raises(ConfigError) as info:
        make_decoder(*args, **kwargs)
    assert info.value.field == field


@pytest.mark.parametrize("fmt", ["json", "csv", "text", "bytes", "avro"])
def test_decoders_are_picklable_and_decode_empty_input(fmt):
    dec = make_decoder(fmt, SCHEMA if fmt in ("json", "csv") else None, avro_schema=AVRO)
    clone = pickle.loads(pickle.dumps(dec))
    out = clone.decode([])
    assert out.batch.num_rows == 0 and out.errors == [] and out.batch.schema == dec.schema


def test_all_bad_batch_yields_empty_batch_with_schema():
    out = make_decoder("json", SCHEMA).decode([b"x", b"y"])
    assert out.batch.num_rows == 0 and out.batch.schema == SCHEMA and len(out.errors) == 2


def test_json_bulk_decode_is_vectorised_and_bisects_to_the_broken_value(monkeypatch):
    """50,000 values with one broken: parsed in bulk, and the broken one found by halving, so the
    parser sees a few times the input in a few dozen calls (:mod:`reclock.sources.decode.isolate`),
    never once per value. How fast that
    is, is benchmarks/' to measure."""
    values = [json.dumps({"id": i, "name": f"n{i}", "score": i / 2}).encode() for i in range(50_000)]
    values[777] = b"{broken"
    dec = make_decoder("json", SCHEMA)
    parse, calls, lines = type(dec)._parse_json, [], []

    def counted(self, buf: bytes, *, multiline: bool) -> pa.Table:
        calls.append(1)
        lines.append(buf.count(b"\n") + 1)
        return parse(self, buf, multiline=multiline)

    monkeypatch.setattr(type(dec), "_parse_json", counted)
    out = dec.decode(values)
    assert out.batch.num_rows == 49_999 and [i for i, _, _ in out.errors] == [777]
    # All at once, then each piece, then halving the broken piece down to a few values tried alone.
    pieces = -(-len(values) // PIECE)
    assert len(calls) <= 1 + pieces + 2 * PIECE.bit_length() + ALONE, len(calls)
    assert sum(lines) <= 3 * len(values), sum(lines)


def test_schema_from_config_text_uses_pyarrow_type_names():
    dec = make_decoder("json", {"id": "int64", "ts": "timestamp[ms]"})
    assert dec.schema == pa.schema([("id", pa.int64()), ("ts", pa.timestamp("ms"))])
    with pytest.raises(ConfigError) as info:
        make_decoder("json", {"id": "integer-ish"})
    assert info.value.field == "format.schema.id"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.integers(-5, 5), st.sampled_from(["a", "b,c", ""]), st.floats(-2, 2, allow_nan=False)).map(
                lambda t: f'{t[0]},"{t[1]}",{t[2]}'.encode()
            ),
            st.sampled_from([b"x,y,z", b"1,2", b"", b'1,"open,2', b"1,a,2,3", b"\xff,a,1", b"1,a,1e999x"]),
        ),
        max_size=40,
    )
)
def test_csv_verdict_for_a_value_does_not_depend_on_its_batch(values):
    dec = make_decoder("csv", SCHEMA)
    together = dec.decode(values)
    _check_partition(together, len(values))
    alone = [dec.decode([v]) for v in values]
    assert together.good.tolist() == [i for i, a in enumerate(alone) if not a.errors]
    assert together.batch.to_pylist() == [a.batch.to_pylist()[0] for a in alone if not a.errors]


def test_fail_fast_stops_at_the_first_bad_value():
    values = [b'{"id": 1}'] * 5000 + [b"bad"] + [b'{"id": "x"}'] * 5000
    out = make_decoder("json", SCHEMA).decode(values, fail_fast=True)
    assert out.batch.num_rows == 0 and len(out.errors) == 1
    assert out.errors[0][0] in (5000, *range(5001, 10001))


@pytest.mark.parametrize(
    ("fmt", "values", "first"),
    [
        ("json", [b'{"id": "x"}', b"null", b'{"id": 1}'], 0),  # the screen sees 1 before the parse sees 0
        ("csv", [b"1,a,1.5", b"x,b,2", b"", b"2,c,3"], 1),  # the empty record is found before the parse
    ],
)
def test_fail_fast_names_the_first_bad_value_whichever_check_finds_one_first(fmt, values, first):
    out = make_decoder(fmt, SCHEMA).decode(values, fail_fast=True)
    assert out.batch.num_rows == 0 and [i for i, _, _ in out.errors] == [first]


_JSON_POOL = [b'{"id": 1}', b'{"id": 2, "name": "b"}', b'{"id": "x"}', b"null", b"[1]", b"", b'{"id": 1', None]


@settings(max_examples=60)
@given(st.lists(st.sampled_from(_JSON_POOL), min_size=1, max_size=40))
def test_fail_fast_finds_the_same_first_fault_as_a_full_decode(values):
    dec = make_decoder("json", SCHEMA)
    full = dec.decode(values)
    fast = dec.decode(values, fail_fast=True)
    if full.errors:
        assert fast.errors == full.errors[:1] and fast.batch.num_rows == 0
    else:
        assert fast.errors == [] and fast.batch == full.batch
