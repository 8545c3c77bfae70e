"""Protobuf: registry schemas to message classes, messages to Arrow rows.

A Protobuf schema in the registry is a file (a base64 ``FileDescriptorProto`` when asked for the
serialized form) that may import others by reference; :func:`message_classes` builds them into a
fresh descriptor pool, with the well-known types, and finds a message by the indexes the wire
format carries (``[0]`` is the file's first message, ``[1, 0]`` the first nested message of the
second). Messages are parsed by the ``protobuf`` library (upb, in C) and turned into Arrow rows:

=============================================  ===========================================
Protobuf                                       Arrow (and so Delta)
=============================================  ===========================================
double, float                                  float64, float32
int32, sint32, sfixed32                        int32
int64, sint64, sfixed64, uint32, fixed32       int64 (an unsigned 32-bit value fits)
uint64, fixed64                                decimal(20, 0) (Delta has no unsigned type)
bool, string, bytes                            bool, string, binary
enum                                           string: the value's name (its number when unknown)
message                                        struct of its fields
repeated T                                     list<T>
map<K, V>                                      map<K, V>
oneof                                          its members as nullable fields; only the set one has a value
google.protobuf.Timestamp                      timestamp[us, UTC]
google.protobuf.Duration                       int64 microseconds (Delta has no duration type)
google.protobuf.*Value wrappers                the wrapped type, null when unset
google.protobuf.Struct, Value, ListValue       string: the JSON text
google.protobuf.Any                            struct<type_url: string, value: binary>
google.protobuf.FieldMask                      string: the paths, comma-separated
=============================================  ===========================================

A field with presence (``optional``, a message, a oneof member) is null when unset; a proto3
scalar without presence is its default (``0``, ``""``), as every Protobuf reader sees it.
Recursive messages have no finite Arrow type: a config error, at definition.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["Converter", "converter", "message_classes", "message_indexes", "proto_to_arrow_schema"]

#: A message to its row: a dict of field name -> Arrow-ready Python value.
Converter = Callable[[Any], dict[str, Any]]

_US = 1_000_000
_WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.decimal128(20, 0),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
_JSON_TYPES = ("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue")


def message_indexes(payload: bytes | memoryview) -> tuple[tuple[int, ...], int]:
    """The message indexes at the head of a Protobuf payload and where the message starts.

    Confluent's encoding: a zigzag varint count, then that many zigzag varints; a single ``0``
    byte means ``[0]``. Raises ``ValueError`` on a truncated or absurd header.
    """
    count, at = _varint(payload, 0)
    if count == 0:
        return (0,), at
    if count < 0 or count > 64:
        raise ValueError(f"invalid Protobuf message-index count {count}")
    out = []
    for _ in range(count):
        index, at = _varint(payload, at)
        if index < 0:
            raise ValueError(f"invalid Protobuf message index {index}")
        out.append(index)
    return tuple(out), at


def _varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated Protobuf message indexes")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def message_classes(files: Sequence[tuple[str, str]]) -> Callable[[tuple[int, ...]], Any]:
    """Message classes of the last of ``files`` (``(name, base64 FileDescriptorProto)``, its
    imports before it), by message indexes. Raises ``ValueError`` if a schema does not build."""
    from google.protobuf import (
        any_pb2,
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        message_factory,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    pool = descriptor_pool.DescriptorPool()
    known = (any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)
    names = {module.DESCRIPTOR.name for module in known}
    for module in known:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    last = None
    for name, text in files:
        if name in names:
            continue
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(base64.standard_b64decode(text.encode("ascii")))
        except Exception as exc:  # a .proto text or garbage: not the serialized form
            raise ValueError(f"Protobuf schema {name!r} is not a serialized descriptor: {exc}") from exc
        proto.name = name
        try:
            last = pool.Add(proto)
        except Exception as exc:  # a missing import, a clash
            raise ValueError(f"Protobuf schema {name!r} does not build: {exc}") from exc
        names.add(name)
    if last is None:
        raise ValueError("no Protobuf schema")
    file = pool.FindFileByName(files[-1][0])

    def find(indexes: tuple[int, ...]) -> Any:
        candidates = list(file.message_types_by_name.values())
        descriptor = None
        for index in indexes:
            if index >= len(candidates):
                raise ValueError(f"no message at indexes {list(indexes)} in {files[-1][0]!r}")
            descriptor = candidates[index]
            candidates = list(descriptor.nested_types)
        if descriptor is None:
            raise ValueError("empty message indexes")
        return message_factory.GetMessageClass(descriptor)

    return find


def proto_to_arrow_schema(descriptor: Any) -> pa.Schema:
    """The Arrow schema of a message's fields (see the module's table). ``ValueError`` on a
    recursive message or one with nothing to hold."""
    return pa.schema(list(_struct(descriptor, ())))


def _struct(descriptor: Any, seen: tuple[str, ...]) -> pa.StructType:
    if descriptor.full_name in seen:
        raise ValueError(f"message {descriptor.full_name} is recursive: it has no finite Arrow type")
    fields = [pa.field(f.name, _field_type(f, (*seen, descriptor.full_name))) for f in descriptor.fields]
    if not fields:
        raise ValueError(f"message {descriptor.full_name} has no fields: it has no Arrow type")
    return pa.struct(fields)


def _field_type(f: Any, seen: tuple[str, ...]) -> pa.DataType:
    if _is_map(f):
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return pa.map_(_single_type(key, seen), _single_type(value, seen))
    single = _single_type(f, seen)
    return pa.list_(single) if _repeated(f) else single


def _single_type(f: Any, seen: tuple[str, ...]) -> pa.DataType:
    from google.protobuf.descriptor import FieldDescriptor as F

    if f.type == F.TYPE_MESSAGE or f.type == F.TYPE_GROUP:
        name = f.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return pa.timestamp("us", tz="UTC")
        if name == "google.protobuf.Duration":
            return pa.int64()
        if name in _WRAPPERS:
            return _WRAPPERS[name]
        if name in _JSON_TYPES or name == "google.protobuf.FieldMask":
            return pa.string()
        if name == "google.protobuf.Any":
            return pa.struct([pa.field("type_url", pa.string()), pa.field("value", pa.binary())])
        return _struct(f.message_type, seen)
    return _SCALARS[f.type]()


def _scalars() -> dict[int, Callable[[], pa.DataType]]:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {
        F.TYPE_DOUBLE: pa.float64,
        F.TYPE_FLOAT: pa.float32,
        F.TYPE_INT32: pa.int32,
        F.TYPE_SINT32: pa.int32,
        F.TYPE_SFIXED32: pa.int32,
        F.TYPE_INT64: pa.int64,
        F.TYPE_SINT64: pa.int64,
        F.TYPE_SFIXED64: pa.int64,
        F.TYPE_UINT32: pa.int64,
        F.TYPE_FIXED32: pa.int64,
        F.TYPE_UINT64: lambda: pa.decimal128(20, 0),
        F.TYPE_FIXED64: lambda: pa.decimal128(20, 0),
        F.TYPE_BOOL: pa.bool_,
        F.TYPE_STRING: pa.string,
        F.TYPE_BYTES: pa.binary,
        F.TYPE_ENUM: pa.string,
    }


class _LazyScalars(dict[int, Callable[[], pa.DataType]]):
    """The scalar table, built on first use (the protobuf import is optional)."""

    def __missing__(self, key: int) -> Callable[[], pa.DataType]:
        if not self:
            self.update(_scalars())
            return self[key]
        raise KeyError(key)


_SCALARS = _LazyScalars()


def converter(descriptor: Any) -> Converter:
    """A function from a parsed message of ``descriptor`` to its row (the module's table)."""
    getters = [(f.name, _getter(f)) for f in descriptor.fields]

    def convert(message: Any) -> dict[str, Any]:
        return {name: get(message) for name, get in getters}

    return convert


def _getter(f: Any) -> Callable[[Any], Any]:
    name = f.name
    if _is_map(f):
        key_of = _value_of(f.message_type.fields_by_name["key"])
        value_of = _value_of(f.message_type.fields_by_name["value"])
        return lambda m: [(key_of(k), value_of(v)) for k, v in getattr(m, name).items()]
    one = _value_of(f)
    if _repeated(f):
        return lambda m: [one(v) for v in getattr(m, name)]
    if f.has_presence:
        return lambda m: one(getattr(m, name)) if m.HasField(name) else None
    return lambda m: one(getattr(m, name))


def _value_of(f: Any) -> Callable[[Any], Any]:
    from google.protobuf.descriptor import FieldDescriptor as F

    if f.type == F.TYPE_ENUM:
        names = {v.number: v.name for v in f.enum_type.values}
        return lambda v: names.get(v, str(v))
    if f.type != F.TYPE_MESSAGE and f.type != F.TYPE_GROUP:
        return _identity
    full = f.message_type.full_name
    if full == "google.protobuf.Timestamp":
        return lambda v: v.seconds * _US + v.nanos // 1000
    if full == "google.protobuf.Duration":
        return lambda v: v.seconds * _US + int(v.nanos / 1000)
    if full in _WRAPPERS:
        return lambda v: v.value
    if full in _JSON_TYPES:
        from google.protobuf.json_format import MessageToDict

        return lambda v: json.dumps(MessageToDict(v), separators=(",", ":"), ensure_ascii=False)
    if full == "google.protobuf.FieldMask":
        return lambda v: ",".join(v.paths)
    if full == "google.protobuf.Any":
        return lambda v: {"type_url": v.type_url, "value": v.value}
    return converter(f.message_type)


def _identity(v: Any) -> Any:
    return v


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated)


def _is_map(f: Any) -> bool:
    return bool(_repeated(f) and f.message_type is not None and f.message_type.GetOptions().map_entry)
