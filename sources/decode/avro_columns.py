"""Avro datums of one writer schema decoded as columns: one Rust decode per batch, proven aligned.

fastavro reads a datum in about 4 us and ``from_pylist`` takes as long again to make it a row;
polars' Avro reader decodes an Object Container File straight into Arrow columns in about
0.5 us a datum. Registry-framed payloads are bare binary datums, and a container's block is
exactly its datums end to end, so :func:`decode_columns` wraps a batch's payloads in a one-block
container (a header with the writer schema, the count, the size, the bytes) and decodes it whole.

A block does not say where one datum ends and the next begins, and polars does not check that a
datum used exactly its own bytes. So the result is accepted only with a proof that it did: from
the decoded values, the length of each field's canonical (shortest) encoding is computed column
by column, and the fields of every row must add up to exactly its payload's length. Any encoding
of a value is at least as long as its canonical one, and polars reads the block from a buffer of
the block's size (it fails rather than read past it), so equal sums force every row to have used
exactly its own payload: no row can be made of a neighbour's bytes. Where decoders read the spec
leniently and differ (a boolean byte other than 0 or 1, a union or enum index, a varint with bits
past its width), the field's start in each row is known from the lengths before it, and its byte
is checked to be the spec's.

Anything else returns ``None`` and the caller decodes datum by datum (fastavro, which names the
bad ones): a writer schema with a nested record, an array, a map, a union other than
``["null", T]``, a bytes-backed decimal or a time-of-day type; a batch polars rejects; a length
or byte that does not match; a value that does not convert to its column. Both paths give the
same rows for the same datums (a property test pins it), so which one ran never shows.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ColumnPlan", "column_plan", "decode_columns"]

_SYNC = b"reclock-columns!"  # any 16 bytes: the container is never written anywhere
_FIXED_WIDTH = {"null": 0, "boolean": 1, "float": 4, "double": 8}
#: The last byte of a canonical varint of the longest length: 32 and 64 bits of zigzag.
_VARINT_TOP = {"int": (5, 0x0F), "long": (10, 0x01)}
_LOGICAL_OK = {("int", "date"), ("long", "timestamp-millis"), ("long", "timestamp-micros"), ("string", "uuid")}
_NO_PROOF = -(1 << 40)  # a length no row has: the proof fails
#: Dates and timestamps fastavro can read (Python's years 1 to 9999); past them it rejects the
#: datum, so the columnar path must not accept it.
_PYTHON_RANGE = {
    "date": (-719_162, 2_932_896),
    "timestamp-millis": (-62_135_596_800_000, 253_402_300_799_999),
    "timestamp-micros": (-62_135_596_800_000_000, 253_402_300_799_999_999),
}

#: A column to each row's canonical encoded length.
_Length = Callable[[pa.Array], np.ndarray]
#: ``(raw bytes, where each row's value starts, column, valid rows) -> ok``: the bytes a decoder
#: may read leniently are the spec's.
_Check = Callable[[np.ndarray, np.ndarray, pa.Array], bool]


class ColumnPlan:
    """How to decode one writer schema as columns: its container header, and per field the
    canonical length of its values and a check of the bytes decoders read leniently."""

    def __init__(self, writer: dict[str, Any], fields: list[tuple[str, _Length, _Check]]) -> None:
        self.fields = fields
        self.names = [name for name, _, _ in fields]
        meta = {"avro.schema": json.dumps(writer).encode(), "avro.codec": b"null"}
        head = bytearray(b"Obj\x01")
        head += _long(len(meta))
        for key, value in meta.items():
            head += _long(len(key)) + key.encode() + _long(len(value)) + value
        head += _long(0) + _SYNC
        self.header = bytes(head)


def column_plan(writer: Any) -> ColumnPlan | None:
    """The plan for ``writer`` (an Avro schema as JSON values), or ``None`` unless it is a flat
    record of the types the proof covers: null, boolean, int, long, float, double, string, bytes,
    an enum of at most 64 symbols, fixed, the date and timestamp logical types, a fixed decimal,
    and ``["null", T]`` of those but the enum."""
    import fastavro

    try:
        expanded = fastavro.parse_schema(writer, expand=True, _write_hint=False)
    except Exception:  # fastavro's SchemaParseException: the per-datum path reports it
        return None
    if not isinstance(expanded, dict) or expanded.get("type") != "record":
        return None
    fields = []
    for f in expanded["fields"]:
        planned = _field(f["type"])
        if planned is None:
            return None
        fields.append((f["name"], *planned))
    return ColumnPlan(writer, fields)


def decode_columns(plan: ColumnPlan, body: bytes, sizes: np.ndarray, schema: pa.Schema) -> pa.RecordBatch | None:
    """The datums ``body`` (end to end, ``sizes`` bytes each) as a batch of ``schema``, or
    ``None`` when they cannot be proven to decode one to one (see the module docstring)."""
    try:
        import polars as pl
    except ImportError:  # an optional dependency (reclock[registry]): datum by datum without it
        return None
    n = len(sizes)
    container = b"".join([plan.header, _long(n), _long(len(body)), body, _SYNC])
    try:
        table = pl.read_avro(io.BytesIO(container)).to_arrow()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # ComputeError, OSError, or a Rust panic (a BaseException) on bytes past a datum
        return None
    if table.num_rows != n or table.column_names != plan.names:
        return None
    raw = np.frombuffer(body, np.uint8)
    at = np.zeros(n, np.int64)  # per row: where the field starts, from the row's start
    at[1:] = np.cumsum(sizes)[:-1]
    rows_end = at + sizes
    for name, length, check in plan.fields:
        column = table.column(name).combine_chunks()
        field_length = length(column)
        if (field_length < 0).any() or (at + field_length > rows_end).any() or not check(raw, at, column):
            return None
        at = at + field_length
    if not np.array_equal(at, rows_end):
        return None
    columns = []
    for f in schema:
        if f.name not in plan.names:
            columns.append(pa.nulls(n, f.type))
            continue
        try:
            columns.append(table.column(f.name).combine_chunks().cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _field(node: Any) -> tuple[_Length, _Check] | None:
    """Length and check of a top-level field of Avro type ``node`` (expanded)."""
    if isinstance(node, list):
        if len(node) != 2 or node.count("null") != 1:
            return None
        value_index = 1 - node.index("null")
        if isinstance(node[value_index], dict) and node[value_index].get("type") == "enum":
            return None  # polars' reader cannot read an enum in a union
        inner = _value(node[value_index])
        if inner is None:
            return None
        length, check = inner

        def union_length(col: pa.Array) -> np.ndarray:
            return 1 + np.where(_valid(col), length(col), 0)

        def union_check(raw: np.ndarray, at: np.ndarray, col: pa.Array) -> bool:
            valid = _valid(col)
            branch = np.where(valid, 2 * value_index, 2 * (1 - value_index))  # the zigzag index byte
            if not (raw[at] == branch).all():
                return False
            return check(raw, at[valid] + 1, col if valid.all() else col.filter(pa.array(valid)))

        return union_length, union_check
    return _value(node)


def _value(node: Any) -> tuple[_Length, _Check] | None:
    kind = node.get("type") if isinstance(node, dict) else node
    logical = node.get("logicalType") if isinstance(node, dict) else None
    if logical is not None and (kind, logical) not in _LOGICAL_OK and not (logical == "decimal" and kind == "fixed"):
        return None
    if kind in _FIXED_WIDTH:
        width = _FIXED_WIDTH[kind]
        fixed = _strict(lambda col: np.full(len(col), width, np.int64))
        if kind == "boolean":
            return fixed, lambda raw, at, col: bool((raw[at] <= 1).all())  # the spec's 0 or 1 only
        return fixed, _no_check
    if kind in _VARINT_TOP:
        top_length, top_byte = _VARINT_TOP[kind]
        low, high = _PYTHON_RANGE.get(logical or "", (-(1 << 63), (1 << 63) - 1))

        def varint_check(raw: np.ndarray, at: np.ndarray, col: pa.Array) -> bool:
            values = _as_int64(col)
            longest = _varint_length(values) == top_length
            if not (raw[at[longest] + top_length - 1] <= top_byte).all():  # no bits past the width
                return False
            return bool(((values >= low) & (values <= high)).all())

        return _strict(lambda col: _varint_length(_as_int64(col))), varint_check
    if kind in ("string", "bytes"):

        def text(col: pa.Array) -> np.ndarray:
            sizes = pc.binary_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            return _varint_length(sizes) + sizes

        return _strict(text), _no_check
    if kind == "fixed":
        size = int(node["size"])
        return _strict(lambda col: np.full(len(col), size, np.int64)), _no_check
    if kind == "enum" and len(node["symbols"]) <= 64:  # an index of one varint byte
        symbols = {s: i for i, s in enumerate(node["symbols"])}

        def indexes(col: pa.Array) -> np.ndarray:
            if not isinstance(col, pa.DictionaryArray):
                col = col.dictionary_encode()
            index = np.asarray([symbols.get(s, -1) for s in col.dictionary.to_pylist()], np.int64)
            return index[col.indices.fill_null(0).to_numpy(zero_copy_only=False)]

        def enum_check(raw: np.ndarray, at: np.ndarray, col: pa.Array) -> bool:
            index = indexes(col)
            return bool((index >= 0).all() and (raw[at] == 2 * index).all())

        return _strict(lambda col: np.ones(len(col), np.int64)), enum_check
    return None


def _no_check(raw: np.ndarray, at: np.ndarray, col: pa.Array) -> bool:
    return True


def _strict(length: _Length) -> _Length:
    """``length`` for a type that has no null: a null there (a mis-decode) breaks the proof."""

    def checked(col: pa.Array) -> np.ndarray:
        if col.null_count:
            return np.where(_valid(col), length(col), _NO_PROOF)
        return length(col)

    return checked


def _valid(col: pa.Array) -> np.ndarray:
    if not col.null_count:
        return np.ones(len(col), bool)
    return col.is_valid().to_numpy(zero_copy_only=False)


def _as_int64(col: pa.Array) -> np.ndarray:
    if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
        col = col.view(pa.int64() if pa.types.is_timestamp(col.type) else pa.int32())
    return col.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)


def _varint_length(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's zigzag varint (Avro's int and long)."""
    v = values.astype(np.int64)
    zigzag = ((v << 1) ^ (v >> 63)).view(np.uint64)
    out = np.ones(len(v), np.int64)
    for shift in range(7, 64, 7):
        out += zigzag >= (np.uint64(1) << np.uint64(shift))
    return out


def _long(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)
