"""Registry formats: values in the Confluent wire format, decoded with their writer's schema.

A value is magic byte ``0``, a 4-byte big-endian schema id, then the payload: an Avro binary
datum, a Protobuf message after its message indexes, or JSON text. :class:`RegistryDecoder`
decodes a whole batch at a time:

Step 1: the framing of every value is read at once (a vectorised read of the first five bytes
when the values sit in one buffer). A value without it is a ``decode`` fault; a tombstone is a
row of nulls.
Step 2: the distinct schema ids of the batch are resolved through the registry
(:mod:`reclock.sources.decode.registry`), once per id and process: a batch of one producer costs
one lookup the first time and none after. An id the registry does not hold makes each of its
records an ``unknown_schema`` fault; an id of another kind of schema (a Protobuf id on an Avro
output) a ``schema`` fault; a registry that does not answer fails the batch as a
:class:`~reclock.sources.decode.registry.RegistryUnavailable` (transient: the pipeline stalls,
then retries the same batch). No row is ever decoded with a schema that is not its writer's.
Step 3: each id's values are decoded with that writer schema into the output's schema: fields the
output lacks are dropped, or kept as :data:`~reclock.timeline.frontier.UNKNOWN_FIELDS` when the
output evolves (``schema_evolution``); an Avro field the writer lacks takes the reader schema's
default (Avro's schema resolution), any other is null; a value that does not
parse, or whose field does not convert to its column's type, is a ``decode`` fault; a JSON payload
that parses but does not validate against its writer schema is a ``schema_mismatch`` fault
(:mod:`reclock.sources.decode.json_validation`).
Step 4: the rows are put back in input order.

Whether a value is good depends on it and its writer schema only, never on its batch, so a
replay gives the same rows and the same faults.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa

from reclock.sources.base import clip_message
from reclock.sources.decode.avro import decode_avro, reading_schema, rows_to_batch, with_unknown_rows
from reclock.sources.decode.avro_columns import column_plan, decode_columns
from reclock.sources.decode.formats import Decoder
from reclock.sources.decode.registry import (
    RegistrySettings,
    UnknownSchema,
    WriterSchema,
    fetch_schema,
    fetch_version,
)
from reclock.sources.decode.result import DECODE, NO_ROWS, Decoded, RecordFault, empty_batch
from reclock.sources.decode.unknown import UNKNOWN_FIELD
from reclock.sources.decode.values import Values

__all__ = [
    "REGISTRY_FORMATS",
    "SCHEMA",
    "UNKNOWN_SCHEMA",
    "RegistryDecoder",
    "json_schema_columns",
    "protobuf_files",
    "reader_columns",
]

RegistryFormat = Literal["avro", "protobuf", "json"]
REGISTRY_FORMATS: tuple[str, ...] = ("avro", "protobuf", "json")

#: ``kind`` of a record whose schema id the registry does not hold.
UNKNOWN_SCHEMA = "unknown_schema"
#: ``kind`` of a record whose writer schema this output cannot read (another format, a schema
#: that does not build).
SCHEMA = "schema"

_HEADER = 5
_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json": "JSON"}

#: One id's values decoded: ``(values, faults) -> Decoded`` (indices local to ``values``).
_Reader = Callable[[Sequence[bytes], list[RecordFault]], Decoded]


@dataclass(frozen=True)
class RegistryDecoder:
    """A picklable decoder of registry-framed values into ``schema``; the registry's client and
    the writer schemas it resolved stay in the process that resolved them."""

    format: RegistryFormat
    schema: pa.Schema
    registry: RegistrySettings
    #: Add :data:`~reclock.timeline.frontier.UNKNOWN_FIELDS` (see :mod:`reclock.sources.decode.unknown`).
    unknown_fields: bool = False
    #: Avro: ``(column, value)`` of the reader schema's field defaults, for datums whose writer
    #: schema lacks the field (Avro's schema resolution; :func:`~reclock.sources.decode.avro.reader_defaults`).
    defaults: tuple[tuple[str, Any], ...] = ()
    _readers: dict[int, _Reader | RecordFault] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_readers"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_readers", {})

    @property
    def out_schema(self) -> pa.Schema:
        return self.schema.append(UNKNOWN_FIELD) if self.unknown_fields else self.schema

    def decode(self, values: Sequence[bytes | None], *, fail_fast: bool = False) -> Decoded:
        """Decode ``values``; every index lands in ``good`` or in ``errors``, never both. With
        ``fail_fast`` only the first fault (lowest index) is returned, with no rows. Raises
        :class:`~reclock.sources.decode.registry.RegistryUnavailable` when an id cannot be resolved
        for want of an answer."""
        faults: list[RecordFault] = []
        # Step 1: framing.
        ids = _schema_ids(values)
        tombstones = np.flatnonzero(ids == _TOMBSTONE)
        for i in np.flatnonzero(ids == _UNFRAMED):
            faults.append((int(i), DECODE, "missing Confluent framing (magic byte 0 + 4-byte schema id)"))
        chunks: list[tuple[np.ndarray, Decoded]] = []
        if len(tombstones):
            chunks.append((tombstones, _nulls(self.out_schema, len(tombstones))))
        # Step 2 and 3: per schema id, resolved then decoded.
        framed = ids >= 0
        for schema_id in np.unique(ids[framed]).tolist():
            at = np.flatnonzero(ids == schema_id)
            reader = self._reader(int(schema_id))
            if not callable(reader):
                _, kind, message = reader
                faults.extend((int(i), kind, message) for i in at)
                continue
            local: list[RecordFault] = []
            group = values if len(at) == len(values) else [values[int(i)] for i in at]
            decoded = reader(cast("Sequence[bytes]", group), local)  # framed: none of them is None
            faults.extend((int(at[i]), kind, message) for i, kind, message in local)
            if len(decoded.good):
                chunks.append((at[decoded.good], decoded))
        faults.sort()
        if fail_fast and faults:
            return Decoded(empty_batch(self.out_schema), NO_ROWS, faults[:1])
        # Step 4: input order.
        if not chunks:
            return Decoded(empty_batch(self.out_schema), NO_ROWS, faults)
        order = np.concatenate([where for where, _ in chunks])
        table = pa.Table.from_batches([d.batch.select(self.out_schema.names).cast(self.out_schema) for _, d in chunks])
        if len(chunks) > 1:
            perm = np.argsort(order, kind="stable")
            table = table.take(pa.array(perm))
            order = order[perm]
        table = table.combine_chunks()
        batches = table.to_batches()
        return Decoded(batches[0] if batches else empty_batch(self.out_schema), order, faults)

    # -- resolving a schema id to a reader -----------------------------------------------------

    def _reader(self, schema_id: int) -> _Reader | RecordFault:
        """The reader of ``schema_id``'s values, or the fault every such value is (cached)."""
        known = self._readers.get(schema_id)
        if known is not None:
            return known
        try:
            writer = fetch_schema(self.registry, schema_id, serialized=self.format == "protobuf")
        except UnknownSchema as exc:
            known = (-1, UNKNOWN_SCHEMA, clip_message(f"schema id {schema_id} is not in the registry: {exc}"))
        else:
            known = self._build(writer)
        self._readers[schema_id] = known
        return known

    def _build(self, writer: WriterSchema) -> _Reader | RecordFault:
        if writer.schema_type != _TYPES[self.format]:
            return (
                -1,
                SCHEMA,
                f"schema id {writer.schema_id} is a {writer.schema_type} schema; this output reads {self.format}",
            )
        try:
            if self.format == "avro":
                return self._avro(writer)
            if self.format == "json":
                return self._json(writer)
            return self._protobuf(writer)
        except (ValueError, TypeError, KeyError) as exc:
            return (-1, SCHEMA, clip_message(f"schema id {writer.schema_id} cannot be read: {exc}"))
        except Exception as exc:  # fastavro's SchemaParseException and friends
            return (
                -1,
                SCHEMA,
                clip_message(f"schema id {writer.schema_id} cannot be read: {type(exc).__name__}: {exc}"),
            )

    def _avro(self, writer: WriterSchema) -> _Reader:
        parsed = reading_schema(writer.text)
        plan = column_plan(json.loads(writer.text))
        if plan is not None and self.unknown_fields and set(plan.names) - set(self.schema.names):
            plan = None  # new fields to keep: their JSON comes from the datum-by-datum path only

        fields = parsed.get("fields", ()) if isinstance(parsed, dict) else ()
        written = {f["name"] for f in fields}
        missing = [(name, value) for name, value in self.defaults if name not in written]

        def read(values: Sequence[bytes], faults: list[RecordFault]) -> Decoded:
            if plan is not None:
                body, sizes = _bodies(values)
                batch = decode_columns(plan, body, sizes, self.schema)
                if batch is not None:
                    if self.unknown_fields:
                        batch = batch.append_column(UNKNOWN_FIELD, pa.nulls(batch.num_rows, pa.string()))
                    return _with_defaults(Decoded(batch, np.arange(len(values), dtype=np.int64), []), missing)
            decoded = decode_avro(values, parsed, self.schema, True, faults, unknown_fields=self.unknown_fields)
            return _with_defaults(decoded, missing)

        return read

    def _json(self, writer: WriterSchema) -> _Reader:
        from reclock.sources.decode.json_validation import JsonValidator

        inner = Decoder("json", self.schema, unknown_fields=self.unknown_fields)
        validator = JsonValidator(writer.schema_id, json.loads(writer.text), json_references(self.registry, writer))

        def read(values: Sequence[bytes], faults: list[RecordFault]) -> Decoded:
            payloads = [v[_HEADER:] for v in values]
            decoded = inner.decode(payloads)
            invalid = validator.invalid([payloads[int(i)] for i in decoded.good])
            # a payload its columns refused may still be JSON its writer schema refuses: that
            # is the producer's fault, and what it is called (``"seven"`` where ``integer`` is due)
            faults.extend(validator.mismatched(payloads, decoded.errors))
            if not invalid:
                return decoded
            keep = np.ones(len(decoded.good), bool)
            keep[[i for i, _, _ in invalid]] = False
            faults.extend((int(decoded.good[i]), kind, message) for i, kind, message in invalid)
            return Decoded(decoded.batch.filter(pa.array(keep)), decoded.good[keep], decoded.errors)

        return read

    def _protobuf(self, writer: WriterSchema) -> _Reader:
        from google.protobuf.message import DecodeError

        from reclock.sources.decode.protobuf import converter, message_classes, message_indexes

        find = message_classes(protobuf_files(self.registry, writer))
        by_indexes: dict[tuple[int, ...], tuple[Any, Callable[[Any], dict[str, Any]]]] = {}

        def read(values: Sequence[bytes], faults: list[RecordFault]) -> Decoded:
            rows: list[Any] = []
            good: list[int] = []
            for i, value in enumerate(values):
                try:
                    indexes, start = message_indexes(value[_HEADER:])
                    if indexes not in by_indexes:
                        cls = find(indexes)
                        by_indexes[indexes] = (cls, converter(cls.DESCRIPTOR))
                    cls, convert = by_indexes[indexes]
                    row = convert(cls.FromString(value[_HEADER + start :]))
                except (ValueError, DecodeError) as exc:
                    faults.append((i, DECODE, clip_message(f"invalid protobuf: {exc}")))
                    continue
                rows.append(row)
                good.append(i)
            decoded = rows_to_batch(rows, good, self.schema, faults)
            return with_unknown_rows(decoded, rows, good, self.schema) if self.unknown_fields else decoded

        return read


def protobuf_files(settings: RegistrySettings, writer: WriterSchema) -> list[tuple[str, str]]:
    """``writer`` and every schema it imports, imports first, as ``(name, base64 descriptor)``."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(schema: WriterSchema, name: str) -> None:
        for ref_name, subject, version in schema.references:
            if ref_name in seen or ref_name.startswith("google/protobuf/"):
                continue
            seen.add(ref_name)
            add(fetch_version(settings, subject, version, serialized=True), ref_name)
        out.append((name, schema.text))

    add(writer, f"schema-{writer.schema_id}.proto")
    return out


def json_references(settings: RegistrySettings, writer: WriterSchema) -> list[tuple[str, Any]]:
    """Every JSON Schema ``writer`` references, at any depth, as ``(name, parsed schema)``."""
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()

    def add(schema: WriterSchema) -> None:
        for name, subject, version in schema.references:
            if name not in seen:
                seen.add(name)
                referenced = fetch_version(settings, subject, version)
                add(referenced)
                out.append((name, json.loads(referenced.text)))

    add(writer)
    return out


_TOMBSTONE = -1
_UNFRAMED = -2


def _schema_ids(values: Sequence[bytes | None]) -> np.ndarray:
    """Per value its schema id, :data:`_TOMBSTONE` for ``None``, :data:`_UNFRAMED` without framing."""
    n = len(values)
    if isinstance(values, Values) and len(values.data):
        data = values.data
        heads = values.starts[:, None] + np.arange(_HEADER)
        heads = np.minimum(heads, len(data) - 1)
        b = data[heads].astype(np.int64)
        ids = (b[:, 1] << 24) | (b[:, 2] << 16) | (b[:, 3] << 8) | b[:, 4]
        ids[(values.lengths < _HEADER) | (b[:, 0] != 0)] = _UNFRAMED
        if values.valid is not None:
            ids[~values.valid] = _TOMBSTONE
        return ids
    ids = np.empty(n, np.int64)
    for i, value in enumerate(values):
        if value is None:
            ids[i] = _TOMBSTONE
        elif len(value) < _HEADER or value[0] != 0:
            ids[i] = _UNFRAMED
        else:
            ids[i] = int.from_bytes(value[1:_HEADER], "big")
    return ids


def _bodies(values: Sequence[bytes]) -> tuple[bytes, np.ndarray]:
    """The payloads of framed ``values`` end to end, without their headers, and their sizes."""
    if isinstance(values, Values):
        keep = np.ones(len(values.data), bool)
        keep[(values.starts[:, None] + np.arange(_HEADER)).ravel()] = False
        keep[values.starts + values.lengths] = False  # the newline after each value
        return values.data[keep].tobytes(), values.lengths - _HEADER
    sizes = np.fromiter((len(v) - _HEADER for v in values), np.int64, len(values))
    return b"".join([v[_HEADER:] for v in values]), sizes


def _with_defaults(decoded: Decoded, missing: list[tuple[str, Any]]) -> Decoded:
    """``decoded`` (rows of one writer schema, no tombstone) with the reader's default in each
    column its writer lacks."""
    batch = decoded.batch
    for name, value in missing:
        at = batch.schema.get_field_index(name)
        batch = batch.set_column(
            at, batch.schema.field(at), pa.array([value] * batch.num_rows, batch.schema.field(at).type)
        )
    return Decoded(batch, decoded.good, decoded.errors)


def _nulls(schema: pa.Schema, n: int) -> Decoded:
    batch = pa.RecordBatch.from_arrays([pa.nulls(n, f.type) for f in schema], schema=schema)
    return Decoded(batch, np.arange(n, dtype=np.int64), [])


def reader_columns(
    format: RegistryFormat, settings: RegistrySettings, subject: str, version: int, message: str | None = None
) -> tuple[pa.Schema, tuple[tuple[str, Any], ...]]:
    """The output columns of a reader schema pinned in the registry (``subject`` at ``version``):
    an Avro record's fields, a Protobuf message's (``message``, by full name; the file's first by
    default), a JSON Schema object's properties; and for Avro the fields' defaults (see
    :func:`~reclock.sources.decode.avro.reader_defaults`). Raises ``ValueError`` when it has no
    columns or a default does not fit, :class:`UnknownSchema` when the registry does not hold it."""
    from reclock.sources.decode.avro import avro_to_arrow_schema, reader_defaults

    reader = fetch_version(settings, subject, version, serialized=format == "protobuf")
    if reader.schema_type != _TYPES[format]:
        raise ValueError(f"{subject} version {version} is a {reader.schema_type} schema, not {format}")
    if format == "avro":
        columns = avro_to_arrow_schema(json.loads(reader.text))
        return columns, reader_defaults(reader.text, columns)
    if format == "json":
        return json_schema_columns(json.loads(reader.text)), ()
    from reclock.sources.decode.protobuf import message_classes, proto_to_arrow_schema

    file = message_classes(protobuf_files(settings, reader))((0,)).DESCRIPTOR.file
    names = sorted(d.full_name for d in file.message_types_by_name.values())
    if message is None and len(names) > 1:
        raise ValueError(f"the schema has messages {', '.join(names)}: name one as reader_schema.message")
    try:
        descriptor = file.pool.FindMessageTypeByName(message or names[0])
    except KeyError:
        raise ValueError(f"no message {message!r} in the schema (it has {', '.join(names)})") from None
    return proto_to_arrow_schema(descriptor), ()


_JSON_SCALARS = {"integer": pa.int64(), "number": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}


def json_schema_columns(schema: Any) -> pa.Schema:
    """The columns of a JSON Schema ``object``: its ``properties`` (``integer`` int64, ``number``
    float64, ``string`` string, or timestamp[us, UTC] with ``format: date-time``, ``boolean``,
    ``array`` list, ``object`` struct; ``["T", "null"]`` is a nullable ``T``). Anything else
    (``$ref``, ``oneOf``, an object without properties) raises ``ValueError``: give ``schema``."""
    columns = _json_type(schema, "schema")
    if not isinstance(columns, pa.StructType):
        raise ValueError("the JSON Schema is not an object with properties")
    return pa.schema(list(columns))


def _json_type(node: Any, where: str) -> pa.DataType:
    if not isinstance(node, dict):
        raise ValueError(f"{where}: not a JSON Schema")
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f"{where}: only one type besides null is supported, got {kind}")
        kind = kinds[0]
    if kind == "object" and isinstance(node.get("properties"), dict) and node["properties"]:
        return pa.struct([pa.field(k, _json_type(v, f"{where}.{k}")) for k, v in node["properties"].items()])
    if kind == "array" and isinstance(node.get("items"), dict):
        return pa.list_(_json_type(node["items"], f"{where}[]"))
    if kind == "string" and node.get("format") == "date-time":
        return pa.timestamp("us", tz="UTC")
    if kind in _JSON_SCALARS:
        return _JSON_SCALARS[kind]
    raise ValueError(f"{where}: type {kind!r} has no column type here; give the output's schema")
