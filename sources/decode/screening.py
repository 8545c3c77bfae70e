"""Screening: a cheap Python guess, value by value, whether pyarrow will accept a JSON or CSV value.

Used by :func:`~reclock.sources.decode.isolate.isolate` when many pieces of a batch fail to parse
(systematically bad data): the values the screen doubts are parsed alone, so that the rest parses
in bulk again instead of being bisected. A screen checks syntax and the kind of each field; it
only steers the work. A wrong guess costs time, never correctness: every verdict comes from
pyarrow, on the value alone or in a set that parsed with one row per value.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

__all__ = ["csv_screen", "json_screen"]


def json_screen(schema: pa.Schema) -> Callable[[list[bytes]], list[bool]]:
    """For JSON objects typed by ``schema``: syntax, an object, and the JSON kind of each field."""
    checks = [(f.name, _kind_check(f.type)) for f in schema]

    decode = json.JSONDecoder().decode

    def screen(value: bytes) -> bool:
        try:
            obj = decode(value.decode("utf-8"))
        except (ValueError, RecursionError):
            return False
        if not isinstance(obj, dict):
            return False
        for name, check in checks:
            v = obj.get(name)
            if v is not None and not check(v):
                return False
        return True

    return lambda values: [screen(v) for v in values]


def csv_screen(schema: pa.Schema, delimiter: str, quote_char: str) -> Callable[[list[bytes]], list[bool]]:
    """For CSV rows typed by ``schema``: field count and the text of numeric and bool fields."""
    checks = [_text_check(f.type) for f in schema]

    def rows_of(lines: list[str]) -> list[list[str]]:
        return list(csv.reader(lines, delimiter=delimiter, quotechar=quote_char, strict=True))

    def fits(row: list[str]) -> bool:
        return len(row) == len(checks) and all(t == "" or c(t) for t, c in zip(row, checks, strict=True))

    def one(value: bytes) -> bool:
        try:
            rows = rows_of([value.decode("utf-8")])
        except (UnicodeDecodeError, csv.Error):
            return False
        return len(rows) == 1 and fits(rows[0])

    def screen(values: list[bytes]) -> list[bool]:
        try:
            rows = rows_of([v.decode("utf-8") for v in values])
        except (UnicodeDecodeError, csv.Error):
            rows = []
        if len(rows) != len(values):  # a quote ran over a line end, or a line did not decode
            return [one(v) for v in values]
        return [fits(row) for row in rows]

    return screen


def _text_check(t: pa.DataType) -> Callable[[str], bool]:
    def parses(convert: Callable[[str], Any]) -> Callable[[str], bool]:
        def check(text: str) -> bool:
            try:
                convert(text)
            except ValueError:
                return False
            return True

        return check

    if pa.types.is_integer(t):
        return parses(int)
    if pa.types.is_floating(t):
        return parses(float)
    if pa.types.is_boolean(t):
        return lambda text: text.lower() in ("true", "false", "1", "0")
    return lambda text: True


def _kind_check(t: pa.DataType) -> Callable[[Any], bool]:
    if pa.types.is_boolean(t):
        return lambda v: isinstance(v, bool)
    if pa.types.is_integer(t):
        lo, hi = (0, 2**t.bit_width - 1) if pa.types.is_unsigned_integer(t) else _signed_range(t.bit_width)
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    if pa.types.is_floating(t):
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda v: isinstance(v, str)
    if pa.types.is_struct(t):
        return lambda v: isinstance(v, dict)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return lambda v: isinstance(v, list)
    return lambda v: True


def _signed_range(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
