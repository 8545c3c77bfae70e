"""Reading one file split in a Spark task: records as output batches, bad ones as ``_errors`` rows.

:meth:`FileReader.read` is a pure function of the split and of the file's first ``split.end``
bytes (rows for Parquet), so a replayed batch reads the very same records. Batches hold at most
65,536 rows, in file order, each starting with ``_partition`` and ``_offset``. A record that
fails to parse or convert goes to :data:`~sources.base.ERRORS` (kind :data:`PARSE`, or
:data:`CONVERT` for a Parquet value that does not fit its column) with its byte offset or row
index, its 1-based line number (row index for Parquet) in the message, and its raw bytes (at most
1 MiB); with ``on_record_error="fail"`` the first one raises :class:`~sources.base.RecordError`
instead. A file that cannot be read at all raises a plain exception: the runtime retries, then
skips the file or stops the batch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from reclock.sources.base import ERRORS, LINEAGE_FIELDS, RecordError, Split, clip_message, error_batch
from reclock.sources.decode.isolate import PIECE
from reclock.sources.files.blocks import Records, cut_blocks, record_pattern
from reclock.sources.files.config import FileFormat
from reclock.sources.files.parquet import read_rows, row_json
from reclock.sources.files.parse import RecordParser
from reclock.time import encode_partition

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
#: Records per piece when a batch's bad records are isolated (see sources.decode.isolate).
_PIECE = PIECE
#: Raw bytes kept of a bad record in the errors table.
_MAX_RAW = 1 << 20


@dataclass(frozen=True)
class FileSplit(Split):
    """One whole file: ``[0, end)`` of partition ``(relative_path, generation)``.

    ``path`` is absolute, ``format`` the one the file is read as; ``end`` is the file's upper when
    it was bound (bytes, or rows for Parquet).
    """

    path: str
    format: FileFormat


@dataclass(frozen=True)
class FileReader:
    """What a Spark task needs to read any split of one source: a plain, picklable value."""

    output: str
    schema: pa.Schema
    csv_header: bool
    csv_delimiter: str
    csv_quote: str
    fail: bool
    _parser: RecordParser = field(init=False, repr=False, compare=False)
    _record_re: re.Pattern[bytes] = field(init=False, repr=False, compare=False)
    _batch_schema: pa.Schema = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parser = RecordParser(self.schema, self.csv_delimiter, self.csv_quote, self.fail)
        object.__setattr__(self, "_parser", parser)
        object.__setattr__(self, "_record_re", record_pattern(self.csv_delimiter, self.csv_quote))
        object.__setattr__(self, "_batch_schema", pa.schema([*LINEAGE_FIELDS, *self.schema]))

    def read(self, split: FileSplit) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The records of one whole file as ``(output, batch)``, and bad ones as ``(ERRORS, batch)``."""
        encoded = encode_partition(split.partition)
        relative = split.partition[0]
        if split.format == "parquet":
            yield from self._read_parquet(split, relative, encoded)
        else:
            yield from self._read_lines(split, relative, encoded)

    def records(self, split: FileSplit) -> Iterator[tuple[Records, int]]:
        """A CSV or JSON lines file's records block by block, as ``(records, first)``: the
        block's records from index ``first`` on are data (a CSV header is the file's first record)."""
        is_csv = split.format == "csv"
        header = is_csv and self.csv_header
        blocks = cut_blocks(
            split.path,
            split.end,
            quote=self.csv_quote.encode() if is_csv else None,
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
        """CSV and JSON lines: cut into records block by block, parsed a batch of records at a time."""
        is_csv = split.format == "csv"
        for records, first in self.records(split):
            count = len(records.starts)
            for lo in range(first, count, _BATCH_ROWS):
                hi = min(count, lo + _BATCH_ROWS)
                good, columns, faults = self._parser.parse(
                    records, lo, hi, is_csv=is_csv, piece=_PIECE, where=split.path
                )
                if len(good):
                    yield self.output, self._batch(encoded, records.base + records.starts[good], columns)
                if faults:
                    yield (
                        ERRORS,
                        error_batch(
                            encoded,
                            [int(records.base + records.starts[k]) for k, _ in faults],
                            [PARSE] * len(faults),
                            [
                                clip_message(f"{relative} line {int(records.lines[k])}: {problem}")
                                for k, problem in faults
                            ],
                            [records.block[records.starts[k] : records.ends[k]][:_MAX_RAW] for k, _ in faults],
                        ),
                    )

    def _read_parquet(self, split: FileSplit, relative: str, encoded: str) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Parquet: rows cast to the declared columns; a row with a value that does not fit is bad."""
        for rows in read_rows(split.path, split.end, self.schema, _BATCH_ROWS):
            offsets = np.arange(rows.offset, rows.offset + rows.count, dtype=np.int64)
            bad = rows.bad
            if not bad:
                yield self.output, self._batch(encoded, offsets, rows.columns)
                continue
            if self.fail:
                i = min(bad)
                raise RecordError(f"{split.path}: row {rows.offset + i}: {bad[i]} (on_record_error='fail')")
            keep = np.asarray([i for i in range(rows.count) if i not in bad], dtype=np.int64)
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
