"""Files: a local directory (or glob) of CSV, JSON lines and Parquet files, one file per partition.

Definitions, and why each matters to exactly-once ingestion:

* **Partition.** File ``f`` is the partition ``(relative_path, generation)``: ``relative_path`` is
  relative to the directory (or to the fixed, magic-free prefix directory of a glob) with ``/``
  separators, ``generation`` an ``int`` that starts at 0. Dropping a file
  (``ALTER PIPELINE ... DROP FILE``) makes the runtime bump its generation in the JSON file at
  ``generations_path`` (``{relative_path: generation}``; missing means all 0). The file then
  reappears as a *new* partition at offset 0 and is ingested again; the old partition stays
  complete in every frontier, so nothing is ever read twice by accident.
* **Offsets.** CSV and JSON lines: a record's offset is the byte position in the file where its
  line starts (for a CSV record with quoted newlines, its first line; a UTF-8 byte order mark is
  skipped, so a file that has one starts its first record at 3). A CSV header is not a record.
  Parquet: the row index. A file's **upper** is its size in bytes (CSV, JSON lines) or its row
  count from the footer (Parquet, no data read), so a file is always bound *whole*. A file with
  upper 0 (empty) never shows in a frontier; a CSV holding only its header has upper = its size
  and reads zero rows.
* **What is listed.** Regular files, and links to them whose target is inside the directory
  (``follow_links_outside`` lifts that limit). Dangling links, links out of the directory,
  FIFOs, sockets and devices are never read, and a FIFO is never even opened, so nothing can
  block on one; :meth:`FilesSource.listing` reports them with the reason, and empty files too.
* **Discovery order.** Files are ordered by modification time, then relative path, then
  generation. :meth:`FilesSource.cap` takes files in that order, so older files land first.
* **Read-only, immutable.** Source files are opened read-only and never modified, moved or
  deleted. A file is taken as final once listed: a file whose size grows after it was bound is
  not read again (only a drop re-ingests it), and ``settle_seconds`` keeps files that are still
  being written out of the listing. :meth:`FilesSource.read` of a split is a pure function of the
  file's first ``split.end`` bytes (rows for Parquet), so a replayed batch reads the very same
  records; a file that became shorter than that (or, for Parquet, changed its row count) cannot
  be replayed and raises.

Records: a CSV record is positional (the header line, when ``csv_header`` is set, is skipped
without being interpreted), with RFC 4180 quoting as Python's csv reads it (doubled quotes; a
quoted field left open runs to the end of the file) and ``\\n`` or ``\\r\\n`` line ends. A CSV
field converts as pyarrow's cast does, after trimming surrounding whitespace unless the column
is a ``string``; an empty field is null, except in ``string`` columns where it is ``""``
(``bool`` takes ``true``/``false``/``1``/``0`` in any case). A JSON lines record is one object
per line, typed by pyarrow's JSON reader (an ``int64`` column rejects ``1.5`` and ``"1"``);
unknown fields are ignored, missing ones are null. Text for a ``timestamp`` is ISO 8601 (a zone
offset converts to UTC, none means UTC), for a ``date`` ``YYYY-MM-DD``. Blank lines (and
whitespace-only JSON lines) are not records.

A record that fails to parse or convert goes to :data:`~sources.base.ERRORS` (kind ``parse``, or
``convert`` for a Parquet value that does not fit its column) with its byte offset or row index,
its 1-based line number (row index for Parquet) in the message, and its raw bytes (at most
1 MiB); with ``on_record_error="fail"`` the first one raises :class:`~sources.base.RecordError`
instead. A file that cannot be read at all (corrupt Parquet, permissions, a CSV record over
64 MiB) raises a plain exception: the runtime retries, then skips the file or stops the batch. A
Parquet file whose footer cannot be read is listed with upper 1, so that it reaches
:meth:`FilesSource.read` and fails there, visibly.

Reading is streamed with bounded memory: 8 MiB blocks are cut into records while tracking byte
positions (numpy finds the line ends; a CSV block holding the quote character is cut by one
regex scan that follows Python's csv quoting), and up to 65,536 records at a time are parsed by
one pyarrow call over their contiguous bytes. CSV is parsed into raw fields and converted column
by column, so a record with the wrong number of fields or a value that does not convert is found
without parsing again; JSON lines that fail are isolated by parsing pieces and bisecting them.
Whether a record is good never depends on its neighbours or on where a block was cut.

Out of scope for now: row-range splitting of large files (one split reads one whole file),
compressed files, object stores.
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import json
import logging
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, BinaryIO, Literal, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from reclock.errors import ConfigError
from reclock.time import Frontier, Partition, encode_partition
from sources.base import ERRORS, LINEAGE_FIELDS, Output, RecordError, SourceBase, Split, error_batch

__all__ = [
    "COLUMN_TYPES",
    "CONVERT",
    "FORMATS",
    "PARSE",
    "FileFormat",
    "FileSplit",
    "FilesSource",
    "ListedFile",
]

FileFormat: TypeAlias = Literal["csv", "jsonl", "parquet"]
FORMATS: tuple[str, ...] = ("csv", "jsonl", "parquet")

#: The column type names ``columns`` accepts, and the Arrow type each one lands as.
COLUMN_TYPES: Mapping[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}

#: ``kind`` of an errors row for a CSV or JSON record that did not parse or convert.
PARSE = "parse"
#: ``kind`` of an errors row for a Parquet value that does not fit its declared column.
CONVERT = "convert"

_EXTENSIONS: Mapping[str, FileFormat] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
_POLICIES = ("fail", "skip")
_RESERVED = frozenset(f.name for f in LINEAGE_FIELDS)
_UTC = pa.timestamp("us", tz="UTC")
_NAIVE = pa.timestamp("us")

#: Largest batch :meth:`FilesSource.read` yields, in rows.
_BATCH_ROWS = 65_536
#: Bytes read from a file at a time.
_READ_BYTES = 8 << 20
#: A CSV record (or JSON line) longer than this makes the file unreadable: memory stays bounded.
_MAX_RECORD_BYTES = 64 << 20
#: Raw bytes kept of a bad record in the errors table.
_MAX_RAW = 1 << 20
_MAX_MESSAGE = 500
#: Isolation of bad records: pieces of this many records first, then bisection down to ``_ALONE``.
_PIECE = 1024
_ALONE = 8
_BOM = b"\xef\xbb\xbf"
_NEWLINE = ord("\n")
_RETURN = ord("\r")
_OPEN_BRACE = ord("{")
#: What text of each type usually looks like: steers the search for values that do not convert.
_LIKELY_TEXT: Mapping[pa.DataType, str] = {
    pa.int64(): r"^[+-]?[0-9]+$",
    pa.int32(): r"^[+-]?[0-9]+$",
    pa.float64(): r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$|^[+-]?(?i:nan|inf|infinity)$",
    pa.bool_(): r"^(?i:true|false|1|0)$",
    pa.date32(): r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    _UTC: r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9:.,]+)?(?:Z|z|[+-][0-9:]+)?$",
}
#: Upper of a Parquet file whose footer cannot be read: it binds, and its read raises.
_UNREADABLE_PARQUET_UPPER = 1

log = logging.getLogger(__name__)

#: What a parse of some records returns: the good ones, their columns, and ``(record, problem)``.
_Parsed: TypeAlias = tuple[list[int], list[pa.Array], list[tuple[int, str]]]


def _wall_clock_ms() -> int:
    """The default clock: wall time in ms since the epoch (only the driver's ``upper`` reads it)."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class FileSplit(Split):
    """One whole file: ``[0, end)`` of partition ``(relative_path, generation)``.

    ``path`` is absolute, ``format`` the one the file is read as; ``end`` is the file's upper when
    it was bound (bytes, or rows for Parquet).
    """

    path: str
    format: FileFormat


@dataclass(frozen=True)
class ListedFile:
    """One candidate file as the source sees it now (see :meth:`FilesSource.listing`).

    ``path`` is relative with ``/`` separators, ``generation`` its current one; ``upper`` is in
    bytes (rows for Parquet), 0 for an ignored file; ``ignored`` says why the source never reads
    it (``None`` when it does); ``settling`` that it is too recently modified to be taken yet.
    """

    path: str
    generation: int
    upper: int
    settling: bool
    ignored: str | None


@dataclass(frozen=True)
class _Listed:
    """A file as one probe saw it."""

    relative: str
    path: str
    format: FileFormat
    size: int
    mtime_ns: int


@dataclass(frozen=True, eq=False)
class _Records:
    """Records cut from one block of a line file; positions are relative to ``block``.

    Record ``k`` spans ``block[starts[k]:stops[k]]`` (its line end included) and its text without
    the line end is ``block[starts[k]:ends[k]]``; it starts on 1-based line ``lines[k]``.
    """

    block: bytes
    base: int
    starts: np.ndarray
    stops: np.ndarray
    ends: np.ndarray
    lines: np.ndarray
    quoted: bool


class FilesSource(SourceBase):
    """Files under a directory or matching a glob, landed whole, exactly once per generation.

    A plain, picklable value: :meth:`read` needs nothing but the source's settings and the split,
    so a Spark task can read any file the driver bound. The clock and the probe's caches stay on
    the driver.
    """

    #: A file deleted, archived or dropped leaves the probe; that is not a recreated source.
    forgets_partitions = True
    #: Partitions are ``(path, generation)``: the runtime keeps the ``files`` status table for them.
    is_file_source = True

    def __init__(
        self,
        *,
        path: str | os.PathLike[str],
        format: str | None = None,
        output: str = "rows",
        columns: Mapping[str, str] | None = None,
        csv_header: bool = True,
        csv_delimiter: str = ",",
        csv_quote: str = '"',
        on_record_error: str = "skip",
        max_files_per_batch: int = 100,
        settle_seconds: float = 0.0,
        generations_path: str | os.PathLike[str] | None = None,
        follow_links_outside: bool = False,
        now: Callable[[], int] | None = None,
    ) -> None:
        """Validate every setting eagerly, so a bad pipeline fails at definition, naming the field.

        ``path`` is a directory (searched recursively) or a glob (``**`` allowed); hidden files
        and directories (names starting with ``.``) are never listed. Without ``format`` each
        file's format follows its extension (``.csv``; ``.jsonl``, ``.json``, ``.ndjson``;
        ``.parquet``, case-insensitive) and other files are ignored; with it, every listed file
        is read in that format. ``columns`` maps column names to type names (see
        :data:`COLUMN_TYPES`); only ``format="parquet"`` may leave it out, and then the schema is
        read from the first Parquet file (in discovery order) now. A symbolic link is followed
        when its target is inside the directory (or ``follow_links_outside`` is set); otherwise
        the file is listed as ignored (see :meth:`listing`), never read.
        """
        self.root, self.pattern = _check_path(path)
        if format is not None and format not in FORMATS:
            raise ConfigError("format", f"must be one of {', '.join(FORMATS)} (or unset to infer it), got {format!r}")
        self.format: FileFormat | None = format  # type: ignore[assignment]
        if not isinstance(output, str) or not output or output == ERRORS:
            raise ConfigError("output", f"must be a non-empty name other than {ERRORS!r}, got {output!r}")
        self.output = output
        if not isinstance(csv_header, bool):
            raise ConfigError("csv_header", f"must be true or false, got {csv_header!r}")
        self.csv_header = csv_header
        self.csv_delimiter = _check_char("csv_delimiter", csv_delimiter)
        self.csv_quote = _check_char("csv_quote", csv_quote)
        if self.csv_delimiter == self.csv_quote:
            raise ConfigError("csv_delimiter", f"must differ from csv_quote ({csv_quote!r})")
        if on_record_error not in _POLICIES:
            raise ConfigError("on_record_error", f"must be one of {', '.join(_POLICIES)}, got {on_record_error!r}")
        self.on_record_error = on_record_error
        if not isinstance(max_files_per_batch, int) or isinstance(max_files_per_batch, bool) or max_files_per_batch < 1:
            raise ConfigError("max_files_per_batch", f"must be an integer >= 1, got {max_files_per_batch!r}")
        self.max_files_per_batch = max_files_per_batch
        if (
            isinstance(settle_seconds, bool)
            or not isinstance(settle_seconds, (int, float))
            or not math.isfinite(settle_seconds)
            or settle_seconds < 0
        ):
            raise ConfigError("settle_seconds", f"must be a finite number of seconds >= 0, got {settle_seconds!r}")
        self.settle_seconds = float(settle_seconds)
        if generations_path is not None and not isinstance(generations_path, (str, os.PathLike)):
            raise ConfigError("generations_path", f"must be a file path or unset, got {generations_path!r}")
        self.generations_path = None if generations_path is None else os.path.abspath(os.fspath(generations_path))
        if not isinstance(follow_links_outside, bool):
            raise ConfigError("follow_links_outside", f"must be true or false, got {follow_links_outside!r}")
        self.follow_links_outside = follow_links_outside
        if now is not None and not callable(now):
            raise ConfigError("now", f"must be a callable returning ms since the epoch, got {now!r}")
        self._now: Callable[[], int] = now if now is not None else _wall_clock_ms
        self._reset_probe_state()
        if columns is None:
            if self.format != "parquet":
                raise ConfigError(
                    "columns",
                    "required for csv and jsonl files (and whenever format is inferred); "
                    "only format='parquet' can take its schema from the first file",
                )
            self.schema = self._first_parquet_schema()
        else:
            self.schema = _check_columns(columns)
        self._batch_schema = pa.schema([*LINEAGE_FIELDS, *self.schema])
        # JSON lines parse timestamps and dates as text, then convert them (see _convert); CSV
        # parses every field raw (see _parse_csv).
        self._text_schema = pa.schema(
            [pa.field(f.name, pa.string() if f.type in (_UTC, pa.date32()) else f.type) for f in self.schema]
        )
        self._record_re = _record_pattern(self.csv_delimiter, self.csv_quote)

    def __repr__(self) -> str:
        where = self.pattern if self.pattern is not None else self.root
        return f"FilesSource(path={where!r}, format={self.format!r}, output={self.output!r})"

    # -- pickling: the clock and the probe's caches stay on the driver -------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Drop the clock (a test's lambda cannot be pickled) and the driver-only caches."""
        state = dict(self.__dict__)
        for name in ("_now", "_order", "_footers", "_warned", "_high", "_listed"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore with the wall clock and empty caches, so a copy can still probe."""
        self.__dict__.update(state)
        self._now = _wall_clock_ms
        self._reset_probe_state()

    def _reset_probe_state(self) -> None:
        #: Discovery-order key of every partition the probe has seen, for :meth:`cap`.
        self._order: dict[Partition, tuple[int, str, int]] = {}
        #: Parquet row counts by ``(path, size, mtime_ns)``: a footer is read once per version.
        self._footers: dict[tuple[str, int, int], int | None] = {}
        #: Partitions already warned about for changing after they were bound.
        self._warned: set[Partition] = set()
        #: The last frontier :meth:`upper` returned: probes never go below it (see there).
        self._high: dict[Partition, int] = {}
        #: ``{(relative_path, current generation): upper}`` of the files the last probe listed.
        self._listed: dict[Partition, int] = {}

    # -- the driver side ---------------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        """One append-only output holding the declared columns (lineage columns come on top)."""
        return [Output(self.output, self.schema)]

    def upper(self) -> Frontier:
        """The probe: ``{(relative_path, generation): upper}`` of every settled file listed now.

        Called on the driver before each batch. Re-reads the generations file every time (the
        runtime rewrites it when a file is dropped). A file modified less than ``settle_seconds``
        ago is left out, as it may still be being written; it shows in a later probe.

        Never below the bound frontier, which the pipeline checks: the older generations of a
        dropped file stay in it (at the file's upper), and within a process the probe never goes
        below the previous one, so a file that is deleted, shrinks or is dropped keeps its
        partition at its old offset. (After a restart, a file deleted or shrunk since it was
        bound is not known any more; the pipeline then reports the source as changed.)
        """
        listed = self._list()
        generations = self.generations()
        now_ms = int(self._now()) if self.settle_seconds > 0 else 0
        offsets: dict[Partition, int] = {}
        self._listed = {}
        for f in listed:
            if self._settling(f, now_ms):
                continue
            generation = generations.get(f.relative, 0)
            partition = (f.relative, generation)
            upper = f.size if f.format != "parquet" else self._parquet_upper(f)
            offsets[partition] = self._listed[partition] = upper
            self._order[partition] = (f.mtime_ns, f.relative, generation)
            for old in range(generation):  # dropped generations: still complete where they were bound
                offsets.setdefault((f.relative, old), self._high.get((f.relative, old), upper))
        frontier = Frontier(self._high).join(Frontier(offsets))
        self._high = dict(frontier.items())
        return frontier

    def cap(self, lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
        """The next batch's frontier: up to ``max_files_per_batch`` whole new files, oldest first.

        Called on the driver right after :meth:`upper`. A file is *new* when the last probe
        listed it in its current generation and ``lower`` has it at offset 0: it was never bound.
        It is bound whole, at the upper the probe listed. ``max_records`` is ignored on purpose:
        offsets are bytes or rows, not records, and a file is the unit of atomicity (cutting it
        would bind half a file and then need a split starting mid-file). At least one file is
        taken whenever one is new, so a single huge file still makes progress. A file ``lower``
        already has but that grew since changed after it was bound: it is not read again (a
        warning is logged once) and only a drop re-ingests it. Older generations of a dropped
        file, and files no longer listed, are never taken.
        """
        if upper.is_closed or lower.is_closed:
            raise ValueError("a files source is never closed; got a closed frontier")
        fresh: list[Partition] = []
        for partition, end in upper.items():
            listed = self._listed.get(partition)
            if listed is None:
                continue
            start = lower.offset(partition)
            if start == 0:
                fresh.append(partition)
            elif start < min(end, listed) and partition not in self._warned:
                self._warned.add(partition)
                log.warning(
                    "file %s changed after it was bound (bound up to %d, now %d); it is not read again unless dropped",
                    partition,
                    start,
                    listed,
                )
        chosen = sorted(fresh, key=self._sort_key)[: self.max_files_per_batch]
        return lower.join(Frontier({p: min(upper.offset(p), self._listed[p]) for p in chosen}))

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[FileSplit]:
        """One :class:`FileSplit` per file with ``lower < upper``, in discovery order.

        A file is read whole, so its split starts at 0; a file bound part-way (``0 < lower <
        upper``, which :meth:`cap` never produces) is a bug in the caller and raises
        ``ValueError``. The partition carries its generation, so splits depend only on the two
        frontiers (never on the generations file, which may have moved on since the batch was
        bound): a replayed batch gets the same splits.
        """
        if upper.is_closed:
            raise ValueError("a files source is never closed; got a closed upper frontier")
        out: list[FileSplit] = []
        for partition, end in upper.items():
            start = lower.offset(partition)
            if start >= end:
                continue
            if start != 0:
                raise ValueError(
                    f"file {partition!r} was bound up to offset {start} of {end}: a file is read whole, "
                    "so its split must start at 0"
                )
            out.append(self._file_split(partition, end))
        out.sort(key=lambda s: self._sort_key(s.partition))
        return out

    def end(self) -> Frontier | None:
        """Never known: a new file may arrive at any time."""
        return None

    # -- the task side -----------------------------------------------------------------------------

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Read one whole file: its records as ``(output, batch)`` and bad ones as ``(ERRORS, batch)``.

        Batches hold at most 65,536 rows, in file order, each starting with ``_partition`` and
        ``_offset``. Replayable: the same split yields the same batches as long as the file's
        first ``split.end`` bytes (Parquet: its rows) are unchanged.
        """
        if split.start != 0 or split.end <= 0:
            raise ValueError(f"split of {split.partition!r} is [{split.start}, {split.end}): a file reads [0, end)")
        if not isinstance(split, FileSplit):
            split = self._file_split(split.partition, split.end)
        encoded = encode_partition(split.partition)
        relative = split.partition[0]
        if split.format == "parquet":
            yield from self._read_parquet(split, relative, encoded)
        else:
            yield from self._read_lines(split, relative, encoded)

    # -- listing -----------------------------------------------------------------------------------

    def listing(self) -> list[ListedFile]:
        """Every candidate file now, read or not, with its current generation: for ``reclock files``.

        Called on the driver or by the CLI, never on the batch path; reads metadata and Parquet
        footers only. A file the probe takes has ``ignored`` ``None``; one it never takes says
        why: ``"dangling link"``, ``"link outside the source directory"`` (unless
        ``follow_links_outside``), ``"not a regular file (fifo)"`` (never opened, so this can not
        block), ``"empty file"``, or ``"no rows"`` (a Parquet file). An empty file is ignored
        rather than bound: upper 0 never shows in a frontier, so if it gains bytes later it is
        still new and is ingested then.
        """
        listed, ignored = self._scan()
        generations = self.generations()
        now_ms = int(self._now()) if self.settle_seconds > 0 else 0
        out = []
        for f in listed:
            upper = f.size if f.format != "parquet" else self._parquet_upper(f, warn=False)
            why = None if upper else "empty file" if f.size == 0 else "no rows"
            generation = generations.get(f.relative, 0)
            out.append(ListedFile(f.relative, generation, upper, self._settling(f, now_ms), why))
        out += [ListedFile(relative, generations.get(relative, 0), 0, False, why) for relative, why in ignored]
        return out

    def _settling(self, f: _Listed, now_ms: int) -> bool:
        """Whether ``f`` was modified less than ``settle_seconds`` ago: it may still be being written."""
        return self.settle_seconds > 0 and now_ms - f.mtime_ns / 1_000_000 < self.settle_seconds * 1000

    def _list(self) -> list[_Listed]:
        """Every file the source reads, now, in discovery order (mtime, then relative path)."""
        return self._scan()[0]

    def _scan(self) -> tuple[list[_Listed], list[tuple[str, str]]]:
        """The files the source reads now, in discovery order, and ``(relative_path, why)`` of the
        candidates it never reads: dangling links, links out of the directory, special files.

        Only metadata is read (``lstat``, ``stat``): a FIFO or a device is never opened, so the
        probe cannot block on one. Directories (a glob can match them) are neither. A path is
        outside the directory when its real path (every link resolved, a linked directory on the
        way included) is not under the directory's real path.
        """
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"files source directory {self.root} does not exist (any more)")
        if self.pattern is not None:
            candidates: Iterator[str] = (os.path.abspath(p) for p in glob.iglob(self.pattern, recursive=True))
        else:
            candidates = _walk(self.root)
        real_root = os.path.realpath(self.root)
        real_dirs: dict[str, str] = {}
        listed: list[_Listed] = []
        ignored: list[tuple[str, str]] = []
        for path in candidates:
            if path == self.generations_path:
                continue
            fmt = self.format or _EXTENSIONS.get(os.path.splitext(path)[1].lower())
            if fmt is None:
                continue
            relative = PurePath(os.path.relpath(path, self.root)).as_posix()
            try:
                st = os.lstat(path)
            except OSError:  # vanished between listing and lstat
                continue
            link = stat.S_ISLNK(st.st_mode)
            if link:
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    ignored.append((relative, "dangling link"))
                    continue
                except OSError as exc:
                    ignored.append((relative, f"link cannot be followed: {exc.strerror}"))
                    continue
            if stat.S_ISDIR(st.st_mode):
                continue
            if not self.follow_links_outside:
                directory = os.path.dirname(path)
                if directory not in real_dirs:
                    real_dirs[directory] = os.path.realpath(directory)
                real = os.path.realpath(path) if link else os.path.join(real_dirs[directory], os.path.basename(path))
                if not _within(real, real_root):
                    ignored.append((relative, "link outside the source directory"))
                    continue
            if not stat.S_ISREG(st.st_mode):
                ignored.append((relative, f"not a regular file ({_kind(st.st_mode)})"))
                continue
            listed.append(_Listed(relative, path, fmt, st.st_size, st.st_mtime_ns))
        listed.sort(key=lambda f: (f.mtime_ns, f.relative))
        return listed, ignored

    def generations(self) -> dict[str, int]:
        """``{relative_path: generation}`` from ``generations_path``; a missing file means all 0.

        The current generation of each dropped file: the runtime bumps it on a drop.
        """
        if self.generations_path is None:
            return {}
        try:
            text = Path(self.generations_path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"generations file {self.generations_path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in data.values()
        ):
            raise ValueError(
                f"generations file {self.generations_path} must map relative paths to integers >= 0, got {data!r}"
            )
        return data

    def _parquet_upper(self, f: _Listed, *, warn: bool = True) -> int:
        """Row count from the footer (cached per file version); 1 if the footer cannot be read.

        The probe warns about an unreadable footer once per file version; :meth:`listing` (asked
        by the CLI) stays quiet: the file's read fails visibly when its batch runs.
        """
        if f.size == 0:
            return 0
        key = (f.path, f.size, f.mtime_ns)
        if key not in self._footers:
            try:
                with _open_regular(f.path) as handle:
                    self._footers[key] = pq.read_metadata(handle).num_rows
            except (OSError, ValueError, pa.ArrowException) as exc:
                if not warn:
                    return _UNREADABLE_PARQUET_UPPER  # not cached: the probe still warns once
                log.warning("cannot read the Parquet footer of %s (%s); it will fail when read", f.path, exc)
                self._footers[key] = None
        rows = self._footers[key]
        return _UNREADABLE_PARQUET_UPPER if rows is None else rows

    def _first_parquet_schema(self) -> pa.Schema:
        """The schema of the first readable Parquet file in discovery order, all fields nullable."""
        for f in self._list():
            if f.format != "parquet" or f.size == 0:
                continue
            try:
                with _open_regular(f.path) as handle:
                    schema = pq.read_schema(handle)
            except (OSError, ValueError, pa.ArrowException):
                continue
            fields = []
            for field in schema:
                if field.name in _RESERVED:
                    raise ConfigError("columns", f"{f.path} has a column named {field.name!r}, which reclock reserves")
                fields.append(pa.field(field.name, field.type))
            return pa.schema(fields)
        where = self.pattern if self.pattern is not None else self.root
        raise ConfigError(
            "columns", f"no readable Parquet file under {where} yet to take the schema from; declare columns"
        )

    def _sort_key(self, partition: Partition) -> tuple[int, str, int]:
        """Discovery order of a partition: as last probed, else from the file as it is now."""
        key = self._order.get(partition)
        if key is not None:
            return key
        relative, generation = _unpack(partition)
        try:
            mtime_ns = os.stat(self._absolute(relative)).st_mtime_ns
        except OSError:
            mtime_ns = 2**63 - 1
        return (mtime_ns, relative, generation)

    def _absolute(self, relative: str) -> str:
        return os.path.join(self.root, *relative.split("/"))

    def _file_split(self, partition: Partition, end: int) -> FileSplit:
        relative, _ = _unpack(partition)
        fmt = self.format or _EXTENSIONS.get(os.path.splitext(relative)[1].lower())
        if fmt is None:
            raise ValueError(f"file {relative!r} has no known format (extension)")
        return FileSplit(partition, 0, end, self._absolute(relative), fmt)

    # -- reading CSV and JSON lines ----------------------------------------------------------------

    def _read_lines(self, split: FileSplit, relative: str, encoded: str) -> Iterator[tuple[str, pa.RecordBatch]]:
        is_csv = split.format == "csv"
        header = is_csv and self.csv_header
        for records in self._blocks(split, is_csv):
            count = len(records.starts)
            first = 0
            if header and count:
                header, first = False, 1  # the first record of the file is the header
            for lo in range(first, count, _BATCH_ROWS):
                yield from self._parse(records, lo, min(count, lo + _BATCH_ROWS), is_csv, split, relative, encoded)

    def _blocks(self, split: FileSplit, is_csv: bool) -> Iterator[_Records]:
        """Cut bytes ``[0, split.end)`` of the file into records, one block at a time.

        Step 1: read up to 8 MiB past the carried-over bytes. Step 2: process up to the last line
        end (everything at the end of the range). Step 3: a block without the quote character (or
        any JSON block) is cut at every ``\\n`` with numpy; otherwise the quote-aware scanner
        cuts it, and a record still open at the block's end is carried over to the next block.
        """
        quote = self.csv_quote.encode()
        with _open_regular(split.path) as f:
            size = os.fstat(f.fileno()).st_size
            if size < split.end:
                raise ValueError(
                    f"{split.path} has {size} bytes but was bound with {split.end}: it shrank or was replaced "
                    "after it was bound and cannot be read again; drop it to re-ingest"
                )
            remaining = split.end
            carry = b""
            base = 0  # file position of carry[0]
            line = 1  # line number of carry[0]
            first = True
            while True:
                data = f.read(min(_READ_BYTES, remaining))
                if remaining and not data:
                    raise ValueError(f"{split.path} ended before byte {split.end}: it shrank while being read")
                remaining -= len(data)
                buf = carry + data if carry else data
                if first:
                    first = False
                    if buf.startswith(_BOM):  # a byte order mark is not data
                        buf, base = buf[len(_BOM) :], len(_BOM)
                eof = remaining == 0
                cut = len(buf) if eof else buf.rfind(b"\n") + 1
                consumed = 0
                if cut:
                    block = buf[:cut] if cut < len(buf) else buf
                    if is_csv and quote in block:
                        records, consumed = self._cut_quoted(block, base, line, eof)
                    else:
                        records, consumed = _cut_lines(block, base, line), cut
                    if len(records.starts):
                        yield records
                    line += block.count(b"\n", 0, consumed)
                carry = buf[consumed:]
                base += consumed
                if eof:
                    return
                if len(carry) > _MAX_RECORD_BYTES:
                    raise ValueError(
                        f"{split.path}: the record starting on line {line} (byte {base}) is longer than "
                        f"{_MAX_RECORD_BYTES} bytes (an unbalanced quote?); the file cannot be read"
                    )

    def _cut_quoted(self, block: bytes, base: int, line: int, eof: bool) -> tuple[_Records, int]:
        """Cut a CSV block that holds the quote character: a quoted field may span line ends.

        Python's csv rules: a field is quoted when it starts with the quote; inside it a doubled
        quote is a quote and a line end is data; elsewhere a quote is an ordinary character. One
        regex scan matches record after record (see :func:`_record_pattern`); it can only fail
        on a quoted field left open, whose record then runs to the end of the block. Returns the
        records and the bytes they cover: an open record is left for the next block, unless the
        block ends the range (then, as in Python's csv and pyarrow, its quoted field runs to the
        end of the file).
        """
        open_at: list[int] = []
        end = [0]

        def record_starts() -> Iterator[int]:
            for match in self._record_re.finditer(block):
                start, end[0] = match.span()
                if start == end[0]:
                    continue  # the empty match at the end of the block
                if match.lastgroup == "open":
                    open_at.append(start)
                yield start

        starts = np.fromiter(record_starts(), dtype=np.int64)  # no per-record objects are kept
        stops = np.append(starts[1:], end[0]) if len(starts) else starts
        consumed = len(block)
        if open_at and not eof:
            consumed = open_at[0]
            starts, stops = starts[:-1], stops[:-1]
        view = np.frombuffer(block, dtype=np.uint8)
        records = _finish_records(view, block, base, starts, stops, line, quoted=True)
        return records, consumed

    def _parse(
        self,
        records: _Records,
        lo: int,
        hi: int,
        is_csv: bool,
        split: FileSplit,
        relative: str,
        encoded: str,
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Parse records ``[lo, hi)`` of a block: one batch of good rows, one of bad ones.

        Step 1: one vectorised parse of all of them; it reports records with the wrong number of
        CSV fields, or values that do not convert, without failing. Step 2, only if that parse
        fails as a whole (JSON: any bad record): parse pieces of :data:`_PIECE` records, and
        bisect the pieces that fail. When most pieces fail (systematically bad JSON), a Python
        screen picks the likely culprits, which are parsed alone, so the rest parses in bulk
        again. The screen only steers the work: every verdict comes from pyarrow, on the record
        alone or in a set that parsed with one row per record.
        """
        faults: list[tuple[int, str]] = []
        candidates = list(range(lo, hi))
        fail = self.on_record_error == "fail"
        if is_csv:
            candidates = _screen_utf8(records, candidates, faults, "invalid csv")
        else:
            candidates = self._screen_json(records, candidates, faults)
        if fail and faults:  # report the first bad record: parse only what precedes it
            candidates = [k for k in candidates if k < min(faults)[0]]

        def parse(indices: list[int]) -> _Parsed:
            return self._parse_csv(records, indices) if is_csv else self._parse_json(records, indices)

        def fault(k: int, problem: str) -> None:
            if fail:
                raise RecordError(f"{split.path}: line {int(records.lines[k])}: {problem} (on_record_error='fail')")
            faults.append((k, problem))

        accepted: list[tuple[list[int], list[pa.Array]]] = []
        if candidates and not _accept(candidates, parse, accepted, fault):
            pieces = [candidates[i : i + _PIECE] for i in range(0, len(candidates), _PIECE)]
            if len(pieces) == 1 or is_csv or fail:  # in order, so the fail policy reports the first
                for piece in pieces:
                    if len(pieces) == 1 or not _accept(piece, parse, accepted, fault):
                        _isolate(piece, parse, accepted, fault, tried=True)
            else:
                failed = [piece for piece in pieces if not _accept(piece, parse, accepted, fault)]
                if len(failed) > 2:
                    rest = [k for piece in failed for k in piece]
                    likely = self._json_likely_good(records, rest)
                    _isolate([k for k, ok in zip(rest, likely, strict=True) if ok], parse, accepted, fault)
                    for k, ok in zip(rest, likely, strict=True):
                        if not ok:
                            _isolate([k], parse, accepted, fault)
                else:
                    for piece in failed:
                        _isolate(piece, parse, accepted, fault, tried=True)
        if fail and faults:
            fault(*min(faults))
        accepted = [(good, columns) for good, columns in accepted if len(good)]
        if accepted:
            good = np.concatenate([np.asarray(idx, dtype=np.int64) for idx, _ in accepted])
            if len(accepted) == 1:
                columns = accepted[0][1]
            else:
                columns = [pa.concat_arrays([arrays[c] for _, arrays in accepted]) for c in range(len(self.schema))]
                if (np.diff(good) < 0).any():  # the screen parsed records out of order
                    order = np.argsort(good, kind="stable")
                    good = good[order]
                    taken = pa.array(order)
                    columns = [c.take(taken) for c in columns]
            yield self.output, self._batch(encoded, records.base + records.starts[good], columns)
        if faults:
            faults.sort()
            yield (
                ERRORS,
                error_batch(
                    encoded,
                    [int(records.base + records.starts[k]) for k, _ in faults],
                    [PARSE] * len(faults),
                    [_clip(f"{relative} line {int(records.lines[k])}: {problem}") for k, problem in faults],
                    [records.block[records.starts[k] : records.ends[k]][:_MAX_RAW] for k, _ in faults],
                ),
            )

    def _screen_json(self, records: _Records, candidates: list[int], faults: list[tuple[int, str]]) -> list[int]:
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

    def _json_likely_good(self, records: _Records, indices: list[int]) -> list[bool]:
        """A cheap Python guess whether pyarrow accepts each JSON line (syntax and field kinds)."""
        checks = [(f.name, _json_kind(t)) for f, t in zip(self.schema, self._text_schema.types, strict=True)]
        decode = json.JSONDecoder().decode
        out = []
        for k in indices:
            try:
                value = decode(records.block[records.starts[k] : records.ends[k]].decode("utf-8"))
            except (ValueError, RecursionError):
                out.append(False)
                continue
            out.append(isinstance(value, dict) and all(value.get(n) is None or check(value[n]) for n, check in checks))
        return out

    def _buffer(self, records: _Records, indices: list[int]) -> bytes:
        """The bytes of ``indices``, each ending with a line end (zero-copy when consecutive)."""
        block = records.block
        first, last = indices[0], indices[-1]
        if last - first + 1 == len(indices):  # consecutive records: their bytes are contiguous
            buf = block[records.starts[first] : records.stops[last]]
        else:
            buf = b"".join(block[records.starts[k] : records.stops[k]] for k in indices)
        return buf if buf.endswith(b"\n") else buf + b"\n"

    def _parse_csv(self, records: _Records, indices: list[int]) -> _Parsed:
        """Parse CSV records into raw fields, then convert each column (see :func:`_text_to`).

        A record with the wrong number of fields, or with a value that does not convert, is
        reported, not raised; the parse raises only when pyarrow's rows do not line up with the
        records one to one (the caller then bisects).
        """
        buf = self._buffer(records, indices)
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
                delimiter=self.csv_delimiter,
                quote_char=self.csv_quote,
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
        columns, bad = self._convert_columns(table, _text_to)
        if bad:
            keep = [i for i in range(len(good)) if i not in bad]
            faults.extend((good[i], problem) for i, problem in bad.items())
            taken = pa.array(keep, pa.int64())
            good = [good[i] for i in keep]
            columns = [c.take(taken) for c in columns]
        faults.sort()
        return good, columns, faults

    def _parse_json(self, records: _Records, indices: list[int]) -> _Parsed:
        """Parse JSON lines in one call: raises if any line fails; text timestamps convert after."""
        buf = self._buffer(records, indices)
        table = pa_json.read_json(
            pa.BufferReader(buf),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(buf) + 1, 1 << 16)),
            parse_options=pa_json.ParseOptions(explicit_schema=self._text_schema, unexpected_field_behavior="ignore"),
        )
        if table.num_rows != len(indices):
            raise ValueError(f"parsed into {table.num_rows} rows, expected {len(indices)}")
        columns, bad = self._convert_columns(table, _convert)
        if not bad:
            return indices, columns, []
        keep = [i for i in range(len(indices)) if i not in bad]
        taken = pa.array(keep, pa.int64())
        faults = sorted((indices[i], problem) for i, problem in bad.items())
        return [indices[i] for i in keep], [c.take(taken) for c in columns], faults

    def _convert_columns(
        self, table: pa.Table, convert: Callable[[pa.Array, pa.DataType], pa.Array]
    ) -> tuple[list[pa.Array], dict[int, str]]:
        """Every declared column of ``table`` converted; ``{row: problem}`` of values that did not."""
        columns: list[pa.Array] = []
        bad: dict[int, str] = {}
        for f in self.schema:
            column, problems = _convert_all(table.column(f.name).combine_chunks(), f.type, convert)
            columns.append(column)
            for i, problem in problems.items():
                bad.setdefault(i, f"column {f.name!r}: {problem}")
        return columns, dict(sorted(bad.items()))

    # -- reading Parquet ---------------------------------------------------------------------------

    def _read_parquet(self, split: FileSplit, relative: str, encoded: str) -> Iterator[tuple[str, pa.RecordBatch]]:
        with _open_regular(split.path) as f:
            parquet = pq.ParquetFile(f)
            rows = parquet.metadata.num_rows
            if rows != split.end:
                raise ValueError(
                    f"{split.path} has {rows} rows but was bound with {split.end}: it was replaced after it was "
                    "bound and cannot be read again; drop it to re-ingest"
                )
            present = set(parquet.schema_arrow.names)
            wanted = [name for name in self.schema.names if name in present]
            offset = 0
            if not wanted:  # none of the declared columns: every row is all nulls
                for start in range(0, rows, _BATCH_ROWS):
                    n = min(_BATCH_ROWS, rows - start)
                    columns = [pa.nulls(n, f.type) for f in self.schema]
                    yield self.output, self._batch(encoded, np.arange(start, start + n, dtype=np.int64), columns)
                return
            for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=wanted, use_threads=False):
                yield from self._convert_parquet(batch, offset, split, relative, encoded)
                offset += batch.num_rows
            if offset != rows:
                raise ValueError(f"{split.path} yielded {offset} rows, its footer says {rows}")

    def _convert_parquet(
        self, batch: pa.RecordBatch, offset: int, split: FileSplit, relative: str, encoded: str
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Cast one Parquet batch to the declared columns; values that do not fit are bad rows."""
        n = batch.num_rows
        names = set(batch.schema.names)
        columns: list[pa.Array] = []
        bad: dict[int, str] = {}
        for f in self.schema:
            if f.name not in names:
                columns.append(pa.nulls(n, f.type))
                continue
            column = batch.column(f.name)
            try:
                converted, problems = _convert_all(column, f.type, _convert)
            except pa.ArrowNotImplementedError as exc:
                raise TypeError(
                    f"{split.path}: column {f.name!r} of type {column.type} cannot become {f.type}: {exc}"
                ) from exc
            columns.append(converted)
            for i, problem in problems.items():
                bad.setdefault(i, f"column {f.name!r}: {problem}")
        rows = np.arange(offset, offset + n, dtype=np.int64)
        if not bad:
            yield self.output, self._batch(encoded, rows, columns)
            return
        if self.on_record_error == "fail":
            i = min(bad)
            raise RecordError(f"{split.path}: row {offset + i}: {bad[i]} (on_record_error='fail')")
        keep = np.asarray([i for i in range(n) if i not in bad], dtype=np.int64)
        if len(keep):
            taken = pa.array(keep)
            yield self.output, self._batch(encoded, rows[keep], [c.take(taken) for c in columns])
        order = sorted(bad)
        raws = [json.dumps(batch.slice(i, 1).to_pylist()[0], default=str).encode()[:_MAX_RAW] for i in order]
        yield (
            ERRORS,
            error_batch(
                encoded,
                [offset + i for i in order],
                [CONVERT] * len(order),
                [_clip(f"{relative} row {offset + i}: {bad[i]}") for i in order],
                raws,
            ),
        )

    def _batch(self, encoded: str, offsets: np.ndarray, columns: Sequence[pa.Array]) -> pa.RecordBatch:
        n = len(offsets)
        return pa.RecordBatch.from_arrays(
            [pa.repeat(pa.scalar(encoded, pa.string()), n), pa.array(offsets, pa.int64()), *columns],
            schema=self._batch_schema,
        )


# -- helpers ------------------------------------------------------------------------------------


def _check_path(path: object) -> tuple[str, str | None]:
    """``(root directory, glob pattern or None)``, both absolute; the root must exist."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ConfigError("path", f"must be a directory or a glob pattern, got {path!r}")
    text = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if glob.has_magic(text):
        parts = Path(text).parts
        fixed = []
        for part in parts:
            if glob.has_magic(part):
                break
            fixed.append(part)
        root = str(Path(*fixed))
        if not os.path.isdir(root):
            raise ConfigError("path", f"the glob's directory {root} does not exist")
        return root, text
    if not os.path.isdir(text):
        what = "is a file, not a directory (use a glob to pick files)" if os.path.exists(text) else "does not exist"
        raise ConfigError("path", f"{text} {what}")
    return text, None


def _check_char(field: str, value: object) -> str:
    if not isinstance(value, str) or len(value) != 1 or not value.isascii() or value in "\r\n":
        raise ConfigError(field, f"must be one ASCII character other than a line end, got {value!r}")
    return value


def _check_columns(columns: object) -> pa.Schema:
    if not isinstance(columns, Mapping) or not columns:
        raise ConfigError("columns", f"must map column names to type names, got {columns!r}")
    fields = []
    for name, type_name in columns.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("columns", f"column names must be non-empty strings, got {name!r}")
        if name in _RESERVED:
            raise ConfigError(f"columns.{name}", "is reserved for reclock's lineage columns")
        if type_name not in COLUMN_TYPES:
            raise ConfigError(
                f"columns.{name}", f"unknown type {type_name!r}; expected one of {', '.join(COLUMN_TYPES)}"
            )
        fields.append(pa.field(name, COLUMN_TYPES[type_name]))
    return pa.schema(fields)


def _walk(root: str) -> Iterator[str]:
    """Every non-hidden file path under ``root``, recursively (hidden directories are pruned)."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        for name in files:
            if not name.startswith("."):
                yield os.path.join(directory, name)


def _within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or under it (both real, absolute paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words, for a listing or an error."""
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "unknown kind"


def _open_regular(path: str) -> BinaryIO:
    """Open ``path`` for reading, refusing anything but a regular file, and never blocking.

    ``O_NONBLOCK`` makes the open of a FIFO return at once (a plain open waits for a writer,
    forever), and the check runs on the open descriptor: a file replaced by a FIFO or a device
    after it was listed fails its read (retried, then skipped or stopping the pipeline) instead
    of hanging a task.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file any more ({_kind(mode)}): it cannot be read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _unpack(partition: Partition) -> tuple[str, int]:
    if (
        not isinstance(partition, tuple)
        or len(partition) != 2
        or not isinstance(partition[0], str)
        or not isinstance(partition[1], int)
        or isinstance(partition[1], bool)
    ):
        raise ValueError(f"a files partition is (relative_path, generation), got {partition!r}")
    parts = partition[0].split("/")
    if not partition[0] or partition[0].startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"a files partition names a path inside the directory, got {partition[0]!r}")
    return partition[0], partition[1]


def _cut_lines(block: bytes, base: int, line: int) -> _Records:
    """Every line of ``block`` is a record (no quoting)."""
    view = np.frombuffer(block, dtype=np.uint8)
    stops = np.flatnonzero(view == _NEWLINE) + 1
    if not len(stops) or stops[-1] != len(block):
        stops = np.append(stops, len(block))  # the range ended inside a line
    starts = np.empty_like(stops)
    starts[0] = 0
    starts[1:] = stops[:-1]
    return _finish_records(view, block, base, starts, stops, line, quoted=False)


def _finish_records(
    view: np.ndarray, block: bytes, base: int, starts: np.ndarray, stops: np.ndarray, line: int, *, quoted: bool
) -> _Records:
    """Add each record's text end and line number; drop empty lines (``\n``, ``\r\n``).

    Whitespace-only JSON lines are dropped later, by the screen.
    """
    ends = stops - (view[stops - 1] == _NEWLINE)
    has_cr = ends > starts
    has_cr[has_cr] = view[ends[has_cr] - 1] == _RETURN
    ends = ends - has_cr
    if quoted:
        lines = line + np.searchsorted(np.flatnonzero(view == _NEWLINE), starts)
    else:
        lines = np.arange(line, line + len(starts), dtype=np.int64)
    keep = ends > starts
    if not keep.all():
        starts, stops, ends, lines = starts[keep], stops[keep], ends[keep], lines[keep]
    return _Records(block, base, starts, stops, ends, lines, quoted=quoted)


def _record_pattern(delimiter: str, quote: str) -> re.Pattern[bytes]:
    """A regex matching one CSV record with its line end, or else (group ``open``) the rest.

    Fields follow Python's csv: quoted (doubled quotes inside, line ends allowed, anything up to
    the next delimiter after the closing quote), unquoted (no line end), or empty. Possessive
    quantifiers give every field exactly one way to match, so a scan is linear. A record only
    fails to match when a quoted field is never closed, and then ``open`` takes the rest of the
    block, so consecutive matches always tile the block.
    """
    d = re.escape(delimiter.encode())
    q = re.escape(quote.encode())
    quoted = rb"%s[^%s]*+(?:%s%s[^%s]*+)*+%s(?:[^%s%s\n][^%s\n]*+)?" % (q, q, q, q, q, q, q, d, d)
    field = rb"(?:%s|[^%s%s\n][^%s\n]*+|)" % (quoted, q, d, d)
    return re.compile(rb"%s(?:%s%s)*+(?:\n|\Z)|(?P<open>[\s\S]+)" % (field, d, field))


def _convert(column: pa.Array, target: pa.DataType) -> pa.Array:
    """``column`` as ``target`` (a safe cast); text becomes timestamps (offset to UTC, none = UTC)."""
    if column.type == target:
        return column
    if target == _UTC and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        try:
            return column.cast(_UTC)  # every value has a zone offset
        except pa.ArrowInvalid:
            pass
        try:
            return column.cast(_NAIVE).cast(_UTC)  # no value has one: they are UTC
        except pa.ArrowInvalid:
            pass
        if len(column) == 1:
            raise pa.ArrowInvalid(f"not an ISO 8601 timestamp: {column[0].as_py()!r}")
        # A mix: value by value (a bad value raises, and the caller bisects down to it).
        return pa.concat_arrays([_convert(column.slice(i, 1), target) for i in range(len(column))])
    return column.cast(target)


def _text_to(column: pa.Array, target: pa.DataType) -> pa.Array:
    """A CSV column's raw fields (binary) as ``target``.

    The bytes must be UTF-8. For a column other than ``string``, surrounding whitespace is
    trimmed, an empty field is null, and the text converts as pyarrow's cast does (``bool``:
    ``true``/``false``/``1``/``0`` in any case; ``timestamp``: ISO 8601, see :func:`_convert`).
    """
    return _convert(_trimmed_text(column, target), target)


def _trimmed_text(column: pa.Array, target: pa.DataType) -> pa.Array:
    """Step one of :func:`_text_to`: UTF-8 text, trimmed and empty as null unless ``string``."""
    text = column.cast(pa.string())
    if target == pa.string():
        return text
    text = pc.utf8_trim_whitespace(text)
    empty = pc.equal(pc.binary_length(text), 0)
    if pc.any(empty).as_py():
        text = pc.if_else(empty, pa.scalar(None, pa.string()), text)
    return text


def _convert_all(
    column: pa.Array, target: pa.DataType, convert: Callable[[pa.Array, pa.DataType], pa.Array]
) -> tuple[pa.Array, dict[int, str]]:
    """``convert`` every value; ``{index: problem}`` of those that fail (null in the result).

    Conversion is value by value, so a value's verdict never depends on its neighbours. When the
    whole column fails, a regex guesses which text values will not convert: the others are
    converted at once and the suspects one by one (a wrong guess costs time, never correctness);
    a set that still fails is bisected, so ``k`` bad values cost ``O(k log n)`` casts.
    """
    try:
        return convert(column, target), {}
    except (pa.ArrowInvalid, ValueError):
        pass
    if convert is _text_to:
        with contextlib.suppress(pa.ArrowInvalid, ValueError):  # bad UTF-8 is found value by value
            column, convert = _trimmed_text(column, target), _convert
    pieces: list[tuple[np.ndarray, pa.Array]] = []
    bad: dict[int, str] = {}

    def narrow(idx: np.ndarray, *, tried: bool = False) -> None:
        if not tried:
            try:
                part = column.slice(int(idx[0]), 1) if len(idx) == 1 else column.take(pa.array(idx))
                pieces.append((idx, convert(part, target)))
                return
            except (pa.ArrowInvalid, ValueError) as exc:
                if len(idx) == 1:
                    bad[int(idx[0])] = str(exc)
                    return
        if len(idx) <= _ALONE:
            for i in range(len(idx)):
                narrow(idx[i : i + 1])
        else:
            mid = len(idx) // 2
            narrow(idx[:mid])
            narrow(idx[mid:])

    everything = np.arange(len(column), dtype=np.int64)
    pattern = _LIKELY_TEXT.get(target) if pa.types.is_string(column.type) else None
    if pattern is None:
        narrow(everything, tried=True)
    else:
        likely = pc.fill_null(pc.match_substring_regex(column, pattern), True).to_numpy(zero_copy_only=False)
        if likely.any():
            narrow(everything[likely])
        for i in everything[~likely]:
            narrow(everything[i : i + 1])
    positions = np.concatenate([idx for idx, _ in pieces] + [np.fromiter(bad, dtype=np.int64, count=len(bad))])
    values = pa.concat_arrays([part for _, part in pieces] + [pa.nulls(len(bad), target)])
    return values.take(pa.array(np.argsort(positions, kind="stable"))), dict(sorted(bad.items()))


def _json_kind(t: pa.DataType) -> Callable[[Any], bool]:
    """Whether a decoded JSON value has the kind pyarrow converts to ``t`` (a guess, see the screen)."""
    if pa.types.is_boolean(t):
        return lambda v: isinstance(v, bool)
    if pa.types.is_integer(t):
        lo, hi = -(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    if pa.types.is_floating(t):
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if pa.types.is_string(t):
        return lambda v: isinstance(v, str)
    return lambda v: True


def _screen_utf8(records: _Records, candidates: list[int], faults: list[tuple[int, str]], what: str) -> list[int]:
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


def _accept(
    indices: list[int],
    parse: Callable[[list[int]], _Parsed],
    accepted: list[tuple[list[int], list[pa.Array]]],
    fault: Callable[[int, str], None],
) -> bool:
    """Try ``indices`` as one set; on success keep its good rows and report its bad ones."""
    try:
        good, columns, faults = parse(indices)
    except Exception:  # pyarrow raises ArrowInvalid; a bad record must never stop the search
        return False
    accepted.append((good, columns))
    for k, problem in faults:
        fault(k, problem)
    return True


def _isolate(
    indices: list[int],
    parse: Callable[[list[int]], _Parsed],
    accepted: list[tuple[list[int], list[pa.Array]]],
    fault: Callable[[int, str], None],
    *,
    tried: bool = False,
) -> None:
    """Narrow a set whose parse fails until each failing record stands alone; left to right.

    A failing set is bisected; sets of at most :data:`_ALONE` records are parsed record by
    record. A record fails only if it fails alone, so its verdict never depends on neighbours,
    and bad records are found in file order (the ``fail`` policy reports the first).
    """
    if not tried:
        try:
            good, columns, faults = parse(indices)
        except Exception as exc:  # see _accept
            if len(indices) == 1:
                fault(indices[0], f"{type(exc).__name__}: {exc}")
                return
        else:
            accepted.append((good, columns))
            for k, problem in faults:
                fault(k, problem)
            return
    if len(indices) == 1:
        _isolate(indices, parse, accepted, fault)
    elif len(indices) <= _ALONE:
        for k in indices:
            _isolate([k], parse, accepted, fault)
    else:
        mid = len(indices) // 2
        _isolate(indices[:mid], parse, accepted, fault)
        _isolate(indices[mid:], parse, accepted, fault)


def _clip(message: str, limit: int = _MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."
