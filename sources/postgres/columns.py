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

**Every value lands.** Arrow's cast reads only years 0001 to 9999; the server writes years
before Christ (``4713-01-01 BC``) and past 9999 (``294276-12-31``), which are read here by
:func:`_temporal` (the proleptic Gregorian calendar PostgreSQL uses, 1 BC being year 0). What a
typed column cannot hold at all, a ``numeric`` ``NaN`` in a decimal, ``infinity`` and
``-infinity`` dates and timestamps, a timestamp past Arrow's microseconds (after
294247-01-10), is null in its column and kept as the server's text in the row's
:data:`UNHELD` column: one JSON object by column name (``{"n": "NaN"}``), null when the row's
columns hold every value. A table gets that column when one of its columns can meet such a
value (:func:`may_be_unheld`). Floats hold ``NaN`` and the infinities themselves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["SESSION_OPTIONS", "UNHELD", "arrow_type", "may_be_unheld", "typed_column", "typed_texts", "unheld_texts"]

#: The column of a row's values its typed columns cannot hold, as text by column name (JSON).
UNHELD = "_unheld"

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


def may_be_unheld(kind: pa.DataType) -> bool:
    """Whether a column of Arrow type ``kind`` can meet a value of its PostgreSQL type it cannot
    hold (then its table's rows have :data:`UNHELD`)."""
    return pa.types.is_decimal(kind) or pa.types.is_date32(kind) or pa.types.is_timestamp(kind)


def unheld_texts(
    names: Sequence[str], texts: Sequence[Sequence[str | None] | pa.Array], bad: Sequence[Sequence[int]], n: int
) -> pa.Array:
    """The :data:`UNHELD` column of ``n`` rows: per row, the texts of ``names`` at the rows ``bad``
    lists per column (the values its column could not hold), one JSON object, or null."""
    rows: list[dict[str, Any] | None] = [None] * n
    for name, values, at in zip(names, texts, bad, strict=True):
        for i in at:
            value = values[i]
            text = value.as_py() if isinstance(value, pa.Scalar) else value
            held = rows[i]
            if held is None:
                held = rows[i] = {}
            held[name] = text
    return pa.array(
        [None if row is None else json.dumps(row, separators=(",", ":"), ensure_ascii=False) for row in rows],
        pa.string(),
    )


def typed_texts(raw: pa.Array, kind: pa.DataType) -> tuple[pa.Array, list[int]]:
    """:func:`typed_column` of texts already in an Arrow string array (a snapshot chunk's column;
    one its parser typed already is as it is)."""
    if pa.types.is_string(kind) or raw.type == kind:
        return raw, []
    try:
        return _cast(raw, kind), []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass
    # One by one: a temporal value as its storage integer, so those Arrow's cast reads and those
    # read here make one array.
    temporal = pa.types.is_date32(kind) or pa.types.is_timestamp(kind)
    storage = pa.int32() if pa.types.is_date32(kind) else pa.int64()
    values: list[object] = []
    bad: list[int] = []
    for i, text in enumerate(raw.to_pylist()):
        if text is None:
            values.append(None)
            continue
        try:
            one = _cast(pa.array([text], pa.string()), kind)
            values.append(one.view(storage)[0].as_py() if temporal else one[0].as_py())
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            pass
        value = _temporal(text, kind) if temporal else None
        values.append(value)
        if value is None:
            bad.append(i)
    if temporal:
        return pa.array(values, storage).view(kind), bad
    return pa.array(values, kind), bad


_DATE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?")
_TIMESTAMP = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?( BC)?"
)
_DAY_US = 86_400_000_000
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _temporal(text: str, kind: pa.DataType) -> int | None:
    """A date's days or a timestamp's microseconds since the epoch for the server's ISO text of
    any year it writes (``4713-01-01 BC``, ``10000-01-01``), ``None`` if ``kind`` cannot hold it
    (``infinity``, past its range) or it is no such text."""
    if pa.types.is_date32(kind):
        match = _DATE.fullmatch(text)
        if match is None:
            return None
        year, month, day, bc = match.groups()
        days = _days(int(year), int(month), int(day), bc is not None)
        return days if _INT32[0] <= days <= _INT32[1] else None
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, sign, oh, om, osec, bc = match.groups()
    us = _days(int(year), int(month), int(day), bc is not None) * _DAY_US
    us += ((int(hour) * 60 + int(minute)) * 60 + int(second)) * 1_000_000 + int((fraction or "").ljust(6, "0"))
    if sign is not None:  # the text's UTC offset: local time minus it is UTC
        offset = (int(oh) * 60 + int(om or 0)) * 60 + int(osec or 0)
        us -= (offset if sign == "+" else -offset) * 1_000_000
    return us if _INT64[0] <= us <= _INT64[1] else None


def _days(year: int, month: int, day: int, bc: bool) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (``bc``: 1 BC is year 0, as in
    PostgreSQL), by H. Hinnant's ``days_from_civil``."""
    y = (1 - year if bc else year) - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


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
