"""Registry-framed payloads made by the ecosystem's own serializers, for the registry tests.

confluent-kafka's ``AvroSerializer``, ``ProtobufSerializer`` and ``JSONSerializer`` register their
schema in the registry (the stand-in, :mod:`reclock.demo.registry`) and frame every value, so the
bytes the tests decode are the ones a production producer writes, not ours. Each format has a
version 1 and a version 2 that adds a field (``color``), the mid-stream schema change.

The Protobuf messages are built from descriptors (no ``protoc`` on these machines): an ``Order``
with a nested message, a repeated field, a map, an enum, a oneof, a ``Timestamp`` and a wrapper.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

AVRO_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
AVRO_V2 = {**AVRO_V1, "fields": [*AVRO_V1["fields"], {"name": "color", "type": ["null", "string"], "default": None}]}

#: A reader schema whose fields declare defaults: ``amount``, ``note``, and fields version 1 does
#: not have (``color``, ``qty``, ``tag``, ``since``); Avro's schema resolution fills them in.
READER_V2 = {
    **AVRO_V1,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double", "default": -1.0},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "color", "type": "string", "default": "none"},
        {"name": "qty", "type": ["int", "null"], "default": 7},
        {"name": "tag", "type": "bytes", "default": "\u00ff\u0001"},
        {"name": "since", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 1_000},
    ],
}
#: Version 3 removes ``amount`` and ``since``: the reader's defaults stand in for them.
WRITER_V3 = {**AVRO_V1, "fields": [f for f in READER_V2["fields"] if f["name"] not in ("amount", "since")]}


JSON_V1 = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["id"],
}
JSON_V2 = {**JSON_V1, "properties": {**JSON_V1["properties"], "color": {"type": "string"}}}


def client(url: str, username: str | None = None, password: str | None = None, **ssl: str) -> SchemaRegistryClient:
    """The producer's client; ``ssl`` are its ``ssl.*`` settings with ``_`` for ``.``
    (``ca_location = ...``)."""
    config: dict[str, Any] = {"url": url, **{f"ssl.{k.replace('_', '.')}": v for k, v in ssl.items()}}
    if username is not None:
        config["basic.auth.user.info"] = f"{username}:{password}"
    return SchemaRegistryClient(config)


def avro_serializer(registry: SchemaRegistryClient, schema: dict) -> Callable[[str, dict], bytes]:
    serializer = AvroSerializer(registry, json.dumps(schema))
    return lambda topic, record: serializer(record, SerializationContext(topic, MessageField.VALUE))


def json_serializer(
    registry: SchemaRegistryClient, schema: dict, *, validate: bool = True
) -> Callable[[str, dict], bytes]:
    """``validate = False``: a producer that skips validation (confluent-kafka's ``validate``
    setting), so its bytes may not match the schema they name."""
    serializer = JSONSerializer(json.dumps(schema), registry, conf={"validate": validate})
    return lambda topic, record: serializer(record, SerializationContext(topic, MessageField.VALUE))


def protobuf_serializer(registry: SchemaRegistryClient, cls: Any) -> Callable[[str, Any], bytes]:
    serializer = ProtobufSerializer(cls, registry, {"use.deprecated.format": False})
    return lambda topic, message: serializer(message, SerializationContext(topic, MessageField.VALUE))


def order_classes(version: int) -> dict[str, Any]:
    """Message classes of ``shop/order_v{version}.proto``: ``Order``, ``Line``; version 2 adds
    ``Order.color`` (field 12). Each version is its own pool, as two producers' would be."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    file = descriptor_pb2.FileDescriptorProto(
        name=f"shop/order_v{version}.proto",
        package="shop",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"],
    )
    status = file.enum_type.add(name="Status")
    for number, name in enumerate(["STATUS_UNKNOWN", "PLACED", "SHIPPED"]):
        status.value.add(name=name, number=number)
    line = file.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    order = file.message_type.add(name="Order")
    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    order.field.add(name="id", number=1, type=F.TYPE_INT64, label=opt)
    order.field.add(name="customer", number=2, type=F.TYPE_STRING, label=opt)
    order.field.add(name="amount", number=3, type=F.TYPE_DOUBLE, label=opt)
    order.field.add(name="status", number=4, type=F.TYPE_ENUM, type_name=".shop.Status", label=opt)
    order.field.add(name="placed_at", number=5, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=opt)
    order.field.add(name="lines", number=6, type=F.TYPE_MESSAGE, type_name=".shop.Line", label=rep)
    order.field.add(name="first", number=7, type=F.TYPE_MESSAGE, type_name=".shop.Line", label=opt)
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=opt)
    order.field.add(name="attrs", number=8, type=F.TYPE_MESSAGE, type_name=".shop.Order.AttrsEntry", label=rep)
    order.oneof_decl.add(name="payment")
    order.field.add(name="card", number=9, type=F.TYPE_STRING, label=opt, oneof_index=0)
    order.field.add(name="voucher", number=10, type=F.TYPE_INT64, label=opt, oneof_index=0)
    double_value = ".google.protobuf.DoubleValue"
    order.field.add(name="discount", number=11, type=F.TYPE_MESSAGE, type_name=double_value, label=opt)
    if version >= 2:
        order.field.add(name="color", number=12, type=F.TYPE_STRING, label=opt)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    find = pool.FindMessageTypeByName
    return {name: message_factory.GetMessageClass(find(f"shop.{name}")) for name in ("Order", "Line")}


def order_message(classes: dict[str, Any], i: int, *, color: str | None = None) -> Any:
    """Order ``i`` with every kind of field set or not, by ``i``; what :func:`expected_order` reads."""
    order = classes["Order"](id=i, customer=f"c{i % 7}", amount=i * 1.25, status=i % 3)
    order.placed_at.seconds = 1_700_000_000 + i
    order.placed_at.nanos = (i % 1000) * 1000
    for n in range(i % 3):
        order.lines.add(sku=f"s{n}", qty=n + 1)
    if i % 2:
        order.first.sku = "head"
        order.first.qty = i
        order.card = f"card{i}"
    else:
        order.voucher = i * 10
    if i % 4 == 0:
        order.discount.value = 0.5
    order.attrs["a"] = i
    if color is not None:
        order.color = color
    return order


def expected_order(i: int) -> dict[str, Any]:
    """The row :func:`order_message` ``i`` lands as (what the Protobuf mapping promises)."""
    return {
        "id": i,
        "customer": f"c{i % 7}",
        "amount": i * 1.25,
        "status": ["STATUS_UNKNOWN", "PLACED", "SHIPPED"][i % 3],
        "placed_at_us": (1_700_000_000 + i) * 1_000_000 + (i % 1000),
        "lines": [{"sku": f"s{n}", "qty": n + 1} for n in range(i % 3)],
        "first": {"sku": "head", "qty": i} if i % 2 else None,
        "attrs": [("a", i)],
        "card": f"card{i}" if i % 2 else None,
        "voucher": None if i % 2 else i * 10,
        "discount": 0.5 if i % 4 == 0 else None,
    }
