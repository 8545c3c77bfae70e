"""Options of a format, checked when a pipeline is defined: the :class:`Decoder` they build.

A bad option fails at definition with a :class:`~reclock.errors.ConfigError` naming the field
(prefixed by the caller's ``field``, such as ``outputs.orders.format``), never later on a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from reclock.errors import ConfigError
from reclock.sources.decode.avro import avro_json, avro_to_arrow_schema, reader_defaults
from reclock.sources.decode.confluent import REGISTRY_FORMATS, RegistryDecoder, reader_columns
from reclock.sources.decode.formats import FORMATS, Decoder
from reclock.sources.decode.registry import RegistryUnavailable, UnknownSchema, check_registry

__all__ = ["as_schema", "make_decoder", "make_registry_decoder"]

_VALUE_TEXT = pa.schema([pa.field("value", pa.string())])
_VALUE_BYTES = pa.schema([pa.field("value", pa.binary())])


def make_decoder(
    format: str,
    schema: pa.Schema | None = None,
    *,
    delimiter: str = ",",
    quote_char: str = '"',
    avro_schema: str | Mapping[str, Any] | None = None,
    confluent: bool = False,
    avro_writer_schemas: Mapping[Any, Any] | None = None,
    field: str = "format",
) -> Decoder:
    """Validate a format's options and build its :class:`Decoder`.

    ``schema`` is the output's payload schema: required for ``json`` and ``csv``, fixed for
    ``text`` (``value: string``) and ``bytes`` (``value: binary``), derived from ``avro_schema``
    for ``avro`` when not given; ``avro_writer_schemas`` maps Confluent schema ids to producers'
    later writer schemas. ``field`` prefixes :class:`ConfigError` field names.
    """
    if format not in FORMATS:
        raise ConfigError(field, f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    schema = as_schema(schema, field=f"{field}.schema")
    if format in ("json", "csv"):
        if schema is None or len(schema) == 0:
            raise ConfigError(f"{field}.schema", f"format {format!r} needs a schema with at least one column")
        if format == "csv":
            for name, value in (("delimiter", delimiter), ("quote_char", quote_char)):
                if not isinstance(value, str) or len(value) != 1 or value in "\r\n":
                    raise ConfigError(f"{field}.{name}", f"must be one character other than a newline, got {value!r}")
            if delimiter == quote_char:
                raise ConfigError(f"{field}.delimiter", "must differ from quote_char")
        # ``format`` is one of FORMATS (checked on entry); mypy narrows no str to a Literal by membership.
        return Decoder(format, schema, delimiter=delimiter, quote_char=quote_char)  # type: ignore[arg-type]
    if format == "text":
        _fixed(schema, _VALUE_TEXT, f"{field}.schema")
        return Decoder("text", _VALUE_TEXT)
    if format == "bytes":
        _fixed(schema, _VALUE_BYTES, f"{field}.schema")
        return Decoder("bytes", _VALUE_BYTES)
    if avro_schema is None:
        raise ConfigError(f"{field}.avro_schema", "format 'avro' needs an avro_schema (JSON text or a dict)")
    try:
        parsed = avro_json(avro_schema)
        import fastavro

        fastavro.parse_schema(parsed)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{field}.avro_schema", f"invalid Avro schema: {exc}") from exc
    except Exception as exc:  # fastavro's SchemaParseException and friends
        raise ConfigError(f"{field}.avro_schema", f"invalid Avro schema: {exc}") from exc
    derived = avro_to_arrow_schema(parsed, field=f"{field}.avro_schema")
    writers = _writer_schemas(avro_writer_schemas, bool(confluent), f"{field}.avro_writer_schemas")
    try:
        defaults = reader_defaults(parsed, schema if schema is not None else derived) if writers else ()
    except ValueError as exc:
        raise ConfigError(f"{field}.avro_schema", str(exc)) from None
    return Decoder(
        "avro",
        schema if schema is not None else derived,
        avro_schema=parsed,
        confluent=bool(confluent),
        avro_writer_schemas=writers,
        avro_defaults=defaults,
    )


def make_registry_decoder(
    format: str,
    schema: pa.Schema | Mapping[str, Any] | None,
    *,
    schema_registry: Any,
    reader_schema: Any = None,
    default_subject: str | None = None,
    field: str = "format",
    reader_field: str = "reader_schema",
) -> RegistryDecoder:
    """A decoder of Confluent-framed ``avro``, ``protobuf`` or ``json`` values, their writer
    schemas resolved through ``schema_registry``.

    The output's columns are ``schema`` when given; otherwise those of the reader schema pinned
    in the registry, ``reader_schema = {subject, version, message}`` (``subject`` defaults to
    ``default_subject``, the topic's ``<topic>-value``; ``version`` is a number, so a restart
    never finds other columns; ``message`` picks a Protobuf message by full name). Reading the
    reader schema needs the registry: an outage here is a :class:`ConfigError` saying so.
    ``field`` prefixes :class:`ConfigError` field names (``outputs.orders``); ``reader_field``
    names the reader-schema option (``key_schema`` for keys).
    """
    if format not in REGISTRY_FORMATS:
        raise ConfigError(f"{field}.format", f"with schema_registry, format is one of {', '.join(REGISTRY_FORMATS)}")
    settings = check_registry(schema_registry, f"{field}.schema_registry")
    columns = as_schema(schema, field=f"{field}.schema")
    defaults: tuple[tuple[str, Any], ...] = ()
    if columns is None:
        where = f"{field}.{reader_field}"
        if not isinstance(reader_schema, Mapping):
            raise ConfigError(where, "give the output's schema, or reader_schema = {subject = ..., version = N}")
        unknown = sorted(set(reader_schema) - {"subject", "version", "message"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", "unknown option; expected subject, version, message")
        subject = reader_schema.get("subject", default_subject)
        version = reader_schema.get("version")
        message = reader_schema.get("message")
        if not isinstance(subject, str) or not subject:
            raise ConfigError(f"{where}.subject", "needed when an output reads several topics")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ConfigError(f"{where}.version", "must be a version number >= 1 (pinned: a restart reads the same)")
        if message is not None and (format != "protobuf" or not isinstance(message, str)):
            raise ConfigError(f"{where}.message", "a Protobuf message's full name, for format 'protobuf' only")
        try:
            columns, defaults = reader_columns(format, settings, subject, version, message)  # type: ignore[arg-type]
        except RegistryUnavailable as exc:
            raise ConfigError(where, f"cannot read {subject} version {version}: {exc}") from None
        except UnknownSchema as exc:
            raise ConfigError(where, f"{subject} version {version} is not in the registry: {exc}") from None
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            raise ConfigError(where, f"{subject} version {version}: {exc}") from None
    if len(columns) == 0:
        raise ConfigError(f"{field}.schema", "needs at least one column")
    return RegistryDecoder(format, columns, settings, defaults=defaults)  # type: ignore[arg-type]


def _writer_schemas(writers: Mapping[Any, Any] | None, confluent: bool, field: str) -> tuple[tuple[int, Any], ...]:
    """``{schema id: writer schema}`` checked: ids are integers, schemas parse, framing is on."""
    if not writers:
        return ()
    if not isinstance(writers, Mapping):
        raise ConfigError(field, "must map Confluent schema ids to Avro schemas")
    if not confluent:
        raise ConfigError(field, "needs confluent = true: a value names its writer schema by the framing's id")
    import fastavro

    out = []
    for key, schema in writers.items():
        try:
            schema_id = int(key)
            parsed = avro_json(schema)
            fastavro.parse_schema(parsed)
        except Exception as exc:  # a bad id or fastavro's SchemaParseException and friends
            raise ConfigError(f"{field}.{key}", f"invalid writer schema: {exc}") from exc
        out.append((schema_id, parsed))
    return tuple(sorted(out, key=lambda pair: pair[0]))


def as_schema(schema: Any, *, field: str = "schema") -> pa.Schema | None:
    """A :class:`pyarrow.Schema` from itself or from config text: ``{"id": "int64", "ts":
    "timestamp[ms]"}`` or ``[["id", "int64"], ...]`` (type names are pyarrow aliases)."""
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    if isinstance(schema, Mapping):
        pairs = list(schema.items())
    elif isinstance(schema, Sequence) and not isinstance(schema, str | bytes):
        pairs = []
        for item in schema:
            if not (isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2):
                raise ConfigError(field, f"list entries are [name, type] pairs, got {item!r}")
            pairs.append((item[0], item[1]))
    else:
        raise ConfigError(field, f"must be a pyarrow.Schema or a mapping column -> type, got {type(schema).__name__}")
    fields = []
    for name, type_name in pairs:
        if not isinstance(name, str) or not name:
            raise ConfigError(field, f"column names must be non-empty strings, got {name!r}")
        if isinstance(type_name, pa.DataType):
            fields.append(pa.field(name, type_name))
            continue
        try:
            fields.append(pa.field(name, pa.type_for_alias(str(type_name))))
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"{field}.{name}", f"unknown type {type_name!r} (use a pyarrow alias)") from exc
    return pa.schema(fields)


def _fixed(schema: pa.Schema | None, expected: pa.Schema, field: str) -> None:
    if schema is not None and not schema.equals(expected):
        raise ConfigError(field, f"this format always produces {expected.to_string()!r}; leave schema unset")
