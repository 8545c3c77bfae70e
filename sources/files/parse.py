"""Parsing: the records of a block into typed columns, and a problem for every record that fails.

A CSV record is positional (a header line is skipped by the reader without being interpreted),
parsed by pyarrow into raw fields and converted column by column (:mod:`reclock.sources.files.convert`),
so a record with the wrong number of fields or a value that does not convert is found without
parsing again. A JSON lines record is one object per line, typed by pyarrow's JSON reader (an
``int64`` column rejects ``1.5`` and ``"1"``); unknown fields are ignored, missing ones are null,
and whitespace-only lines are not records. Up to a batch of records is parsed by one pyarrow
call over their contiguous bytes; when that call fails, the bad records are isolated with the
decoding engine's one routine (:mod:`reclock.sources.decode.isolate`). Whether a record is good never
depends on its neighbours or on where a block was cut.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from reclock.sources.base import RecordError
from reclock.sources.decode.isolate import isolate, rejecting
from reclock.sources.decode.screening import json_screen
from reclock.sources.files.blocks import Records
from reclock.sources.files.config import UTC
from reclock.sources.files.convert import convert, convert_all, text_to

__all__ = ["Parsed", "RecordParser"]

_OPEN_BRACE = ord("{")

#: What a parse of some records returns: the good ones, their columns, and ``(record, problem)``.
Parsed: TypeAlias = tuple[list[int], list[pa.Array], list[tuple[int, str]]]


@dataclass(frozen=True)
class RecordParser:
    """How one source parses its CSV and JSON lines records: a picklable value for Spark tasks.

    ``schema`` holds the declared columns; with ``fail`` (``on_record_error="fail"``) the first
    bad record raises :class:`~reclock.sources.base.RecordError` instead of being reported.
    """

    schema: pa.Schema
    delimiter: str
    quote: str
    fail: bool
    #: JSON lines parse timestamps and dates as text, then convert them (see :func:`convert`).
    text_schema: pa.Schema = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = [pa.field(f.name, pa.string() if f.type in (UTC, pa.date32()) else f.type) for f in self.schema]
        object.__setattr__(self, "text_schema", pa.schema(text))

    def parse(
        self, records: Records, lo: int, hi: int, *, is_csv: bool, piece: int, where: str
    ) -> tuple[np.ndarray, list[pa.Array], list[tuple[int, str]]]:
        """Parse records ``[lo, hi)`` of a block: the good ones in order, their columns, the faults.

        Step 1: screen out records pyarrow must not see (not UTF-8; a JSON line that is not an
        object). Step 2: one vectorised parse of the rest; it reports records with the wrong
        number of CSV fields, or values that do not convert, without failing. Only if that parse
        fails as a whole (JSON: any bad record) are the bad records isolated, in pieces of
        ``piece`` records; for JSON lines under the ``skip`` policy a Python screen steers the
        search through systematically bad data. With ``fail``, the first bad record raises,
        naming ``where`` (the file) and its line.
        """
        faults: list[tuple[int, str]] = []
        candidates = list(range(lo, hi))
        if is_csv:
            candidates = _screen_utf8(records, candidates, faults, "invalid csv")
        else:
            candidates = self._screen_json(records, candidates, faults)
        if self.fail and faults:  # report the first bad record: parse only what precedes it
            candidates = [k for k in candidates if k < min(faults)[0]]

        @rejecting
        def parse(indices: list[int]) -> Parsed:
            return self._parse_csv(records, indices) if is_csv else self._parse_json(records, indices)

        def fault(k: int, problem: str) -> None:
            if self.fail:
                raise RecordError(f"{where}: line {int(records.lines[k])}: {problem} (on_record_error='fail')")
            faults.append((k, problem))

        accepted: list[tuple[list[int], list[pa.Array]]] = []

        def accept(indices: list[int], parsed: Parsed) -> None:
            good, columns, bad = parsed
            accepted.append((good, columns))
            for k, problem in bad:
                fault(k, problem)

        def screen(indices: list[int]) -> list[bool]:
            block, starts, ends = records.block, records.starts, records.ends
            return json_screen(self.text_schema)([block[starts[k] : ends[k]] for k in indices])

        # In order for CSV and under the fail policy, so that the first bad record is found first.
        isolate(candidates, parse, accept, fault, piece=piece, screen=None if is_csv or self.fail else screen)
        if self.fail and faults:
            fault(*min(faults))
        accepted = [(good, columns) for good, columns in accepted if len(good)]
        if not accepted:
            return np.zeros(0, dtype=np.int64), [], sorted(faults)
        good = np.concatenate([np.asarray(idx, dtype=np.int64) for idx, _ in accepted])
        if len(accepted) == 1:
            return good, accepted[0][1], sorted(faults)
        columns = [pa.concat_arrays([arrays[c] for _, arrays in accepted]) for c in range(len(self.schema))]
        if (np.diff(good) < 0).any():  # the screen parsed records out of order
            order = np.argsort(good, kind="stable")
            good = good[order]
            taken = pa.array(order)
            columns = [c.take(taken) for c in columns]
        return good, columns, sorted(faults)

    def _screen_json(self, records: Records, candidates: list[int], faults: list[tuple[int, str]]) -> list[int]:
        """Keep the JSON lines that hold an object in valid UTF-8; whitespace-only lines are blank.

        pyarrow's JSON reader must never see a line that is not an object: it turns a ``null``
        into a row of nulls, and crashes on a buffer of only ``null``. It does not check UTF-8
        inside strings either.
        """
        block = records.block
        if not candidates:
            return candidates
        view = np.frombuffer(block, dtype=np.uint8)
        opens = view[records.starts[candidates[0] : candidates[-1] + 1]] == _OPEN_BRACE
        if opens.all():
            kept = candidates
        else:
            kept = []
            for k, is_object in zip(candidates, opens, strict=True):
                if is_object:
                    kept.append(k)
                    continue
                text = block[records.starts[k] : records.ends[k]].strip()
                if not text:
                    continue  # a whitespace-only line is not a record
                if text[:1] == b"{":
                    kept.append(k)
                else:
                    faults.append((k, f"invalid json: expected an object, got {text[:20]!r}"))
        return _screen_utf8(records, kept, faults, "invalid json")

    def _parse_csv(self, records: Records, indices: list[int]) -> Parsed:
        """Parse CSV records into raw fields, then convert each column (see :func:`text_to`).

        A record with the wrong number of fields, or with a value that does not convert, is
        reported, not raised; the parse raises only when pyarrow's rows do not line up with the
        records one to one (the caller then isolates).
        """
        buf = _buffer(records, indices)
        invalid: list[tuple[int | None, int, str]] = []

        def on_invalid(row: Any) -> str:
            invalid.append((row.number, row.actual_columns, row.text))
            return "skip"

        names = self.schema.names
        table = pa_csv.read_csv(
            pa.BufferReader(buf),
            read_options=pa_csv.ReadOptions(
                column_names=names, use_threads=False, block_size=max(len(buf) + 1, 1 << 16)
            ),
            parse_options=pa_csv.ParseOptions(
                delimiter=self.delimiter,
                quote_char=self.quote,
                double_quote=True,
                newlines_in_values=records.quoted,
                ignore_empty_lines=True,
                invalid_row_handler=on_invalid,
            ),
            convert_options=pa_csv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.binary()), strings_can_be_null=False
            ),
        )
        if table.num_rows + len(invalid) != len(indices):
            raise ValueError(f"parsed into {table.num_rows + len(invalid)} rows, expected {len(indices)}")
        faults: list[tuple[int, str]] = []
        skipped: set[int] = set()
        for number, actual, text in invalid:
            if number is None or not 1 <= number <= len(indices) or number in skipped:
                raise ValueError(f"pyarrow reported an unexpected invalid row {number}")
            k = indices[number - 1]
            if text.encode() != records.block[records.starts[k] : records.ends[k]]:
                raise ValueError(f"pyarrow's row {number} is not the record on line {int(records.lines[k])}")
            skipped.add(number)
            faults.append((k, f"expected {len(names)} fields, got {actual}"))
        good = [k for i, k in enumerate(indices, start=1) if i not in skipped] if skipped else indices
        columns, bad = self._convert_columns(table, text_to)
        if bad:
            keep = [i for i in range(len(good)) if i not in bad]
            faults.extend((good[i], problem) for i, problem in bad.items())
            taken = pa.array(keep, pa.int64())
            good = [good[i] for i in keep]
            columns = [c.take(taken) for c in columns]
        faults.sort()
        return good, columns, faults

    def _parse_json(self, records: Records, indices: list[int]) -> Parsed:
        """Parse JSON lines in one call: raises if any line fails; text timestamps convert after."""
        buf = _buffer(records, indices)
        table = pa_json.read_json(
            pa.BufferReader(buf),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(buf) + 1, 1 << 16)),
            parse_options=pa_json.ParseOptions(explicit_schema=self.text_schema, unexpected_field_behavior="ignore"),
        )
        if table.num_rows != len(indices):
            raise ValueError(f"parsed into {table.num_rows} rows, expected {len(indices)}")
        columns, bad = self._convert_columns(table, convert)
        if not bad:
            return indices, columns, []
        keep = [i for i in range(len(indices)) if i not in bad]
        taken = pa.array(keep, pa.int64())
        faults = sorted((indices[i], problem) for i, problem in bad.items())
        return [indices[i] for i in keep], [c.take(taken) for c in columns], faults

    def _convert_columns(
        self, table: pa.Table, how: Callable[[pa.Array, pa.DataType], pa.Array]
    ) -> tuple[list[pa.Array], dict[int, str]]:
        """Every declared column of ``table`` converted; ``{row: problem}`` of values that did not."""
        columns: list[pa.Array] = []
        bad: dict[int, str] = {}
        for f in self.schema:
            column, problems = convert_all(table.column(f.name).combine_chunks(), f.type, how)
            columns.append(column)
            for i, problem in problems.items():
                bad.setdefault(i, f"column {f.name!r}: {problem}")
        return columns, dict(sorted(bad.items()))


def _buffer(records: Records, indices: list[int]) -> bytes:
    """The bytes of ``indices``, each ending with a line end (zero-copy when consecutive)."""
    block = records.block
    first, last = indices[0], indices[-1]
    if last - first + 1 == len(indices):  # consecutive records: their bytes are contiguous
        buf = block[records.starts[first] : records.stops[last]]
    else:
        buf = b"".join(block[records.starts[k] : records.stops[k]] for k in indices)
    return buf if buf.endswith(b"\n") else buf + b"\n"


def _screen_utf8(records: Records, candidates: list[int], faults: list[tuple[int, str]], what: str) -> list[int]:
    """The candidates that are valid UTF-8; the others become faults here, before any parse.

    One check over their bytes when all are valid (the common case), else one per record.
    pyarrow's JSON reader does not check UTF-8 inside strings, and its CSV reader hands a row
    with the wrong number of fields to the ``invalid_row_handler`` as text: a row that is not
    UTF-8 fails in that callback, where the error cannot be caught and only lands on stderr.
    """
    if not candidates:
        return candidates
    block = records.block
    try:
        span = memoryview(block)[records.starts[candidates[0]] : records.stops[candidates[-1]]]
        codecs.utf_8_decode(span, None, True)
    except UnicodeDecodeError:
        valid = []
        for k in candidates:
            try:
                block[records.starts[k] : records.stops[k]].decode("utf-8")
            except UnicodeDecodeError as exc:
                faults.append((k, f"{what}: not UTF-8 ({exc})"))
            else:
                valid.append(k)
        return valid
    return candidates
