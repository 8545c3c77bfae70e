"""The five formats: JSON, CSV, text, bytes and Avro values decoded into an output's Arrow schema.

A :class:`Decoder` turns a list of raw values (``bytes``, or ``None`` for a Kafka tombstone) into
a :class:`~reclock.sources.decode.result.Decoded`, a whole batch at a time:

* ``json``: one JSON object per value, converted to the given schema (missing fields are null,
  unknown fields ignored, a type mismatch is a bad record). The batch is parsed by one
  :func:`pyarrow.json.read_json` call over the newline-joined values; only when that fails are
  the bad values isolated (:mod:`reclock.sources.decode.isolate`), so a clean batch costs one vectorised
  parse and ``k`` bad values cost ``O(k log n)`` parses.
* ``csv``: one delimited row per value (no header), columns named and typed by the schema; parsed
  and isolated like JSON.
* ``text``: UTF-8 text into one string column ``value``.
* ``bytes``: the raw value into one binary column ``value``.
* ``avro``: see :mod:`reclock.sources.decode.avro`.

A ``None`` value (a tombstone) decodes to a row of nulls, never to an error. Results are
deterministic per value: whether a value is good, and what it decodes to, does not depend on the
other values in its batch (values that ``read_json`` would mis-split, such as ``null`` or a
non-object, are rejected before the bulk parse; a bulk result is accepted only if it has exactly
one row per value).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from reclock.sources.base import clip_message
from reclock.sources.decode.avro import decode_avro, reading_schema
from reclock.sources.decode.isolate import Rejected, bisect, isolate, rejecting
from reclock.sources.decode.result import DECODE, NO_ROWS, Decoded, RecordFault, all_good, empty_batch
from reclock.sources.decode.screening import csv_screen, json_screen
from reclock.sources.decode.unknown import with_unknown_json
from reclock.sources.decode.values import Values

__all__ = ["FORMATS", "Decoder", "Format"]

Format: TypeAlias = Literal["json", "csv", "text", "bytes", "avro"]
FORMATS: tuple[str, ...] = ("json", "csv", "text", "bytes", "avro")

_OPEN_BRACE = ord("{")


@dataclass(frozen=True)
class Decoder:
    """A picklable, validated decoder for one output; build it with :func:`~reclock.sources.decode.make_decoder`."""

    format: Format
    schema: pa.Schema
    delimiter: str = ","
    quote_char: str = '"'
    avro_schema: Any = None
    confluent: bool = False
    #: Later writer schemas of Confluent-framed Avro values, by schema id: a datum is read with
    #: its own writer's schema, so fields a newer writer added are seen (and kept, see below).
    avro_writer_schemas: tuple[tuple[int, Any], ...] = ()
    #: ``avro_schema``'s field defaults, for datums whose writer lacks the field (Avro's schema
    #: resolution; :func:`~reclock.sources.decode.avro.reader_defaults`).
    avro_defaults: tuple[tuple[str, Any], ...] = ()
    #: Add :data:`~reclock.timeline.frontier.UNKNOWN_FIELDS`: each value's fields the schema lacks, as JSON
    #: (schema evolution; JSON objects' other keys, Avro writer fields the reader schema lacks).
    unknown_fields: bool = False
    _avro_parsed: Any = field(default=None, init=False, repr=False, compare=False)
    _avro_writers: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.format == "avro":
            object.__setattr__(self, "_avro_parsed", reading_schema(self.avro_schema))
            writers = {int(i): reading_schema(w) for i, w in self.avro_writer_schemas}
            object.__setattr__(self, "_avro_writers", writers)

    def decode(self, values: Sequence[bytes | None], *, fail_fast: bool = False) -> Decoded:
        """Decode ``values``; every index lands in ``good`` or in ``errors``, never both.

        With ``fail_fast`` (the ``fail`` policy) the only error returned, with an empty batch, is
        the *first* bad value (lowest index): the caller is going to raise, naming it. Decoding
        stops at the first bad value it finds, which the bulk parse and bisection may find out of
        order, so the values before it are decoded again, until none of them is bad. A verdict
        never depends on the other values, so this costs a few parses of shorter prefixes.
        """
        decoded = self._decode(values, _FailFast() if fail_fast else [])
        if self.unknown_fields and self.format == "json" and not (fail_fast and decoded.errors):
            decoded = with_unknown_json(decoded, values, self.schema.names)
        if not (fail_fast and decoded.errors):
            return decoded
        first = decoded.errors[0]
        while first[0] > 0:
            earlier = self._decode(values[: first[0]], _FailFast()).errors
            if not earlier:
                break
            first = earlier[0]
        return Decoded(empty_batch(self.schema), NO_ROWS, [first])

    def _decode(self, values: Sequence[bytes | None], faults: list[RecordFault]) -> Decoded:
        try:
            if self.format == "bytes":
                return all_good(pa.RecordBatch.from_arrays([_binary(values)], schema=self.schema))
            if self.format == "text":
                return self._decode_text(values, faults)
            if self.format == "avro":
                return self._decode_avro(values, faults)
            return self._decode_bulk(values, faults)
        except _Stop as stop:
            return Decoded(empty_batch(self.schema), NO_ROWS, [stop.fault])

    # -- text -----------------------------------------------------------------------------------

    def _decode_text(self, values: Sequence[bytes | None], faults: list[RecordFault]) -> Decoded:
        raw = _binary(values)
        try:
            column = raw.cast(pa.string())
        except (pa.ArrowInvalid, UnicodeDecodeError):
            good: list[int] = []
            for i, value in enumerate(values):
                try:
                    if value is not None:
                        value.decode("utf-8")
                    good.append(i)
                except UnicodeDecodeError as exc:
                    faults.append((i, DECODE, f"invalid UTF-8 text: {exc}"))
            idx = np.asarray(good, dtype=np.int64)
            column = raw.take(pa.array(idx)).cast(pa.string())
            return Decoded(pa.RecordBatch.from_arrays([column], schema=self.schema), idx, list(faults))
        return all_good(pa.RecordBatch.from_arrays([column], schema=self.schema))

    # -- json and csv: one vectorised parse, bisected only on failure ---------------------------

    def _decode_bulk(self, values: Sequence[bytes | None], faults: list[RecordFault]) -> Decoded:
        is_json = self.format == "json"
        parse = self._parse_json if is_json else self._parse_csv
        chunks: list[tuple[list[int], pa.Table]] = []

        # Step 1: classify. Tombstones become null rows; values the bulk parser would mis-split
        # (empty, not an object, a raw newline inside a CSV record) are rejected or parsed alone.
        # The common case (no tombstone, no newline, every JSON value opens with "{") is checked
        # on the joined buffer without a Python loop.
        joined = _clean_join(values, is_json)
        nulls: list[int] = []
        alone: list[int] = []
        if joined is not None:
            lines = cast("Sequence[bytes]", values)  # a joined buffer means no value is None
            bulk = list(range(len(values)))
        else:
            lines, bulk = self._classify(values, nulls, alone, faults)

        if is_json and bulk:
            # pyarrow's JSON reader does not validate UTF-8 inside strings: check it here.
            try:
                (joined if joined is not None else b"\n".join([lines[i] for i in bulk])).decode("utf-8")
            except UnicodeDecodeError:
                joined = None
                bulk = [i for i in bulk if _valid_utf8(lines[i], i, faults)]

        # Step 2: parse the bulk in one call; if that fails, isolate the bad values (see
        # reclock.sources.decode.isolate). When many pieces fail (systematically bad data), a Python screen
        # picks the likely culprits, which are parsed alone, so that the rest parses in bulk again.
        @rejecting
        def parse_lines(idx: list[int]) -> pa.Table:
            if joined is not None and len(idx) == len(lines):
                return _one_row_each(parse(joined, multiline=False), len(idx))
            return _one_row_each(parse(b"\n".join([lines[i] for i in idx]), multiline=False), len(idx))

        @rejecting
        def parse_alone(idx: list[int]) -> pa.Table:
            return _one_row_each(parse(b"\n".join([lines[i] for i in idx]), multiline=True), len(idx))

        def screen(idx: list[int]) -> list[bool]:
            guess = json_screen(self.schema) if is_json else csv_screen(self.schema, self.delimiter, self.quote_char)
            return guess([lines[i] for i in idx])

        def accept(idx: list[int], table: pa.Table) -> None:
            chunks.append((idx, table))

        def fault(i: int, problem: str) -> None:
            faults.append((i, DECODE, clip_message(problem)))

        isolate(bulk, parse_lines, accept, fault, screen=screen)
        for i in alone:
            bisect([i], parse_alone, accept, fault)
        if nulls:
            chunks.append((nulls, _null_table(self.schema, len(nulls))))

        # Step 3: put the good rows back in input order.
        errors = sorted(faults)
        if not chunks:
            return Decoded(empty_batch(self.schema), NO_ROWS, errors)
        order = np.concatenate([np.asarray(idx, dtype=np.int64) for idx, _ in chunks])
        table = pa.concat_tables([t.select(self.schema.names).cast(self.schema) for _, t in chunks])
        if len(chunks) > 1:
            perm = np.argsort(order, kind="stable")
            table = table.take(pa.array(perm))
            order = order[perm]
        return Decoded(_one_batch(table, self.schema), order, errors)

    def _classify(
        self, values: Sequence[bytes | None], nulls: list[int], alone: list[int], faults: list[RecordFault]
    ) -> tuple[list[bytes], list[int]]:
        """The slow path of step 1: one value at a time. Returns the lines and the bulk indices."""
        is_json = self.format == "json"
        lines: list[bytes] = [b""] * len(values)
        bulk: list[int] = []
        for i, value in enumerate(values):
            if value is None:
                nulls.append(i)
            elif is_json:
                if value[:1] != b"{" and value.lstrip()[:1] != b"{":
                    faults.append((i, DECODE, _not_an_object(value)))
                    continue
                if b"\n" in value or b"\r" in value:
                    # Raw newlines are only legal as whitespace in JSON, so this keeps its meaning.
                    value = value.replace(b"\n", b" ").replace(b"\r", b" ")
                lines[i] = value
                bulk.append(i)
            elif not value:
                faults.append((i, DECODE, "invalid csv: empty record"))
            else:
                lines[i] = value
                (alone if (b"\n" in value or b"\r" in value) else bulk).append(i)
        return lines, bulk

    def _parse_json(self, buf: bytes, *, multiline: bool) -> pa.Table:
        return pa_json.read_json(
            pa.BufferReader(buf),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(buf) + 1, 1 << 16)),
            parse_options=pa_json.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="ignore"),
        )

    def _parse_csv(self, buf: bytes, *, multiline: bool) -> pa.Table:
        return pa_csv.read_csv(
            pa.BufferReader(buf),
            read_options=pa_csv.ReadOptions(
                column_names=self.schema.names, use_threads=False, block_size=max(len(buf) + 1, 1 << 16)
            ),
            parse_options=pa_csv.ParseOptions(
                delimiter=self.delimiter, quote_char=self.quote_char, newlines_in_values=multiline
            ),
            convert_options=pa_csv.ConvertOptions(column_types={f.name: f.type for f in self.schema}),
        )

    # -- avro -----------------------------------------------------------------------------------

    def _decode_avro(self, values: Sequence[bytes | None], errors: list[RecordFault]) -> Decoded:
        return decode_avro(
            values,
            self._avro_parsed,
            self.schema,
            self.confluent,
            errors,
            writers=self._avro_writers,
            unknown_fields=self.unknown_fields,
            defaults=self.avro_defaults,
        )


# -- helpers ------------------------------------------------------------------------------------


class _Stop(Exception):
    def __init__(self, fault: RecordFault) -> None:
        self.fault = fault


class _FailFast(list[RecordFault]):
    """A fault list that stops decoding at the first fault."""

    def append(self, fault: RecordFault) -> None:
        raise _Stop(fault)


def _binary(values: Sequence[bytes | None]) -> pa.Array:
    return values.to_arrow() if isinstance(values, Values) else pa.array(values, pa.binary())


def _clean_join(values: Sequence[bytes | None], is_json: bool) -> bytes | None:
    """``values`` joined by newlines if none needs the slow path of step 1, else ``None``."""
    if isinstance(values, Values):
        joined = values.joined()
        if joined is not None and is_json and not (values.first_bytes() == _OPEN_BRACE).all():
            return None
        return joined
    if not values or None in values:
        return None
    present = cast("Sequence[bytes]", values)  # no None, checked just above
    joined = b"\n".join(present)
    if joined.count(b"\n") != len(values) - 1 or b"\r" in joined:
        return None
    lengths = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
    if not lengths.all():
        return None
    if is_json:
        starts = np.empty(len(values), dtype=np.int64)
        starts[0] = 0
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        if not (np.frombuffer(joined, dtype=np.uint8)[starts] == _OPEN_BRACE).all():
            return None
    return joined


def _null_table(schema: pa.Schema, n: int) -> pa.Table:
    return pa.table([pa.nulls(n, f.type) for f in schema], schema=schema)


def _one_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    table = table.combine_chunks()
    batches = table.to_batches()
    return batches[0] if batches else empty_batch(schema)


def _one_row_each(table: pa.Table, values: int) -> pa.Table:
    """``table`` if it holds one row per parsed value; a set parsed into more or fewer is rejected."""
    if table.num_rows != values:
        raise Rejected(f"parsed into {table.num_rows} rows, expected one")
    return table


def _valid_utf8(value: bytes, index: int, errors: list[RecordFault]) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        errors.append((index, DECODE, f"invalid json: not UTF-8 ({exc})"))
        return False
    return True


def _not_an_object(value: bytes) -> str:
    head = value.lstrip()[:1]
    if not head:
        return "invalid json: empty value"
    return f"invalid json: expected an object, got {value.lstrip()[:20]!r}"
