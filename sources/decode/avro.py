"""Avro: schemaless datums decoded with fastavro, and the Arrow schema an Avro schema maps to.

A value is one schemaless Avro datum, optionally in Confluent framing (magic byte ``0`` and a
4-byte schema id, stripped, never looked up). A record schema maps to one column per field, any
other schema to one ``value`` column. Every column is nullable, so a tombstone decodes to a row of
nulls. Unions are supported only as ``["null", T]``; logical types map as Spark's Avro reader maps
them, except that Delta has no time-of-day type (see :data:`_AVRO_RAW_LOGICAL`). A datum is bad
when fastavro cannot read it, when bytes follow it, or when it does not fit the Arrow schema.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from reclock.errors import ConfigError
from reclock.sources.base import clip_message
from reclock.sources.decode.result import DECODE, NO_ROWS, Decoded, RecordFault, empty_batch
from reclock.sources.decode.unknown import UNKNOWN_FIELD, unknown_column

__all__ = [
    "avro_json",
    "avro_to_arrow_schema",
    "decode_avro",
    "reader_defaults",
    "reading_schema",
    "rows_to_batch",
    "with_unknown_rows",
]

_CONFLUENT_HEADER = 5


def avro_to_arrow_schema(avro_schema: str | Mapping[str, Any], *, field: str = "avro_schema") -> pa.Schema:
    """The Arrow schema for an Avro schema: a record's fields, or one ``value`` column otherwise.

    Unions are supported only as ``["null", T]`` (a nullable ``T``).
    """
    parsed = avro_json(avro_schema)
    named: dict[str, Any] = {}
    if isinstance(parsed, Mapping) and parsed.get("type") == "record":
        arrow = _avro_type(parsed, named, field)
        return pa.schema(list(arrow))
    return pa.schema([pa.field("value", _avro_type(parsed, named, field))])


def reading_schema(avro_schema: Any) -> Any:
    """The parsed fastavro schema datums are read with: see :data:`_AVRO_RAW_LOGICAL`."""
    import fastavro

    reading = avro_json(avro_schema)
    for logical in _AVRO_RAW_LOGICAL:  # read as their plain Avro values: see _AVRO_LOGICAL
        reading = _strip_logical(reading, logical)
    return fastavro.parse_schema(reading)


def reader_defaults(reader: Any, schema: pa.Schema) -> tuple[tuple[str, Any], ...]:
    """``(column, value)`` of each field of the record schema ``reader`` that declares a
    ``default`` and is a column of ``schema``: what a datum holding that default decodes to, so it
    lands as any value of its column would. Avro's schema resolution gives it to a datum whose
    writer schema lacks the field. Raises ``ValueError`` when a default does not fit its column."""
    import fastavro

    reading = avro_json(reader)
    if not _is_avro_record(reading):
        return ()
    for logical in _AVRO_RAW_LOGICAL:
        reading = _strip_logical(reading, logical)
    try:
        expanded: Any = fastavro.parse_schema(reading, expand=True, _write_hint=False)
    except Exception as exc:  # fastavro's SchemaParseException: a default of the wrong type, say
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    out = []
    for f in expanded["fields"]:
        if "default" not in f or f["name"] not in schema.names:
            continue
        single = fastavro.parse_schema(
            {"type": "record", "name": "Default", "fields": [{"name": "v", "type": f["type"]}]}
        )
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, single, {"v": _default_datum(f["type"], f["default"])})
            buffer.seek(0)
            datum: Any = fastavro.schemaless_reader(buffer, single, None)
            value = datum["v"]
            pa.array([value], schema.field(f["name"]).type)
        except Exception as exc:  # fastavro's and Arrow's many kinds: the default does not fit
            raise ValueError(f"field {f['name']!r}: default {f['default']!r} does not fit its type: {exc}") from None
        out.append((f["name"], value))
    return tuple(out)


def _default_datum(node: Any, value: Any) -> Any:
    """A default as JSON (the schema's encoding) to a datum fastavro writes: bytes and fixed are
    strings of code points 0-255, a union's default is of its first branch."""
    if value is None:
        return None
    kind = node.get("type") if isinstance(node, Mapping) else node
    if isinstance(node, list):
        return _default_datum(node[0], value)
    if kind in ("bytes", "fixed"):
        return value.encode("latin-1")
    if kind == "record":
        return {f["name"]: _default_datum(f["type"], value[f["name"]]) for f in node["fields"] if f["name"] in value}
    if kind == "array":
        return [_default_datum(node["items"], v) for v in value]
    if kind == "map":
        return {k: _default_datum(node["values"], v) for k, v in value.items()}
    return value


def decode_avro(
    values: Sequence[bytes | None],
    parsed: Any,
    schema: pa.Schema,
    confluent: bool,
    errors: list[RecordFault],
    *,
    writers: Mapping[int, Any] | None = None,
    unknown_fields: bool = False,
    defaults: Sequence[tuple[str, Any]] = (),
) -> Decoded:
    """Decode ``values`` with the :func:`reading_schema` ``parsed`` into ``schema``.

    A Confluent-framed value whose schema id is in ``writers`` is read with that writer schema
    instead (a producer's newer schema): its fields ``schema`` lacks are dropped, or, with
    ``unknown_fields``, kept as JSON in :data:`~reclock.timeline.frontier.UNKNOWN_FIELDS`; a field it
    lacks takes its value from ``defaults`` (the reader's, see :func:`reader_defaults`), or is null.
    Faults are appended to ``errors`` as they are found (a fail-fast list stops there).
    """
    import fastavro

    rows: list[Any] = []
    good: list[int] = []
    wrap = not _is_avro_record(parsed)
    for i, value in enumerate(values):
        if value is None:
            rows.append(None)
            good.append(i)
            continue
        payload = value
        if confluent:
            if len(value) < _CONFLUENT_HEADER or value[0] != 0:
                errors.append((i, DECODE, "invalid avro: missing Confluent framing (magic byte 0 + schema id)"))
                continue
            payload = value[_CONFLUENT_HEADER:]
        writer = parsed
        if writers and confluent:
            writer = writers.get(int.from_bytes(value[1:_CONFLUENT_HEADER], "big"), parsed)
        fo = io.BytesIO(payload)
        try:
            datum = fastavro.schemaless_reader(fo, writer, None)
        except Exception as exc:  # fastavro raises many kinds on garbage
            errors.append((i, DECODE, clip_message(f"invalid avro: {type(exc).__name__}: {exc}")))
            continue
        if fo.tell() != len(payload):
            errors.append((i, DECODE, f"invalid avro: {len(payload) - fo.tell()} trailing bytes after the datum"))
            continue
        if defaults and isinstance(datum, dict):
            for name, default in defaults:  # fastavro gives every field its writer has
                datum.setdefault(name, default)
        rows.append({"value": datum} if wrap else datum)
        good.append(i)
    decoded = rows_to_batch(rows, good, schema, errors)
    return with_unknown_rows(decoded, rows, good, schema) if unknown_fields else decoded


def rows_to_batch(rows: list[Any], good: list[int], schema: pa.Schema, errors: list[RecordFault]) -> Decoded:
    """``rows`` (decoded values, ``None`` for a tombstone) of the inputs ``good`` as a batch of
    ``schema``; a row that does not fit it is a fault (appended to ``errors``)."""
    if not good:
        return Decoded(empty_batch(schema), NO_ROWS, list(errors))
    dicts = [row if row is not None else {} for row in rows]
    try:
        batch = pa.RecordBatch.from_pylist(dicts, schema=schema)
        return Decoded(batch, np.asarray(good, dtype=np.int64), list(errors))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    # Slow path: find the rows Arrow rejects (a value outside the declared Arrow type).
    kept: list[dict[str, Any]] = []
    kept_idx: list[int] = []
    for i, row in zip(good, dicts, strict=True):
        try:
            pa.RecordBatch.from_pylist([row], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            errors.append((i, DECODE, clip_message(f"avro datum does not fit the output schema: {exc}")))
            continue
        kept.append(row)
        kept_idx.append(i)
    batch = pa.RecordBatch.from_pylist(kept, schema=schema) if kept else empty_batch(schema)
    return Decoded(batch, np.asarray(kept_idx, dtype=np.int64), sorted(errors))


def with_unknown_rows(decoded: Decoded, rows: list[Any], good: list[int], schema: pa.Schema) -> Decoded:
    """``decoded`` plus each good datum's fields ``schema`` lacks (a datum Arrow rejected is not
    among ``decoded.good``)."""
    by_index = dict(zip(good, rows, strict=True))
    objects = (by_index[int(i)] for i in decoded.good)
    column = unknown_column(objects, schema.names)
    return Decoded(decoded.batch.append_column(UNKNOWN_FIELD, column), decoded.good, decoded.errors)


def avro_json(avro_schema: Any) -> Any:
    """An Avro schema as JSON values, from JSON text, a type name, a dict or a list."""
    if isinstance(avro_schema, str):
        stripped = avro_schema.strip()
        if stripped[:1] in ("{", "[", '"'):
            return json.loads(stripped)
        return stripped  # a primitive type name such as "string"
    if isinstance(avro_schema, Mapping):
        return dict(avro_schema)
    if isinstance(avro_schema, list):
        return list(avro_schema)
    raise TypeError(f"an Avro schema is JSON text or a dict, got {type(avro_schema).__name__}")


def _strip_logical(node: Any, logical: str) -> Any:
    if isinstance(node, list):
        return [_strip_logical(n, logical) for n in node]
    if isinstance(node, Mapping):
        return {k: _strip_logical(v, logical) for k, v in node.items() if not (k == "logicalType" and v == logical)}
    return node


def _is_avro_record(parsed: Any) -> bool:
    return isinstance(parsed, Mapping) and parsed.get("type") == "record"


_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}

#: Logical types whose Arrow type is their plain Avro value. Delta has no time-of-day type, so
#: ``time-millis`` stays milliseconds after midnight (int) and ``time-micros`` microseconds (long),
#: as Spark's Avro reader maps them; UUIDs stay plain strings.
_AVRO_RAW_LOGICAL = ("uuid", "time-millis", "time-micros")

#: Delta's widest decimal: a wider Avro decimal has no lossless column type.
_MAX_DECIMAL_PRECISION = 38

_AVRO_LOGICAL: dict[tuple[str, str], pa.DataType] = {
    ("int", "date"): pa.date32(),
    ("int", "time-millis"): pa.int32(),
    ("long", "time-micros"): pa.int64(),
    ("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
    ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
    ("long", "local-timestamp-millis"): pa.timestamp("ms"),
    ("long", "local-timestamp-micros"): pa.timestamp("us"),
    ("string", "uuid"): pa.string(),
}


def _avro_type(node: Any, named: dict[str, Any], field: str) -> Any:
    """Arrow type for an Avro type node; a record returns a struct type (iterable of fields)."""
    if isinstance(node, str):
        if node in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[node]
        if node in named:
            return named[node]
        raise ConfigError(field, f"unknown Avro type {node!r}")
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        if len(branches) == 1:
            return _avro_type(branches[0], named, field)
        raise ConfigError(field, f"only ['null', T] unions are supported, got {node!r}")
    if not isinstance(node, Mapping):
        raise ConfigError(field, f"invalid Avro type node {node!r}")
    kind = node.get("type")
    logical = node.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(node["precision"]), int(node.get("scale", 0))
        if precision > _MAX_DECIMAL_PRECISION:
            raise ConfigError(
                field, f"Avro decimal precision {precision} exceeds Delta's maximum of {_MAX_DECIMAL_PRECISION}"
            )
        result: Any = pa.decimal128(precision, scale)
    elif isinstance(kind, str) and isinstance(logical, str) and (kind, logical) in _AVRO_LOGICAL:
        result = _AVRO_LOGICAL[(kind, logical)]
    elif kind == "record":
        fields = []
        for f in node.get("fields", []):
            # Every column is nullable: a tombstone decodes to a row of nulls.
            fields.append(pa.field(f["name"], _avro_type(f["type"], named, field)))
        result = pa.struct(fields)
    elif kind == "enum":
        result = pa.string()
    elif kind == "array":
        result = pa.list_(_avro_type(node["items"], named, field))
    elif kind == "map":
        result = pa.map_(pa.string(), _avro_type(node["values"], named, field))
    elif kind == "fixed":
        result = pa.binary(int(node["size"]))
    else:
        result = _avro_type(kind, named, field)
    if kind in ("record", "enum", "fixed") and "name" in node:
        named[node["name"]] = result
        if "namespace" in node:
            named[f"{node['namespace']}.{node['name']}"] = result
    return result
