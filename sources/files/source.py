"""The files source: the driver's side of a directory of files, and the contract it keeps.

:class:`FilesSource` validates its options (:mod:`~reclock.sources.files.config`), lists the directory
(:mod:`~reclock.sources.files.listing`), probes and caps (:mod:`~reclock.sources.files.probe`), cuts one split
per file, and hands each split to a :class:`~reclock.sources.files.reader.FileReader` in a Spark task.
The definitions it keeps are in :mod:`reclock.sources.files`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from reclock.errors import ConfigError
from reclock.sources.base import (
    ERRORS,
    FileStates,
    GroupReads,
    KeepsUnknownFields,
    ListedFile,
    Output,
    SourceBase,
    SourceContext,
    Split,
    check_record_error_policy,
    parse_generations,
)
from reclock.sources.files.config import FORMATS, FileFormat, check_char, check_columns
from reclock.sources.files.decompress import compression_of
from reclock.sources.files.discovery import Discovery, LocalNames, StoreNames
from reclock.sources.files.group import read_group
from reclock.sources.files.listing import Listed, format_of, read_generations, unpack
from reclock.sources.files.parquet import first_schema
from reclock.sources.files.probe import Probe, settling
from reclock.sources.files.reader import FileReader, FileSplit
from reclock.sources.files.store import FileStore
from reclock.timeline.frontier import Frontier, Partition

__all__ = ["FilesSource"]


def _wall_clock_ms() -> int:
    """The default clock: wall time in ms since the epoch (only the driver's ``upper`` reads it)."""
    return int(time.time() * 1000)


class FilesSource(SourceBase, GroupReads, FileStates, KeepsUnknownFields):
    """Files under a directory or matching a glob, landed whole, exactly once per generation.

    A plain, picklable value: :meth:`read` needs nothing but the source's settings and the split,
    so a Spark task can read any file the driver bound. The clock and the probe's caches stay on
    the driver. Partitions are ``(path, generation)`` (:class:`~reclock.sources.base.FileStates`):
    the job keeps each file's state, and a drop bumps its generation.
    """

    #: A file deleted, archived or dropped leaves the probe; that is not a recreated source.
    forgets_partitions = True

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
        max_files_per_batch: int = 1000,
        settle_seconds: float = 0.0,
        generations_path: str | os.PathLike[str] | None = None,
        generations_reader: Callable[[], str | None] | None = None,
        follow_links_outside: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        split_bytes: int = 128 << 20,
        csv_multiline: bool = True,
        now: Callable[[], int] | None = None,
    ) -> None:
        """Validate every setting eagerly, so a bad pipeline fails at definition, naming the field.

        ``path`` is a directory (searched recursively) or a glob (``**`` allowed); hidden files
        and directories (names starting with ``.``) are never listed. Without ``format`` each
        file's format follows its extension (``.csv``; ``.jsonl``, ``.json``, ``.ndjson``;
        ``.parquet``, case-insensitive) and other files are ignored; with it, every listed file
        is read in that format. ``columns`` maps column names to type names (see
        :data:`~reclock.sources.files.config.COLUMN_TYPES`); only ``format="parquet"`` may leave it
        out, and then the schema is read from the first Parquet file (in discovery order) now. A
        symbolic link is followed when its target is inside the directory (or
        ``follow_links_outside`` is set); otherwise the file is listed as ignored (see :meth:`listing`), never read.

        ``path`` may be ``s3://bucket/prefix`` (or a glob under it), reached with
        ``storage_options`` over the ``AWS_*`` environment (see :mod:`~reclock.sources.files.store`).
        ``.gz`` and ``.zst`` files are decompressed (see :mod:`~reclock.sources.files.decompress`). An
        uncompressed JSON lines file larger than ``split_bytes`` (0: never) is read by several
        tasks, a piece of about ``split_bytes`` each; a CSV file too, when ``csv_multiline`` is
        false (no quoted field holds a line end, so every line end ends a record).
        """
        self.store, self.pattern = FileStore.at(path, storage_options)
        self.root = self.store.root
        self._check_reading(
            format=format,
            output=output,
            csv_header=csv_header,
            csv_delimiter=csv_delimiter,
            csv_quote=csv_quote,
            on_record_error=on_record_error,
        )
        self._check_listing(
            max_files_per_batch=max_files_per_batch,
            settle_seconds=settle_seconds,
            generations_path=generations_path,
            generations_reader=generations_reader,
            follow_links_outside=follow_links_outside,
            split_bytes=split_bytes,
            csv_multiline=csv_multiline,
            now=now,
        )
        self._probe = self._new_probe()
        self._take_schema(columns)

    def _check_reading(
        self,
        *,
        format: str | None,
        output: str,
        csv_header: bool,
        csv_delimiter: str,
        csv_quote: str,
        on_record_error: str,
    ) -> None:
        """:meth:`__init__`'s first checks: how a file is read (format, output, CSV dialect, bad records)."""
        if format is not None and format not in FORMATS:
            raise ConfigError("format", f"must be one of {', '.join(FORMATS)} (or unset to infer it), got {format!r}")
        # Checked against FORMATS just above; mypy narrows no str to a Literal by membership.
        self.format: FileFormat | None = format  # type: ignore[assignment]
        if not isinstance(output, str) or not output or output == ERRORS:
            raise ConfigError("output", f"must be a non-empty name other than {ERRORS!r}, got {output!r}")
        self.output = output
        if not isinstance(csv_header, bool):
            raise ConfigError("csv_header", f"must be true or false, got {csv_header!r}")
        self.csv_header = csv_header
        self.csv_delimiter = check_char("csv_delimiter", csv_delimiter)
        self.csv_quote = check_char("csv_quote", csv_quote)
        if self.csv_delimiter == self.csv_quote:
            raise ConfigError("csv_delimiter", f"must differ from csv_quote ({csv_quote!r})")
        self.on_record_error = check_record_error_policy(on_record_error)

    def _check_listing(
        self,
        *,
        max_files_per_batch: int,
        settle_seconds: float,
        generations_path: str | os.PathLike[str] | None,
        generations_reader: Callable[[], str | None] | None,
        follow_links_outside: bool,
        split_bytes: int,
        csv_multiline: bool,
        now: Callable[[], int] | None,
    ) -> None:
        """:meth:`__init__`'s next checks: which files a batch takes, and when, and in how many pieces."""
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
        if generations_reader is not None and not callable(generations_reader):
            raise ConfigError(
                "generations_reader", f"must be a callable returning the file's text, got {generations_reader!r}"
            )
        self.generations_reader = generations_reader
        if not isinstance(follow_links_outside, bool):
            raise ConfigError("follow_links_outside", f"must be true or false, got {follow_links_outside!r}")
        self.follow_links_outside = follow_links_outside
        if not isinstance(split_bytes, int) or isinstance(split_bytes, bool) or 0 < split_bytes < 16 or split_bytes < 0:
            raise ConfigError("split_bytes", f"must be 0 (never split a file) or an integer >= 16, got {split_bytes!r}")
        self.split_bytes = split_bytes
        if not isinstance(csv_multiline, bool):
            raise ConfigError("csv_multiline", f"must be true or false, got {csv_multiline!r}")
        self.csv_multiline = csv_multiline
        if now is not None and not callable(now):
            raise ConfigError("now", f"must be a callable returning ms since the epoch, got {now!r}")
        self._now: Callable[[], int] = now if now is not None else _wall_clock_ms

    def _take_schema(self, columns: Mapping[str, str] | None) -> None:
        """:meth:`__init__`'s last step: the schema, as declared or read from the first Parquet file, and the reader."""
        if columns is None:
            if self.format != "parquet":
                raise ConfigError(
                    "columns",
                    "required for csv and jsonl files (and whenever format is inferred); "
                    "only format='parquet' can take its schema from the first file",
                )
            where = self.pattern if self.pattern is not None else self.root
            self.schema = first_schema(self._list(), where, self.store)
        else:
            self.schema = check_columns(columns)
        self._reader = FileReader(
            self.output,
            self.schema,
            self.csv_header,
            self.csv_delimiter,
            self.csv_quote,
            self.on_record_error == "fail",
            self.store,
            self.csv_multiline,
        )

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> FilesSource:
        """The pipeline's files source: dropped files' generations are the ones the runtime keeps
        in the lake, and bad records follow the pipeline's ``on_record_error``."""
        kept: dict[str, Any] = {}
        if context.generations_path is not None:  # a local lake: the file is also kept out of the listing
            kept["generations_path"] = context.generations_path
        elif context.generations_reader is not None:
            kept["generations_reader"] = context.generations_reader
        return cls(**{**kept, **options, "on_record_error": context.on_record_error})

    def __repr__(self) -> str:
        where = self.pattern if self.pattern is not None else self.root
        return f"FilesSource(path={where!r}, format={self.format!r}, output={self.output!r})"

    # -- pickling: the clock and the probe's memory stay on the driver -------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Drop the clock (a test's lambda cannot be pickled) and the driver-only probe."""
        state = dict(self.__dict__)
        del state["_now"], state["_probe"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore with the wall clock and a fresh probe, so a copy can still probe."""
        self.__dict__.update(state)
        self._now = _wall_clock_ms
        self._probe = self._new_probe()

    def _new_probe(self) -> Probe:
        """A probe with nothing seen yet: its first probe examines every file once. A local
        directory is watched directory by directory; an object-store prefix is listed whole."""
        names: LocalNames | StoreNames
        if self.store.remote:
            names = StoreNames(self.store, self.pattern, fixed=self.format, skip=self.generations_path)
        else:
            names = LocalNames(
                self.root,
                self.pattern,
                fixed=self.format,
                skip=self.generations_path,
                follow_links_outside=self.follow_links_outside,
            )
        return Probe(self.root, Discovery(names), self.max_files_per_batch, self.store)

    def keep_unknown_fields(self, outputs: Sequence[str]) -> None:
        """Hand each record's undeclared fields on (schema evolution): JSON lines' other keys, the
        columns a CSV header names after the declared ones. Parquet files are read by their
        declared (or first file's) columns only."""
        if self.format == "parquet":
            raise ConfigError(f"outputs.{self.output}.schema_evolution", "parquet files cannot report new fields")
        self._reader = dataclasses.replace(self._reader, unknown_fields=True)

    # -- the driver side ---------------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        """One append-only output holding the declared columns (lineage columns come on top)."""
        return [Output(self.output, self.schema)]

    def upper(self) -> Frontier:
        """The probe: ``{(relative_path, generation): upper}`` of every settled file seen.

        Called on the driver before each batch. Re-reads the generations file every time (the
        runtime rewrites it when a file is dropped). A file modified less than ``settle_seconds``
        ago is left out, as it may still be being written; it shows in a later probe. Incremental
        (:mod:`~reclock.sources.files.discovery`): only new files and files not bound yet are examined
        (a backlog a window at a time), so a bound file keeps the upper it was last seen at.

        Never below the bound frontier, which the pipeline checks: the older generations of a
        dropped file stay in it (at the file's upper), and within a process the probe never goes
        below the previous one, so a file that is deleted, shrinks or is dropped keeps its
        partition at its old offset. (After a restart, a file deleted or shrunk since it was
        bound is not known any more; the pipeline then reports the source as changed.)
        """
        generations = self.generations()
        return self._probe.upper(generations, int(self._now()), self.settle_seconds)

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
        return self._probe.cap(lower, upper, self.max_files_per_batch)

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[FileSplit]:
        """One :class:`FileSplit` per file with ``lower < upper`` (several for a large one), in discovery order.

        A file is bound whole, so its split starts at 0; an uncompressed JSON lines file (or a
        CSV file, without ``csv_multiline``) larger than ``split_bytes`` is cut into pieces of
        ``split_bytes``, each read by its own task: a record belongs to the piece it starts in,
        so every record is read once, and all pieces land in the batch's one commit per output.
        A file bound part-way (``0 < lower <
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
            out += self._pieces(self._file_split(partition, end))
        out.sort(key=lambda s: self._probe.sort_key(s.partition))
        return out

    def end(self) -> Frontier | None:
        """Never known: a new file may arrive at any time."""
        return None

    # -- the task side -----------------------------------------------------------------------------

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Read one file, or one piece of a large one: its records as ``(output, batch)`` and bad
        ones as ``(ERRORS, batch)``.

        Batches hold at most 65,536 rows, in file order, each starting with ``_partition`` and
        ``_offset``. Replayable: the same split yields the same batches as long as the file's
        first ``split.size`` bytes (Parquet: its rows) are unchanged. A piece reads the records
        that start in ``[split.start, split.end)``. See :mod:`reclock.sources.files.reader`.
        """
        yield from self._reader.read(self._checked(split))

    def read_group(self, splits: Sequence[Split]) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Read a task's files as one stream (see :mod:`reclock.sources.files.group`): the same rows and
        ``_errors`` rows as :meth:`read` file by file, in batches that span files, so a task of
        many small files costs one parse per 65,536 records and one parquet file per output.
        Pieces of large files, compressed files and schema evolution are read file by file."""
        checked = [self._checked(split) for split in splits]
        together = [s for s in checked if self._reader.groupable(s)]
        yield from read_group(self._reader, together)
        for split in checked:
            if not self._reader.groupable(split):
                yield from self._reader.read(split)

    def _checked(self, split: Split) -> FileSplit:
        """``split`` as a :class:`FileSplit` of (a piece of) a bound file; anything else is a caller's bug."""
        if not isinstance(split, FileSplit):
            if split.start != 0 or split.end <= 0:
                raise ValueError(f"split of {split.partition!r} is [{split.start}, {split.end}): a file reads [0, end)")
            split = self._file_split(split.partition, split.end)
        if not 0 <= split.start < split.end <= split.size:
            raise ValueError(f"split of {split.partition!r} is [{split.start}, {split.end}) of a file of {split.size}")
        return split

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
            upper = f.size if f.format != "parquet" else self._probe.parquet_upper(f, warn=False)
            why = None if upper else "empty file" if f.size == 0 else "no rows"
            generation = generations.get(f.relative, 0)
            out.append(ListedFile(f.relative, generation, upper, settling(f, now_ms, self.settle_seconds), why))
        out += [ListedFile(relative, generations.get(relative, 0), 0, False, why) for relative, why in ignored]
        return out

    def _list(self) -> list[Listed]:
        """Every file the source reads, now, in discovery order (mtime, then relative path)."""
        return self._scan()[0]

    def _scan(self) -> tuple[list[Listed], list[tuple[str, str]]]:
        """The files read now and the candidates never read, with why (see
        :func:`~reclock.sources.files.listing.scan`)."""
        return self.store.scan(
            self.pattern,
            fixed=self.format,
            skip=self.generations_path,
            follow_links_outside=self.follow_links_outside,
        )

    def generations(self) -> dict[str, int]:
        """``{relative_path: generation}`` from ``generations_reader`` or else ``generations_path``;
        a missing file means all 0.

        The current generation of each dropped file: the runtime bumps it on a drop.
        """
        if self.generations_reader is not None:
            return parse_generations(self.generations_reader(), "in the lake")
        return read_generations(self.generations_path)

    def _file_split(self, partition: Partition, end: int) -> FileSplit:
        relative, _ = unpack(partition)
        fmt = format_of(relative, self.format)
        if fmt is None:
            raise ValueError(f"file {relative!r} has no known format (extension)")
        return FileSplit(partition, 0, end, self.store.absolute(relative), fmt, end)

    def _pieces(self, split: FileSplit) -> list[FileSplit]:
        """``split`` cut into pieces of ``split_bytes`` when its file may be (see :meth:`splits`)."""
        cuttable = split.format == "jsonl" or (split.format == "csv" and not self.csv_multiline)
        if not self.split_bytes or split.end <= self.split_bytes or not cuttable or compression_of(split.path):
            return [split]
        return [
            replace(split, start=lo, end=min(lo + self.split_bytes, split.end))
            for lo in range(0, split.end, self.split_bytes)
        ]
