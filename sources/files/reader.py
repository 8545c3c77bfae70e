"""Reading one file split in a Spark task: records as output batches, bad ones as ``_errors`` rows.

:meth:`FileReader.read` is a pure function of the split and of the file's first ``split.end``
bytes (rows for Parquet), so a replayed batch reads the very same records. Batches hold at most
65,536 rows, in file order, each starting with ``_partition`` and ``_offset``. A record that
fails to parse or convert goes to :data:`~reclock.sources.base.ERRORS` (kind :data:`PARSE`, or
:data:`CONVERT` for a Parquet value that does not fit its column) with its byte offset or row
index, its 1-based line number (row index for Parquet) in the message, and its raw bytes (at most
1 MiB); with ``on_record_error="fail"`` the first one raises :class:`~reclock.sources.base.RecordError`
instead. A file that cannot be read at all raises a plain exception: the runtime retries, then
skips the file or stops the batch.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from reclock.sources.base import ERRORS, LINEAGE_FIELDS, RecordError, Split, clip_message, error_batch
from reclock.sources.decode.isolate import PIECE
from reclock.sources.files.blocks import Records, cut_blocks, next_line_start, record_pattern
from reclock.sources.files.config import FileFormat
from reclock.sources.files.decompress import compression_of, decompressed
from reclock.sources.files.listing import unpack
from reclock.sources.files.parquet import read_rows, row_json
from reclock.sources.files.parse import RecordParser
from reclock.sources.files.store import FileStore
from reclock.timeline.frontier import UNKNOWN_FIELDS, encode_partition

__all__ = ["CONVERT", "PARSE", "FileReader", "FileSplit"]

#: ``kind`` of an errors row for a CSV or JSON record that did not parse or convert.
PARSE = "parse"
#: ``kind`` of an errors row for a Parquet value that does not fit its declared column.
CONVERT = "convert"

#: Largest batch :meth:`FileReader.read` yields, in rows.
_BATCH_ROWS = 65_536
#: Bytes read from a file at a time.
_READ_BYTES = 8 << 20
#: A CSV record (or JSON line) longer than this makes the file unreadable: memory stays bounded.
_MAX_RECORD_BYTES = 64 << 20
#: Records per piece when a batch's bad records are isolated (see reclock.sources.decode.isolate).
_PIECE = PIECE
#: Raw bytes kept of a bad record in the errors table.
_MAX_RAW = 1 << 20


@dataclass(frozen=True)
class FileSplit(Split):
    """A file, or a piece of one: ``[start, end)`` of partition ``(relative_path, generation)``.

    ``path`` is absolute (or an ``s3://`` URI), ``format`` the one the file is read as; ``size``
    is the file's upper when it was bound (bytes, or rows for Parquet). A whole file is ``[0,
    size)``; a piece of a large CSV or JSON lines file holds the records that *start* in
    ``[start, end)``, reading on past ``end`` to finish the last one.
    """

    path: str
    format: FileFormat
    size: int

    @property
    def stamp_at(self) -> int | None:
        """A compressed file is one unit of the source's time (bound whole at its compressed
        size) whose records are numbered by their place in the decompressed text: all of them
        are stamped at offset 0 of it (see :mod:`~reclock.sources.files.decompress`). ``None``:
        a record is stamped at its own offset."""
        return 0 if compression_of(self.path) is not None else None


@dataclass(frozen=True)
class FileReader:
    """What a Spark task needs to read any split of one source: a plain, picklable value."""

    output: str
    schema: pa.Schema
    csv_header: bool
    csv_delimiter: str
    csv_quote: str
    fail: bool
    store: FileStore
    #: Whether a quoted CSV field may hold a line end (then a CSV file is never cut into pieces).
    csv_multiline: bool = True
    #: Hand each record's undeclared fields on as :data:`~reclock.timeline.frontier.UNKNOWN_FIELDS` (JSON lines'
    #: other keys, the columns a CSV header names after the declared ones): schema evolution.
    unknown_fields: bool = False
    _parser: RecordParser = field(init=False, repr=False, compare=False)
    _record_re: re.Pattern[bytes] = field(init=False, repr=False, compare=False)
    _batch_schema: pa.Schema = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parser = RecordParser(self.schema, self.csv_delimiter, self.csv_quote, self.fail)
        object.__setattr__(self, "_parser", parser)
        object.__setattr__(self, "_record_re", record_pattern(self.csv_delimiter, self.csv_quote))
        unknown = [pa.field(UNKNOWN_FIELDS, pa.string())] if self.unknown_fields else []
        object.__setattr__(self, "_batch_schema", pa.schema([*LINEAGE_FIELDS, *self.schema, *unknown]))

    def read(self, split: FileSplit) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The records of one whole file as ``(output, batch)``, and bad ones as ``(ERRORS, batch)``."""
        encoded = encode_partition(split.partition)
        relative, _ = unpack(split.partition)
        if split.format == "parquet":
            yield from self._read_parquet(split, relative, encoded)
        else:
            yield from self._read_lines(split, relative, encoded)

    def groupable(self, split: FileSplit) -> bool:
        """Whether :mod:`~reclock.sources.files.group` may read ``split`` beside other files: a whole file,
        not compressed, without schema evolution (those are read by :meth:`read`, file by file)."""
        whole = split.start == 0 and split.end == split.size
        return whole and compression_of(split.path) is None and not self.unknown_fields

    def records(self, split: FileSplit) -> Iterator[tuple[Records, int]]:
        """A whole, uncompressed CSV or JSON lines file's records block by block, as ``(records,
        first)``: the block's records from index ``first`` on are data (a CSV header is the file's
        first record). The group reader's way in; see :meth:`groupable`."""
        is_csv = split.format == "csv"
        header = is_csv and self.csv_header
        with self.store.open(split.path) as (f, size):
            if size < split.size:
                raise ValueError(
                    f"{split.path} has {size} bytes but was bound with {split.size}: it shrank or was replaced "
                    "after it was bound and cannot be read again; drop it to re-ingest"
                )
            blocks = cut_blocks(
                f,
                split.size,
                where=split.path,
                quote=self.csv_quote.encode() if is_csv and self.csv_multiline else None,
                record_re=self._record_re,
                read_bytes=_READ_BYTES,
                max_record_bytes=_MAX_RECORD_BYTES,
            )
            for records in blocks:
                first = 0
                if header and len(records.starts):
                    header, first = False, 1  # the first record of the file is the header
                yield records, first

    def _read_lines(self, split: FileSplit, relative: str, encoded: str) -> Iterator[tuple[str, pa.RecordBatch]]:
        """CSV and JSON lines: cut into records block by block, parsed a batch of records at a time.

        A piece (``start > 0``) starts at the first line start at or after ``start`` and keeps
        the records starting before ``end``: each record belongs to exactly one piece. A
        compressed file is read whole, its records' offsets their byte positions in the
        decompressed text (see :mod:`~reclock.sources.files.decompress`).
        """
        is_csv = split.format == "csv"
        header = is_csv and self.csv_header and split.start == 0
        codec = compression_of(split.path)
        with self.store.open(split.path) as (f, size):
            if size < split.size:
                raise ValueError(
                    f"{split.path} has {size} bytes but was bound with {split.size}: it shrank or was replaced "
                    "after it was bound and cannot be read again; drop it to re-ingest"
                )
            start = split.start
            if codec is not None:
                stream, length = decompressed(f, split.size, codec, split.path), None
            else:
                if start:
                    start = next_line_start(f, start, split.size)
                    if start >= split.end:
                        return
                    f.seek(start)
                stream, length = f, split.size - start
            blocks = cut_blocks(
                stream,
                length,
                base=start,
                where=split.path,
                quote=self.csv_quote.encode() if is_csv and self.csv_multiline else None,
                record_re=self._record_re,
                read_bytes=_READ_BYTES,
                max_record_bytes=_MAX_RECORD_BYTES,
            )
            extras: tuple[str, ...] = ()
            parser = self._parser
            if self.unknown_fields and is_csv and self.csv_header and split.start > 0:
                f.seek(0)  # a later piece of the file: its columns are still named by the header
                parser, extras = self._header_parser(f.readline().rstrip(b"\r\n"))
                f.seek(start)
            for records in blocks:
                count = len(records.starts)
                last = count if codec is not None else int(np.searchsorted(records.starts, split.end - records.base))
                first = 0
                if header and last:
                    header, first = False, 1  # the first record of the file is the header
                    if self.unknown_fields:
                        parser, extras = self._header_parser(records.block[records.starts[0] : records.ends[0]])
                yield from self._parse(records, first, last, split, relative, encoded, parser, extras)
                if last < count:
                    return  # the next record starts in the next piece

    def _parse(
        self,
        records: Records,
        first: int,
        last: int,
        split: FileSplit,
        relative: str,
        encoded: str,
        parser: RecordParser,
        extras: tuple[str, ...],
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Records ``[first, last)`` of a block, parsed, each at the byte position it starts at;
        ``parser`` and ``extras``: the columns a CSV header names after the declared ones."""
        is_csv = split.format == "csv"
        positions = records.base + records.starts
        for lo in range(first, last, _BATCH_ROWS):
            hi = min(last, lo + _BATCH_ROWS)
            good, columns, faults = parser.parse(records, lo, hi, is_csv=is_csv, piece=_PIECE, where=split.path)
            if len(good):
                if self.unknown_fields:
                    columns = [*columns[: len(self.schema)], self._unknown(records, good, columns, extras, is_csv)]
                yield self.output, self._batch(encoded, positions[good], columns)
            if faults:
                yield (
                    ERRORS,
                    error_batch(
                        encoded,
                        [int(positions[k]) for k, _ in faults],
                        [PARSE] * len(faults),
                        [clip_message(f"{relative} {_where(records, k, split)}: {problem}") for k, problem in faults],
                        [records.block[records.starts[k] : records.ends[k]][:_MAX_RAW] for k, _ in faults],
                    ),
                )

    def _header_parser(self, line: bytes) -> tuple[RecordParser, tuple[str, ...]]:
        """The parser of a CSV file whose header names columns after the declared ones, and those
        names. A header that does not start with the declared names is read by position, as always."""
        names = next(
            csv.reader([line.decode("utf-8", "replace")], delimiter=self.csv_delimiter, quotechar=self.csv_quote)
        )
        declared = self.schema.names
        if len(names) <= len(declared) or names[: len(declared)] != declared:
            return self._parser, ()
        extras = tuple(names[len(declared) :])
        schema = pa.schema([*self.schema, *(pa.field(f"{UNKNOWN_FIELDS}{i}", pa.string()) for i in range(len(extras)))])
        return RecordParser(schema, self.csv_delimiter, self.csv_quote, self.fail), extras

    def _unknown(
        self, records: Records, good: np.ndarray, columns: Sequence[pa.Array], extras: tuple[str, ...], is_csv: bool
    ) -> pa.Array:
        """Each good record's undeclared fields as one JSON object, or null when it has none.

        JSON lines: the keys of the record's object that are not declared columns (one
        ``json.loads`` a record). CSV: the non-empty values of the header's extra columns.
        """
        if is_csv:
            if not extras:
                return pa.nulls(len(good), pa.string())
            values = [c.to_pylist() for c in columns[len(self.schema) :]]
            rows = ({n: v for n, v in zip(extras, row, strict=True) if v} for row in zip(*values, strict=True))
        else:
            declared = set(self.schema.names)
            block, starts, ends = records.block, records.starts, records.ends
            objects = (json.loads(block[starts[k] : ends[k]]) for k in good)
            rows = ({n: v for n, v in obj.items() if n not in declared} for obj in objects)
        return pa.array(
            [json.dumps(row, separators=(",", ":"), ensure_ascii=False) if row else None for row in rows], pa.string()
        )

    def _read_parquet(self, split: FileSplit, relative: str, encoded: str) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Parquet: rows cast to the declared columns; a row with a value that does not fit is bad."""
        for rows in read_rows(split.path, split.end, self.schema, _BATCH_ROWS, self.store):
            offsets = np.arange(rows.offset, rows.offset + rows.num_rows, dtype=np.int64)
            bad = rows.bad
            if not bad:
                yield self.output, self._batch(encoded, offsets, rows.columns)
                continue
            if self.fail:
                i = min(bad)
                raise RecordError(f"{split.path}: row {rows.offset + i}: {bad[i]} (on_record_error='fail')")
            keep = np.asarray([i for i in range(rows.num_rows) if i not in bad], dtype=np.int64)
            if len(keep):
                taken = pa.array(keep)
                yield self.output, self._batch(encoded, offsets[keep], [c.take(taken) for c in rows.columns])
            assert rows.batch is not None, "a row without any declared column cannot be bad"
            order = sorted(bad)
            yield (
                ERRORS,
                error_batch(
                    encoded,
                    [rows.offset + i for i in order],
                    [CONVERT] * len(order),
                    [clip_message(f"{relative} row {rows.offset + i}: {bad[i]}") for i in order],
                    [row_json(rows.batch, i)[:_MAX_RAW] for i in order],
                ),
            )

    def _batch(self, encoded: str, offsets: np.ndarray, columns: Sequence[pa.Array]) -> pa.RecordBatch:
        n = len(offsets)
        return pa.RecordBatch.from_arrays(
            [pa.repeat(pa.scalar(encoded, pa.string()), n), pa.array(offsets, pa.int64()), *columns],
            schema=self._batch_schema,
        )


def _where(records: Records, k: int, split: FileSplit) -> str:
    """Where record ``k`` is, for a message: its line, or its byte in a piece after the first
    (whose line number is not known without reading the file up to it)."""
    if split.start == 0:
        return f"line {int(records.lines[k])}"
    return f"byte {int(records.base + records.starts[k])}"
