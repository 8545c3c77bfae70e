"""JSON Schema payloads validated against their writer's schema, columnar where it can be proven.

confluent-kafka's ``JSONDeserializer`` validates every payload against the schema its id names
(``jsonschema``, the ecosystem's validator) and raises on one that does not validate. reclock
does the same, but a record that fails is bad data of that record: a ``schema_mismatch`` fault,
an ``_errors`` row with its coordinates, never a row.

``jsonschema`` takes 10-30 us a record, ten times the vectorised parse. So a writer schema made
only of keywords a typed parse can decide (``type``, ``properties``, ``required``, ``items``, plus
annotations; see :func:`validation_plan`) is checked for a whole batch at once: the payloads are
parsed by pyarrow's JSON reader into the Arrow types the schema's ``type`` keywords give. That
reader is strict (a number never parses as a string, ``1.5`` or an out-of-range number never as
an int64, a repeated key fails), so a successful parse proves every present value has its type;
``required`` is then a null check per column. A parsed null cannot say whether the key was absent
(valid unless required) or ``null`` (invalid unless the type allows it), so a payload holding the
bytes ``null`` anywhere is validated record by record, as is every payload of a batch the typed
parse rejects, and every payload of a writer schema with any other keyword (``enum``,
``minimum``, ``pattern``, ``$ref``, ``additionalProperties: false``...). The columnar check only
ever accepts what ``jsonschema`` accepts; anything it cannot prove goes to ``jsonschema``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from reclock.sources.base import clip_message
from reclock.sources.decode.result import RecordFault

__all__ = ["SCHEMA_MISMATCH", "JsonValidator", "validation_plan"]

#: ``kind`` of a record whose payload parses but does not validate against its writer schema.
SCHEMA_MISMATCH = "schema_mismatch"

#: Keywords that assert nothing (or nothing ``jsonschema`` checks by default: ``format``).
_ANNOTATIONS = frozenset(
    {"title", "description", "$schema", "$id", "$comment", "default", "examples", "format", "readOnly", "writeOnly"}
)
_SCALARS = {"integer": pa.int64(), "number": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}


class _Plan:
    """A writer schema as Arrow types, and per object the required fields to null-check."""

    def __init__(self, arrow: pa.StructType, required: list[tuple[str, ...]]) -> None:
        self.schema = pa.schema(list(arrow))
        #: Paths of fields that must be present wherever their parent object is.
        self.required = required


def validation_plan(schema: Any) -> _Plan | None:
    """The typed parse that decides ``schema`` for payloads without ``null``, or ``None`` when it
    has a keyword the parse cannot decide (then every payload goes through ``jsonschema``)."""
    required: list[tuple[str, ...]] = []
    arrow = _node(schema, (), required)
    if not isinstance(arrow, pa.StructType) or arrow.num_fields == 0:
        return None
    return _Plan(arrow, required)


def _node(node: Any, path: tuple[str, ...], required: list[tuple[str, ...]]) -> pa.DataType | None:
    if not isinstance(node, dict):
        return None
    allowed = _ANNOTATIONS | {"type", "properties", "required", "items", "additionalProperties"}
    if set(node) - allowed or node.get("additionalProperties", True) is not True:
        return None
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1 or len(kind) - len(kinds) > 1:
            return None
        kind = kinds[0]
    if not isinstance(kind, str) or ("items" in node and kind != "array"):
        return None
    if kind == "object":
        props = node.get("properties")
        needed = node.get("required", [])
        if not isinstance(props, dict) or not props or not isinstance(needed, list) or set(needed) - set(props):
            return None
        fields = []
        for name, sub in props.items():
            child = _node(sub, (*path, name), required)
            if child is None:
                return None
            fields.append(pa.field(name, child))
        required.extend((*path, name) for name in needed)
        return pa.struct(fields)
    if set(node) & {"properties", "required"}:
        return None
    if kind == "array":
        inside: list[tuple[str, ...]] = []
        item = _node(node.get("items"), (*path, "[]"), inside)
        return None if item is None or inside else pa.list_(item)  # no null check reaches into lists
    return _SCALARS.get(kind)


class JsonValidator:
    """Validates the payloads of one writer schema; built once per schema id and process."""

    def __init__(self, schema_id: int, schema: Any, resources: Sequence[tuple[str, Any]] = ()) -> None:
        from jsonschema.validators import validator_for  # type: ignore[import-untyped]
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT7

        registry: Any = Registry()
        for name, contents in resources:  # the writer's references, as confluent-kafka names them
            registry = registry.with_resource(name, Resource.from_contents(contents, default_specification=DRAFT7))
        self.schema_id = schema_id
        self.plan = validation_plan(schema)
        self._validator = validator_for(schema)(schema, registry=registry)

    def invalid(self, payloads: Sequence[bytes]) -> list[RecordFault]:
        """The faults of ``payloads`` (each a JSON text that parsed) that do not validate."""
        n = len(payloads)
        if n == 0:
            return []
        slow = np.ones(n, bool)
        if self.plan is not None:
            slow = np.fromiter((b"null" in p or b"\n" in p or b"\r" in p for p in payloads), bool, n)
            fast = np.flatnonzero(~slow)
            if len(fast):
                proven = _typed_check(self.plan, [payloads[int(i)] for i in fast])
                slow[fast[~proven]] = True
        return [fault for i in np.flatnonzero(slow).tolist() if (fault := self._one(i, payloads[i])) is not None]

    def mismatched(self, payloads: Sequence[bytes], faults: Sequence[RecordFault]) -> list[RecordFault]:
        """``faults`` (of ``payloads`` the decode refused), each one whose payload is JSON that
        does not validate against the writer schema made a ``schema_mismatch`` fault instead: a
        value of the wrong type fails the typed parse of its columns before any validation, and
        must still be reported as the writer schema's rule it breaks. A payload that is no JSON,
        or that validates (its writer allows what the output's columns cannot hold), keeps its
        ``decode`` fault."""
        out: list[RecordFault] = []
        for fault in faults:
            index = fault[0]
            try:
                json.loads(payloads[index])
            except ValueError:
                out.append(fault)
                continue
            mismatch = self._one(index, payloads[index])
            out.append(mismatch if mismatch is not None and mismatch[1] == SCHEMA_MISMATCH else fault)
        return out

    def _one(self, index: int, payload: bytes) -> RecordFault | None:
        from jsonschema.exceptions import ValidationError, best_match  # type: ignore[import-untyped]

        try:
            error = best_match(self._validator.iter_errors(json.loads(payload)))
        except ValidationError as exc:
            error = exc
        except Exception as exc:  # an unresolvable $ref, a schema jsonschema cannot apply
            message = f"schema id {self.schema_id} cannot validate: {type(exc).__name__}: {exc}"
            return (index, "schema", clip_message(message))
        if error is None:
            return None
        where = error.json_path if error.path else "$"
        rule = f"rule {error.validator}"
        message = f"does not match its writer schema (id {self.schema_id}) at {where}, {rule}: {error.message}"
        return (index, SCHEMA_MISMATCH, clip_message(message))


def _typed_check(plan: _Plan, payloads: list[bytes]) -> np.ndarray:
    """Per payload: proven valid. All ``False`` when the typed parse rejects the batch."""
    import pyarrow.json as pa_json

    n = len(payloads)
    options = pa_json.ParseOptions(explicit_schema=plan.schema, unexpected_field_behavior="ignore")
    try:
        table = pa_json.read_json(io.BytesIO(b"\n".join(payloads)), parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return np.zeros(n, bool)
    if table.num_rows != n:  # an empty or blank payload was skipped: nothing is proven
        return np.zeros(n, bool)
    proven = np.ones(n, bool)
    for path in plan.required:  # no payload here holds `null`: a null is an absent key
        proven &= _valid(table, path) | ~_valid(table, path[:-1])
    return proven


def _valid(table: pa.Table, path: tuple[str, ...]) -> np.ndarray:
    """Rows where the field at ``path`` is non-null (``()``: every row)."""
    if not path:
        return np.ones(table.num_rows, bool)
    column: Any = table.column(path[0]).combine_chunks()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    for name in path[1:]:
        column = column.field(name)
        valid = valid & column.is_valid().to_numpy(zero_copy_only=False)
    return valid
