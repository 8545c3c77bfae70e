"""Decode raw record values into an output's Arrow schema, a whole batch at a time.

A :class:`Decoder` turns a list of raw values (``bytes``, or ``None`` for a Kafka tombstone) into
:class:`Decoded`: one :class:`pyarrow.RecordBatch` holding the rows that decoded, in input order,
the input indices of those rows (``good``), and ``(index, kind, message)`` for every value that did
not. Every input index is in exactly one of the two, so a bad record never vanishes: the reader
turns it into an :data:`~sources.base.ERRORS` row with its coordinates (see
:func:`decode_to_outputs`) or raises :class:`~sources.base.RecordError` when the policy is
``fail``.

Formats:

* ``json``: one JSON object per value, converted to the given schema (missing fields are null,
  unknown fields ignored, a type mismatch is a bad record). The batch is parsed by one
  :func:`pyarrow.json.read_json` call over the newline-joined values; only when that fails is it
  bisected to isolate the bad values, so a clean batch costs one vectorised parse and ``k`` bad
  values cost ``O(k log n)`` parses.
* ``csv``: one delimited row per value (no header), columns named and typed by the schema.
* ``text``: UTF-8 text into one string column ``value``.
* ``bytes``: the raw value into one binary column ``value``.
* ``avro``: schemaless Avro datum per value (fastavro), optionally in Confluent framing (magic byte
  ``0`` and a 4-byte schema id, stripped). The Arrow schema is derived from the Avro schema unless
  given.

A ``None`` value (a tombstone) decodes to a row of nulls, never to an error. Results are
deterministic per value: whether a value is good, and what it decodes to, does not depend on the
other values in its batch (values that ``read_json`` would mis-split, such as ``null`` or a
non-object, are rejected before the bulk parse; the bulk result is accepted only if it has exactly
one row per value).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from reclock.errors import ConfigError

__all__ = [
    "FORMATS",
    "Decoded",
    "Decoder",
    "Format",
    "RecordFault",
    "as_schema",
    "avro_to_arrow_schema",
    "make_decoder",
]

Format: TypeAlias = Literal["json", "csv", "text", "bytes", "avro"]
FORMATS: tuple[str, ...] = ("json", "csv", "text", "bytes", "avro")

#: ``(input index, kind, message)`` of a value that could not be decoded.
RecordFault: TypeAlias = tuple[int, str, str]

#: ``kind`` of every decoding fault (the message says what was wrong).
DECODE = "decode"

_VALUE_TEXT = pa.schema([pa.field("value", pa.string())])
_VALUE_BYTES = pa.schema([pa.field("value", pa.binary())])
_CONFLUENT_HEADER = 5
_MAX_MESSAGE = 500
#: Isolation of bad values: first pieces of this many values, then bisection down to ``_ALONE``.
_PIECE = 1024
_ALONE = 8


class Decoded(NamedTuple):
    """Result of :meth:`Decoder.decode`: ``batch`` row ``i`` is input value ``good[i]``."""

    batch: pa.RecordBatch
    good: np.ndarray
    errors: list[RecordFault]


@dataclass(frozen=True)
class Decoder:
    """A picklable, validated decoder for one output; build it with :func:`make_decoder`."""

    format: Format
    schema: pa.Schema
    delimiter: str = ","
    quote_char: str = '"'
    avro_schema: Any = None
    confluent: bool = False
    _avro_parsed: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.format == "avro":
            import fastavro

            reading = _avro_json(self.avro_schema)
            for logical in _AVRO_RAW_LOGICAL:  # read as their plain Avro values: see _AVRO_LOGICAL
                reading = _strip_logical(reading, logical)
            object.__setattr__(self, "_avro_parsed", fastavro.parse_schema(reading))

    def decode(self, values: Sequence[bytes | None], *, fail_fast: bool = False) -> Decoded:
        """Decode ``values``; every index lands in ``good`` or in ``errors``, never both.

        With ``fail_fast`` (the ``fail`` policy) the only error returned, with an empty batch, is
        the *first* bad value (lowest index): the caller is going to raise, naming it. Decoding
        stops at the first bad value it finds, which the bulk parse and bisection may find out of
        order, so the values before it are decoded again, until none of them is bad. A verdict
        never depends on the other values, so this costs a few parses of shorter prefixes.
        """
        decoded = self._decode(values, _FailFast() if fail_fast else [])
        if not (fail_fast and decoded.errors):
            return decoded
        first = decoded.errors[0]
        while first[0] > 0:
            earlier = self._decode(values[: first[0]], _FailFast()).errors
            if not earlier:
                break
            first = earlier[0]
        return Decoded(_empty(self.schema), _EMPTY, [first])

    def _decode(self, values: Sequence[bytes | None], faults: list[RecordFault]) -> Decoded:
        try:
            if self.format == "bytes":
                return _all_good(pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], schema=self.schema))
            if self.format == "text":
                return self._decode_text(values, faults)
            if self.format == "avro":
                return self._decode_avro(values, faults)
            return self._decode_bulk(values, faults)
        except _Stop as stop:
            return Decoded(_empty(self.schema), _EMPTY, [stop.fault])

    # -- text -----------------------------------------------------------------------------------

    def _decode_text(self, values: Sequence[bytes | None], faults: list[RecordFault]) -> Decoded:
        raw = pa.array(values, pa.binary())
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
        return _all_good(pa.RecordBatch.from_arrays([column], schema=self.schema))

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
            lines: Sequence[bytes] = values  # type: ignore[assignment]
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

        # Step 2: parse the bulk in one call. If that fails, try pieces of _PIECE values; failing
        # pieces are bisected. When many pieces fail (systematically bad data), a JSON batch is
        # first screened in Python for likely culprits, which are parsed alone, so that the rest
        # parses in bulk again. The screen only steers the work: every verdict comes from
        # pyarrow, on the value alone or in a set that parsed with one row per value.
        def parse_lines(idx: list[int]) -> pa.Table:
            if joined is not None and len(idx) == len(lines):
                return parse(joined, multiline=False)
            return parse(b"\n".join([lines[i] for i in idx]), multiline=False)

        if not _accept(bulk, parse_lines, chunks):
            if len(bulk) <= _PIECE:
                failed = [bulk]
            else:
                pieces = [bulk[i : i + _PIECE] for i in range(0, len(bulk), _PIECE)]
                failed = [piece for piece in pieces if not _accept(piece, parse_lines, chunks)]
            if len(failed) > 2:
                screen = _json_screen(self.schema) if is_json else _csv_screen(self)
                rest = [i for piece in failed for i in piece]
                verdicts = screen([lines[i] for i in rest])
                _isolate([i for i, ok in zip(rest, verdicts, strict=True) if ok], parse_lines, chunks, faults)
                for i, ok in zip(rest, verdicts, strict=True):
                    if not ok:
                        _isolate([i], parse_lines, chunks, faults)
            else:
                for piece in failed:
                    _isolate(piece, parse_lines, chunks, faults, tried=True)
        for i in alone:
            _isolate([i], lambda idx: parse(b"\n".join([lines[i] for i in idx]), multiline=True), chunks, faults)
        if nulls:
            chunks.append((nulls, _null_table(self.schema, len(nulls))))

        # Step 3: put the good rows back in input order.
        errors = sorted(faults)
        if not chunks:
            return Decoded(_empty(self.schema), _EMPTY, errors)
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
        import fastavro

        rows: list[Any] = []
        good: list[int] = []
        wrap = not _is_avro_record(self._avro_parsed)
        for i, value in enumerate(values):
            if value is None:
                rows.append(None)
                good.append(i)
                continue
            payload = value
            if self.confluent:
                if len(value) < _CONFLUENT_HEADER or value[0] != 0:
                    errors.append((i, DECODE, "invalid avro: missing Confluent framing (magic byte 0 + schema id)"))
                    continue
                payload = value[_CONFLUENT_HEADER:]
            fo = io.BytesIO(payload)
            try:
                datum = fastavro.schemaless_reader(fo, self._avro_parsed, None)
            except Exception as exc:  # fastavro raises many kinds on garbage
                errors.append((i, DECODE, _clip(f"invalid avro: {type(exc).__name__}: {exc}")))
                continue
            if fo.tell() != len(payload):
                errors.append((i, DECODE, f"invalid avro: {len(payload) - fo.tell()} trailing bytes after the datum"))
                continue
            rows.append({"value": datum} if wrap else datum)
            good.append(i)
        if not good:
            return Decoded(_empty(self.schema), _EMPTY, list(errors))
        dicts = [row if row is not None else {} for row in rows]
        try:
            batch = pa.RecordBatch.from_pylist(dicts, schema=self.schema)
            return Decoded(batch, np.asarray(good, dtype=np.int64), list(errors))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            pass
        # Slow path: find the rows Arrow rejects (a value outside the declared Arrow type).
        kept: list[dict[str, Any]] = []
        kept_idx: list[int] = []
        for i, row in zip(good, dicts, strict=True):
            try:
                pa.RecordBatch.from_pylist([row], schema=self.schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                errors.append((i, DECODE, _clip(f"avro datum does not fit the output schema: {exc}")))
                continue
            kept.append(row)
            kept_idx.append(i)
        batch = pa.RecordBatch.from_pylist(kept, schema=self.schema) if kept else _empty(self.schema)
        return Decoded(batch, np.asarray(kept_idx, dtype=np.int64), sorted(errors))


def make_decoder(
    format: str,
    schema: pa.Schema | None = None,
    *,
    delimiter: str = ",",
    quote_char: str = '"',
    avro_schema: str | Mapping[str, Any] | None = None,
    confluent: bool = False,
    field: str = "format",
) -> Decoder:
    """Validate a format's options and build its :class:`Decoder`.

    ``schema`` is the output's payload schema: required for ``json`` and ``csv``, fixed for
    ``text`` (``value: string``) and ``bytes`` (``value: binary``), derived from ``avro_schema``
    for ``avro`` when not given. ``field`` prefixes :class:`ConfigError` field names.
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
        parsed = _avro_json(avro_schema)
        import fastavro

        fastavro.parse_schema(parsed)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{field}.avro_schema", f"invalid Avro schema: {exc}") from exc
    except Exception as exc:  # fastavro's SchemaParseException and friends
        raise ConfigError(f"{field}.avro_schema", f"invalid Avro schema: {exc}") from exc
    derived = avro_to_arrow_schema(parsed, field=f"{field}.avro_schema")
    return Decoder("avro", schema if schema is not None else derived, avro_schema=parsed, confluent=bool(confluent))


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


def avro_to_arrow_schema(avro_schema: str | Mapping[str, Any], *, field: str = "avro_schema") -> pa.Schema:
    """The Arrow schema for an Avro schema: a record's fields, or one ``value`` column otherwise.

    Unions are supported only as ``["null", T]`` (a nullable ``T``).
    """
    parsed = _avro_json(avro_schema)
    named: dict[str, Any] = {}
    if isinstance(parsed, Mapping) and parsed.get("type") == "record":
        arrow = _avro_type(parsed, named, field)
        return pa.schema(list(arrow))
    return pa.schema([pa.field("value", _avro_type(parsed, named, field))])


# -- helpers ------------------------------------------------------------------------------------

_EMPTY = np.zeros(0, dtype=np.int64)
_OPEN_BRACE = ord("{")


class _Stop(Exception):
    def __init__(self, fault: RecordFault) -> None:
        self.fault = fault


class _FailFast(list):  # type: ignore[type-arg]
    """A fault list that stops decoding at the first fault."""

    def append(self, fault: RecordFault) -> None:  # type: ignore[override]
        raise _Stop(fault)


def _clean_join(values: Sequence[bytes | None], is_json: bool) -> bytes | None:
    """``values`` joined by newlines if none needs the slow path of step 1, else ``None``."""
    if not values or None in values:
        return None
    joined = b"\n".join(values)  # type: ignore[arg-type]
    if joined.count(b"\n") != len(values) - 1 or b"\r" in joined:
        return None
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))  # type: ignore[arg-type]
    if not lengths.all():
        return None
    if is_json:
        starts = np.empty(len(values), dtype=np.int64)
        starts[0] = 0
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        if not (np.frombuffer(joined, dtype=np.uint8)[starts] == _OPEN_BRACE).all():
            return None
    return joined


def _all_good(batch: pa.RecordBatch) -> Decoded:
    return Decoded(batch, np.arange(batch.num_rows, dtype=np.int64), [])


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def _null_table(schema: pa.Schema, n: int) -> pa.Table:
    return pa.table([pa.nulls(n, f.type) for f in schema], schema=schema)


def _one_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    table = table.combine_chunks()
    batches = table.to_batches()
    return batches[0] if batches else _empty(schema)


def _fixed(schema: pa.Schema | None, expected: pa.Schema, field: str) -> None:
    if schema is not None and not schema.equals(expected):
        raise ConfigError(field, f"this format always produces {expected.to_string()!r}; leave schema unset")


def _accept(
    indices: list[int], parse: Callable[[list[int]], pa.Table], chunks: list[tuple[list[int], pa.Table]]
) -> bool:
    """Try ``indices`` as one set: accepted only with exactly one row per value."""
    if not indices:
        return True
    try:
        table = parse(indices)
    except Exception:
        return False
    if table.num_rows != len(indices):
        return False
    chunks.append((indices, table))
    return True


def _isolate(
    indices: list[int],
    parse: Callable[[list[int]], pa.Table],
    chunks: list[tuple[list[int], pa.Table]],
    errors: list[RecordFault],
    *,
    tried: bool = False,
) -> None:
    """Parse ``indices`` at once; on failure narrow down until each bad value stands alone.

    A failing set is bisected; sets of at most :data:`_ALONE` values are parsed value by value.
    Only a whole set that parses into exactly one row per value is accepted, so the verdict for a
    value never depends on its neighbours.
    """
    if not indices:
        return
    problem = "failed"
    if not tried or len(indices) == 1:
        try:
            table = parse(indices)
            if table.num_rows == len(indices):
                chunks.append((indices, table))
                return
            problem = f"parsed into {table.num_rows} rows, expected one"
        except Exception as exc:  # pyarrow raises ArrowInvalid, and UnicodeDecodeError on bad UTF-8
            problem = f"{type(exc).__name__}: {exc}"
    if len(indices) == 1:
        errors.append((indices[0], DECODE, _clip(problem)))
    elif len(indices) <= _ALONE:
        for i in indices:
            _isolate([i], parse, chunks, errors)
    else:
        mid = len(indices) // 2
        _isolate(indices[:mid], parse, chunks, errors)
        _isolate(indices[mid:], parse, chunks, errors)


def _json_screen(schema: pa.Schema) -> Callable[[list[bytes]], list[bool]]:
    """A cheap Python guess whether pyarrow will accept a JSON value for ``schema``.

    Checks syntax and the JSON kind of each top-level field. It only decides which values are
    tried alone first; a wrong guess costs time, never correctness.
    """
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


def _csv_screen(decoder: Decoder) -> Callable[[list[bytes]], list[bool]]:
    """Like :func:`_json_screen` for CSV: field count and the text of numeric and bool fields."""
    checks = [_text_check(f.type) for f in decoder.schema]
    options = {"delimiter": decoder.delimiter, "quotechar": decoder.quote_char, "strict": True}

    def fits(row: list[str]) -> bool:
        return len(row) == len(checks) and all(t == "" or c(t) for t, c in zip(row, checks, strict=True))

    def one(value: bytes) -> bool:
        try:
            rows = list(csv.reader([value.decode("utf-8")], **options))
        except (UnicodeDecodeError, csv.Error):
            return False
        return len(rows) == 1 and fits(rows[0])

    def screen(values: list[bytes]) -> list[bool]:
        try:
            rows = list(csv.reader([v.decode("utf-8") for v in values], **options))
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


def _clip(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."


def _avro_json(avro_schema: Any) -> Any:
    if isinstance(avro_schema, str):
        stripped = avro_schema.strip()
        if stripped[:1] in ("{", "[", '"'):
            return json.loads(stripped)
        return stripped  # a primitive type name such as "string"
    if isinstance(avro_schema, Mapping):
        return dict(avro_schema)
    if isinstance(avro_schema, list):
        return list(avro_schema)
    raise TypeError(f"an Avro schema is JSON text or a dict, got {type(avro_schema).__name__}")


def _strip_logical(node: Any, logical: str) -> Any:
    if isinstance(node, list):
        return [_strip_logical(n, logical) for n in node]
    if isinstance(node, Mapping):
        return {k: _strip_logical(v, logical) for k, v in node.items() if not (k == "logicalType" and v == logical)}
    return node


def _is_avro_record(parsed: Any) -> bool:
    return isinstance(parsed, Mapping) and parsed.get("type") == "record"


_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}

#: Logical types whose Arrow type is their plain Avro value. Delta has no time-of-day type, so
#: ``time-millis`` stays milliseconds after midnight (int) and ``time-micros`` microseconds (long),
#: as Spark's Avro reader maps them; UUIDs stay plain strings.
_AVRO_RAW_LOGICAL = ("uuid", "time-millis", "time-micros")

#: Delta's widest decimal: a wider Avro decimal has no lossless column type.
_MAX_DECIMAL_PRECISION = 38

_AVRO_LOGICAL: dict[tuple[str, str], pa.DataType] = {
    ("int", "date"): pa.date32(),
    ("int", "time-millis"): pa.int32(),
    ("long", "time-micros"): pa.int64(),
    ("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
    ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
    ("long", "local-timestamp-millis"): pa.timestamp("ms"),
    ("long", "local-timestamp-micros"): pa.timestamp("us"),
    ("string", "uuid"): pa.string(),
}


def _avro_type(node: Any, named: dict[str, Any], field: str) -> Any:
    """Arrow type for an Avro type node; a record returns a struct type (iterable of fields)."""
    if isinstance(node, str):
        if node in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[node]
        if node in named:
            return named[node]
        raise ConfigError(field, f"unknown Avro type {node!r}")
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        if len(branches) == 1:
            return _avro_type(branches[0], named, field)
        raise ConfigError(field, f"only ['null', T] unions are supported, got {node!r}")
    if not isinstance(node, Mapping):
        raise ConfigError(field, f"invalid Avro type node {node!r}")
    kind = node.get("type")
    logical = node.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(node["precision"]), int(node.get("scale", 0))
        if precision > _MAX_DECIMAL_PRECISION:
            raise ConfigError(
                field, f"Avro decimal precision {precision} exceeds Delta's maximum of {_MAX_DECIMAL_PRECISION}"
            )
        result: Any = pa.decimal128(precision, scale)
    elif isinstance(kind, str) and (kind, logical) in _AVRO_LOGICAL:
        result = _AVRO_LOGICAL[(kind, logical)]
    elif kind == "record":
        fields = []
        for f in node.get("fields", []):
            # Every column is nullable: a tombstone decodes to a row of nulls.
            fields.append(pa.field(f["name"], _avro_type(f["type"], named, field)))
        result = pa.struct(fields)
    elif kind == "enum":
        result = pa.string()
    elif kind == "array":
        result = pa.list_(_avro_type(node["items"], named, field))
    elif kind == "map":
        result = pa.map_(pa.string(), _avro_type(node["values"], named, field))
    elif kind == "fixed":
        result = pa.binary(int(node["size"]))
    else:
        result = _avro_type(kind, named, field)
    if kind in ("record", "enum", "fixed") and "name" in node:
        named[node["name"]] = result
        if "namespace" in node:
            named[f"{node['namespace']}.{node['name']}"] = result
    return result
