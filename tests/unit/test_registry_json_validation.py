"""JSON Schema payloads validated against their writer schema (issue 23): a payload that parses
but does not validate is a ``schema_mismatch`` fault, never a row, exactly as confluent-kafka's
``JSONDeserializer`` (``jsonschema``) would refuse it.

The columnar check is pinned against ``jsonschema`` by a property test: on random payloads of a
schema with nested objects, arrays and ``required`` at two depths, the faults are exactly the
payloads ``jsonschema`` rejects, whichever path decided them.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator

from reclock.demo.registry import RegistryStandIn
from reclock.sources.decode import make_registry_decoder
from reclock.sources.decode.json_validation import JsonValidator, validation_plan
from reclock.sources.decode.values import Values
from tests.registry_payloads import JSON_V1, client, json_serializer


@pytest.fixture(scope="module")
def registry():
    with RegistryStandIn() as running:
        yield running


def test_a_json_payload_that_does_not_validate_is_a_schema_mismatch_never_a_row(registry):
    reg = client(registry.url)
    strict, lax = json_serializer(reg, JSON_V1), json_serializer(reg, JSON_V1, validate=False)
    values = [
        strict("jv", {"id": 1, "customer": "a", "amount": 2.5, "tags": ["x"]}),
        lax("jv", {"customer": "no id"}),  # required id missing: every column still decodes
        lax("jv", {"id": 2, "customer": None}),  # null is not a string
        strict("jv", {"id": 3, "note": "an extra key is allowed"}),
        lax("jv", {"id": "4"}),  # a string where the writer says integer: its columns refuse it too
        lax("jv", {"id": 5, "tags": [1]}),  # an item of the wrong type, in a field the output lacks
    ]
    decoder = make_registry_decoder("json", {"id": "int64", "customer": "string"}, schema_registry=registry.url)
    for given_values in (values, Values.of(values)):
        decoded = decoder.decode(given_values)
        assert decoded.good.tolist() == [0, 3]
        assert decoded.batch.column("id").to_pylist() == [1, 3]
        kinds = {i: (kind, message) for i, kind, message in decoded.errors}
        assert {i: k for i, (k, _) in kinds.items()} == {
            1: "schema_mismatch",
            2: "schema_mismatch",
            4: "schema_mismatch",
            5: "schema_mismatch",
        }
        assert "'id' is a required property" in kinds[1][1] and "(id 1)" in kinds[1][1]
        assert "rule required" in kinds[1][1]
        assert "$.customer" in kinds[2][1] and "$.tags[0]" in kinds[5][1]
        assert "(id 1) at $.id, rule type: '4' is not of type 'integer'" in kinds[4][1], kinds[4][1]


def test_a_value_of_another_type_than_its_writer_schema_says_is_a_schema_mismatch_with_id_path_and_rule(registry):
    reg = client(registry.url)
    lax = json_serializer(reg, JSON_V1, validate=False)
    values = [lax("jt", {"id": "seven"}), lax("jt", {"id": 8}), b"\x00" + values_id(lax("jt", {"id": 9})) + b"{no json"]
    decoded = make_registry_decoder("json", {"id": "int64"}, schema_registry=registry.url).decode(values)
    assert decoded.good.tolist() == [1] and decoded.batch.column("id").to_pylist() == [8]
    kinds = {i: (kind, message) for i, kind, message in decoded.errors}
    assert kinds[0][0] == "schema_mismatch", kinds
    assert "(id " in kinds[0][1] and "at $.id, rule type: 'seven' is not of type 'integer'" in kinds[0][1]
    assert kinds[2][0] == "decode", kinds  # no JSON at all: nothing to validate


def values_id(value: bytes) -> bytes:
    """The 4-byte schema id of a framed value."""
    return value[1:5]


def test_a_clean_batch_is_validated_as_columns(registry, monkeypatch):
    reg = client(registry.url)
    strict = json_serializer(reg, JSON_V1)
    values = [strict("jc", {"id": i, "customer": f"c{i}", "tags": ["a", "b"][: i % 3]}) for i in range(200)]
    values.append(strict("jc", {"id": 200, "customer": "nullable"}))  # holds `null`: record by record
    calls: list[int] = []
    one = JsonValidator._one
    monkeypatch.setattr(JsonValidator, "_one", lambda self, i, p: calls.append(i) or one(self, i, p))
    decoded = make_registry_decoder("json", {"id": "int64"}, schema_registry=registry.url).decode(values)
    assert decoded.good.tolist() == list(range(201)) and not decoded.errors
    assert calls == [200]


def test_a_schema_the_typed_parse_cannot_decide_goes_record_by_record():
    assert validation_plan({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}) is None
    assert validation_plan({"type": "object", "properties": {"a": {"enum": [1, 2]}}}) is None
    closed = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    assert validation_plan(closed) is None
    validator = JsonValidator(7, closed)
    faults = validator.invalid([b'{"a": "x"}', b'{"a": "x", "b": 1}'])
    assert [(i, kind) for i, kind, _ in faults] == [(1, "schema_mismatch")]


SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": ["string", "null"]},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "inner": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "string"}},
            "required": ["x"],
        },
    },
    "required": ["id", "name"],
}

_any = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["x", "y", "z"]), inner, max_size=3),
    max_leaves=6,
)
_good = {
    "id": st.integers(-(2**63), 2**63 - 1),
    "name": st.none() | st.text(max_size=6),
    "score": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-1000, 1000),
    "ok": st.booleans(),
    "tags": st.lists(st.text(max_size=3), max_size=3),
    "inner": st.fixed_dictionaries({"x": st.integers(-5, 5)}, optional={"y": st.text(max_size=3)}),
}
_payload = st.dictionaries(st.sampled_from(sorted(_good)), st.just(None), max_size=len(_good)).flatmap(
    lambda keys: st.fixed_dictionaries(
        {k: st.one_of(_good[k], _any) if k in ("tags", "inner", "score") else _good[k] | _any for k in keys}
    )
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_payload, min_size=1, max_size=12))
def test_columnar_validation_rejects_exactly_what_jsonschema_rejects(payloads):
    assert validation_plan(SCHEMA) is not None
    texts = [json.dumps(p).encode() for p in payloads]
    reference = Draft7Validator(SCHEMA)
    expected = [i for i, p in enumerate(payloads) if not reference.is_valid(p)]
    faults = JsonValidator(1, SCHEMA).invalid(texts)
    assert [i for i, _, _ in faults] == expected
    assert {kind for _, kind, _ in faults} <= {"schema_mismatch"}
