"""PostgreSQL column values in their text form, typed as Arrow columns.

pgoutput (protocol 1) and ``COPY ... TO STDOUT`` both send a value as its type's output text,
under the session settings the source fixes on every connection (:data:`SESSION_OPTIONS`: ISO
dates, UTC, floats that round-trip). So the snapshot and the stream share one conversion: a
column's texts become an Arrow string array, cast at once to the column's Arrow type (vectorised),
and only when that cast fails are the values cast one by one, to tell which rows are bad. A bad
value never fails the batch: its row goes to ``_errors`` with its coordinates.

Types: booleans, integers, floats, ``numeric`` with a declared precision (decimal), dates,
timestamps (``timestamptz`` in UTC), ``bytea`` (binary); every other type keeps its text form
(``text``, ``varchar``, ``json``, ``uuid``, arrays, ``numeric`` without a precision...).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["SESSION_OPTIONS", "arrow_type", "typed_column", "typed_texts"]

#: libpq ``options`` every connection of the source uses, so text forms are the same everywhere.
SESSION_OPTIONS = "-c DateStyle=ISO -c TimeZone=UTC -c extra_float_digits=3 -c bytea_output=hex"

_BY_OID: dict[int, pa.DataType] = {
    16: pa.bool_(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    26: pa.int64(),
    700: pa.float32(),
    701: pa.float64(),
    17: pa.binary(),
    1082: pa.date32(),
    1114: pa.timestamp("us"),
    1184: pa.timestamp("us", tz="UTC"),
}

_NUMERIC = 1700


def arrow_type(type_oid: int, typmod: int) -> pa.DataType:
    """The Arrow type of a column of PostgreSQL type ``type_oid`` with modifier ``typmod``."""
    if type_oid == _NUMERIC and typmod >= 4:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        if 0 < precision <= 38:
            return pa.decimal128(precision, scale)
    return _BY_OID.get(type_oid, pa.string())


def typed_column(texts: Sequence[str | None] | pa.Array, kind: pa.DataType) -> tuple[pa.Array, list[int]]:
    """``texts`` (Python strings, or already a string array) as an array of ``kind``, and the
    positions whose text is not a value of it (null in the array). A value of a type kept as text
    never fails."""
    return typed_texts(texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string()), kind)


def typed_texts(raw: pa.Array, kind: pa.DataType) -> tuple[pa.Array, list[int]]:
    """:func:`typed_column` of texts already in an Arrow string array (a snapshot chunk's column;
    one its parser typed already is as it is)."""
    if pa.types.is_string(kind) or raw.type == kind:
        return raw, []
    try:
        return _cast(raw, kind), []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass
    values: list[object] = []
    bad: list[int] = []
    for i, text in enumerate(raw.to_pylist()):
        try:
            values.append(None if text is None else _cast(pa.array([text], pa.string()), kind)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            values.append(None)
            bad.append(i)
    return pa.array(values, kind), bad


def _cast(raw: pa.Array, kind: pa.DataType) -> pa.Array:
    if pa.types.is_boolean(kind):
        valid = raw.is_valid()
        if not all(t in ("t", "f") for t in raw.filter(valid).to_pylist()):
            raise ValueError("not a boolean")
        return pc.equal(raw, "t")
    if pa.types.is_binary(kind):
        return pa.array([None if t is None else _bytea(t) for t in raw.to_pylist()], pa.binary())
    return raw.cast(kind)


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea is not in hex form")
    return bytes.fromhex(text[2:])
