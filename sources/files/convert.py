"""Type conversion: parsed text and Parquet values into the declared column types, value by value.

A CSV field converts as pyarrow's cast does, after trimming surrounding whitespace unless the
column is a ``string``; an empty field is null, except in ``string`` columns where it is ``""``
(``bool`` takes ``true``/``false``/``1``/``0`` in any case). Text for a ``timestamp`` is ISO 8601
(a zone offset converts to UTC, none means UTC), for a ``date`` ``YYYY-MM-DD``. A value that does
not convert is a bad record of its own: its verdict never depends on the other values of its
column, which :func:`convert_all` finds by isolation (:mod:`reclock.sources.decode.isolate`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.sources.decode.isolate import Rejected, bisect
from reclock.sources.files.config import UTC

__all__ = ["convert", "convert_all", "text_to"]

_NAIVE = pa.timestamp("us")
#: What text of each type usually looks like: steers the search for values that do not convert.
_LIKELY_TEXT: Mapping[pa.DataType, str] = {
    pa.int64(): r"^[+-]?[0-9]+$",
    pa.int32(): r"^[+-]?[0-9]+$",
    pa.float64(): r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$|^[+-]?(?i:nan|inf|infinity)$",
    pa.bool_(): r"^(?i:true|false|1|0)$",
    pa.date32(): r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    UTC: r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9:.,]+)?(?:Z|z|[+-][0-9:]+)?$",
}


def convert(column: pa.Array, target: pa.DataType) -> pa.Array:
    """``column`` as ``target`` (a safe cast); text becomes timestamps (offset to UTC, none = UTC)."""
    if column.type == target:
        return column
    if target == UTC and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        try:
            return column.cast(UTC)  # every value has a zone offset
        except pa.ArrowInvalid:
            pass
        try:
            return column.cast(_NAIVE).cast(UTC)  # no value has one: they are UTC
        except pa.ArrowInvalid:
            pass
        if len(column) == 1:
            raise pa.ArrowInvalid(f"not an ISO 8601 timestamp: {column[0].as_py()!r}")
        # A mix: value by value (a bad value raises, and the caller bisects down to it).
        return pa.concat_arrays([convert(column.slice(i, 1), target) for i in range(len(column))])
    return column.cast(target)


def text_to(column: pa.Array, target: pa.DataType) -> pa.Array:
    """A CSV column's raw fields (binary) as ``target``.

    The bytes must be UTF-8. For a column other than ``string``, surrounding whitespace is
    trimmed, an empty field is null, and the text converts as pyarrow's cast does (``bool``:
    ``true``/``false``/``1``/``0`` in any case; ``timestamp``: ISO 8601, see :func:`convert`).
    """
    return convert(_trimmed_text(column, target), target)


def convert_all(
    column: pa.Array, target: pa.DataType, how: Callable[[pa.Array, pa.DataType], pa.Array]
) -> tuple[pa.Array, dict[int, str]]:
    """Convert every value with ``how``; ``{index: problem}`` of those that fail (null in the result).

    Conversion is value by value, so a value's verdict never depends on its neighbours. When the
    whole column fails, a regex guesses which text values will not convert: the others are
    converted at once and the suspects one by one (a wrong guess costs time, never correctness);
    a set that still fails is bisected, so ``k`` bad values cost ``O(k log n)`` casts. Only
    ``ArrowInvalid`` and ``ValueError`` mean a value does not convert; anything else (a cast
    pyarrow does not implement) propagates.
    """
    try:
        return how(column, target), {}
    except (pa.ArrowInvalid, ValueError):
        pass
    if how is text_to:
        with contextlib.suppress(pa.ArrowInvalid, ValueError):  # bad UTF-8 is found value by value
            column, how = _trimmed_text(column, target), convert
    pieces: list[tuple[np.ndarray, pa.Array]] = []
    bad: dict[int, str] = {}

    def parse(idx: np.ndarray) -> pa.Array:
        try:
            part = column.slice(int(idx[0]), 1) if len(idx) == 1 else column.take(pa.array(idx))
            return how(part, target)
        except (pa.ArrowInvalid, ValueError) as exc:
            raise Rejected(str(exc)) from exc

    def accept(idx: np.ndarray, converted: pa.Array) -> None:
        pieces.append((idx, converted))

    def fault(i: int, problem: str) -> None:
        bad[i] = problem

    everything = np.arange(len(column), dtype=np.int64)
    pattern = _LIKELY_TEXT.get(target) if pa.types.is_string(column.type) else None
    if pattern is None:
        bisect(everything, parse, accept, fault, tried=True)
    else:
        likely = pc.fill_null(pc.match_substring_regex(column, pattern), True).to_numpy(zero_copy_only=False)
        if likely.any():
            bisect(everything[likely], parse, accept, fault)
        for i in everything[~likely]:
            bisect(everything[i : i + 1], parse, accept, fault)
    positions = np.concatenate([idx for idx, _ in pieces] + [np.fromiter(bad, dtype=np.int64, count=len(bad))])
    values = pa.concat_arrays([part for _, part in pieces] + [pa.nulls(len(bad), target)])
    return values.take(pa.array(np.argsort(positions, kind="stable"))), dict(sorted(bad.items()))


def _trimmed_text(column: pa.Array, target: pa.DataType) -> pa.Array:
    """Step one of :func:`text_to`: UTF-8 text, trimmed and empty as null unless ``string``."""
    text = column.cast(pa.string())
    if target == pa.string():
        return text
    text = pc.utf8_trim_whitespace(text)
    empty = pc.equal(pc.binary_length(text), 0)
    if pc.any(empty).as_py():
        text = pc.if_else(empty, pa.scalar(None, pa.string()), text)
    return text
