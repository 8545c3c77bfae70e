"""Window tables: one Delta table per window, labelled like an output, and scans of its input.

A window's table lives beside the pipeline's outputs, not among them::

    <lake>/<pipeline>/windows/<name>/   Delta: one row per (window, group)

so it never holds back the pipeline's resume or readable upper (it trails its input by up to a
window). Each commit carries ``Transaction(app_id="reclock/<pipeline>/windows/<name>", version=V)``
with ``V = end - 1`` of the last window it completes: the table then holds every window whose end
is at most ``V + 1``, its *upper*, exactly as an output's label says which into times it holds. A
replay of a commit is skipped by that label and a second writer is fenced (the same
:class:`~reclock.persist.sink.OutputSink` does both), so a window is emitted once, whatever
crashes.

The table also records its window's definition (table property ``reclock.window``): a window whose
size, groups or aggregates changed cannot continue a table computed with the old ones. Its column
types are the table's own: a table made when integer sums were int64 keeps int64 columns where a
new one has decimal(38, 0) (see ``docs/design/20261124_exact_window_aggregates.md``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reclock.errors import ConfigError
from reclock.persist.data_files import write_data_file
from reclock.persist.faults import lake_io
from reclock.persist.lake import Lake
from reclock.persist.sink import OutputSink, table_schema
from reclock.persist.store import LakePath, Store
from reclock.timeline.frontier import INTO_TS, IntoTime

__all__ = ["DEFINITION", "InputScan", "WindowTable", "event_ms", "window_app_id", "window_path"]

#: The table property holding the window's definition, as JSON.
DEFINITION = "reclock.window"


def window_path(lake: Lake, pipeline: str, name: str) -> LakePath:
    """Where window ``name`` of ``pipeline`` keeps its table."""
    return lake.pipeline_dir(pipeline) / "windows" / name


def window_app_id(pipeline: str, name: str) -> str:
    """The transaction app id of a window table's commits; distinct from every output's."""
    return f"reclock/{pipeline}/windows/{name}"


class WindowTable:
    """The driver-side owner of one window table: its upper, and labelled commits of closed windows."""

    def __init__(self, lake: Lake, pipeline: str, name: str, schema: pa.Schema, definition: Mapping[str, Any]) -> None:
        self.name = name
        self._store = lake.store
        self._sink = OutputSink(
            window_path(lake, pipeline, name),
            window_app_id(pipeline, name),
            table_schema(schema, lineage=False),
            store=lake.store,
        )
        wanted = json.dumps(dict(definition), sort_keys=True)
        with lake_io(f"reading window table {name}"):
            table = lake.store.open_table(self._sink.path)
            stored = table.metadata().configuration.get(DEFINITION)
            if stored is None:
                table.alter.set_table_properties({DEFINITION: wanted}, raise_if_not_exists=False)
            columns = pa.schema(table.schema().to_arrow())
        if stored is not None and stored != wanted:
            raise ConfigError(
                f"windows.{name}",
                f"its table was computed with another definition ({stored}); give the changed window a new name",
            )
        self._sink.schema = _kept_types(self._sink.schema, columns)

    @property
    def upper(self) -> IntoTime:
        """Every window whose end is at most this is in the table (0 before the first commit)."""
        return self._sink.upper

    @property
    def path(self) -> LakePath:
        return self._sink.path

    @property
    def schema(self) -> pa.Schema:
        return self._sink.schema

    def refresh(self) -> IntoTime:
        """Re-read the label: before a pass, so a window another run committed is not redone."""
        return self._sink.refresh()

    def commit(self, rows: pa.Table, upper: IntoTime, *, planned_upper: IntoTime) -> bool:
        """Add ``rows`` (every window ending in ``(planned_upper, upper]``) in one commit labelled
        ``upper - 1``; ``False`` if that label is in already (a replay), nothing written twice."""
        schema = self._sink.schema
        if rows.num_rows and rows.schema != schema and set(rows.column_names) == set(schema.names):
            # the table's types: a finer window's min of a timestamp is in microseconds there
            rows = rows.select(schema.names).cast(schema)
        files = [write_data_file(self._sink.path, self.name, rows, self._store)] if rows.num_rows else []
        return self._sink.commit(files, upper - 1, planned_upper=planned_upper)


def _kept_types(wanted: pa.Schema, stored: pa.Schema) -> pa.Schema:
    """``wanted``, with the int64 of a table made before exact sums where it wants decimal(38, 0):
    files of another type than their table's column would make it unreadable."""
    fields = []
    for f in wanted:
        if f.name in stored.names and pa.types.is_decimal(f.type) and stored.field(f.name).type == pa.int64():
            f = f.with_type(pa.int64())
        fields.append(f)
    return pa.schema(fields)


@dataclass(frozen=True)
class _File:
    location: LakePath
    lo: IntoTime  # least and greatest _into_ts of its rows
    hi: IntoTime
    #: least and greatest of the scan's ``column`` (epoch ms), ``None`` without statistics
    column_lo: int | None = None
    column_hi: int | None = None


class InputScan:
    """Reads an append output's rows by into-time range, touching only the files that can hold them.

    Every data file's statistics give its least and greatest ``_into_ts`` (reclock's writers
    and ``optimize`` record them), so the files of a range are found from the log alone. Rows are
    read batch by batch, never a whole range at once, so memory follows the window's groups, not
    its rows.
    """

    def __init__(self, store: Store, path: LakePath, column: str | None = None) -> None:
        self._store = store
        self._path = path
        self.column = column  # an event-time column whose statistics are kept too
        self._table = store.open_table(path)
        self._files: list[_File] = []

    def refresh(self) -> None:
        """Load the newest version's files and their into-time bounds; once per pass."""
        with lake_io(f"reading output table {self._path.name}"):
            self._table.update_incremental()
            actions = pa.table(self._table.get_add_actions(flatten=True))
        lo_name, hi_name = f"min.{INTO_TS}", f"max.{INTO_TS}"
        names = actions.column_names
        files = []
        for row in actions.to_pylist():
            location = self._path / unquote(row["path"])
            lo = row.get(lo_name) if lo_name in names else None
            hi = row.get(hi_name) if hi_name in names else None
            if lo is None or hi is None:
                lo, hi = self._bounds(location)
            if lo is not None and hi is not None:  # both or neither: an empty file has no bounds
                column_lo = column_hi = None
                if self.column is not None:
                    column_lo = _epoch_ms(row.get(f"min.{self.column}"))
                    column_hi = _epoch_ms(row.get(f"max.{self.column}"))
                files.append(_File(location, lo, hi, column_lo, column_hi))
        self._files = files

    @property
    def least(self) -> IntoTime | None:
        """The least into time of any row (``None`` for an empty table): nothing lies before it."""
        return min((f.lo for f in self._files), default=None)

    def extents(self, lo: IntoTime, hi: IntoTime) -> list[tuple[IntoTime, IntoTime]]:
        """Per file that may hold rows with ``lo <= _into_ts < hi``: the least and greatest into
        time of its rows in that range (by its statistics), so a window kind can tell which of its
        windows may have rows without reading one."""
        out = []
        for f in self._files:
            first, last = max(f.lo, lo), min(f.hi, hi - 1)
            if first <= last:
                out.append((first, last))
        return out

    def column_max(self, below: IntoTime) -> int | None:
        """The greatest ``column`` value (epoch ms) among rows with ``_into_ts < below``: from the
        statistics of the files wholly below, reading only the files that straddle ``below``."""
        highs = [bounds[1] for bounds in self.column_extents(below)]
        return max(highs, default=None)

    def column_extents(self, below: IntoTime) -> list[tuple[int, int]]:
        """Per file with rows below ``below``: the least and greatest ``column`` value (epoch ms)
        of those rows, by its statistics when it lies wholly below, else by reading it."""
        out = []
        for f in self._files:
            if f.lo >= below:
                continue
            if f.hi < below and f.column_lo is not None and f.column_hi is not None:
                out.append((f.column_lo, f.column_hi))
                continue
            values = [event_ms(b.column(self.column)) for b in self.batches(f.lo, below, [self.column], only=f)]  # type: ignore[list-item]
            bounds = pc.min_max(pa.chunked_array(values, pa.int64()))
            if bounds["min"].is_valid:
                out.append((bounds["min"].as_py(), bounds["max"].as_py()))
        return out

    def batches(
        self,
        lo: IntoTime,
        hi: IntoTime,
        columns: Sequence[str],
        *,
        only: _File | None = None,
        column_range: tuple[int, int] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Rows with ``lo <= _into_ts < hi``, in file order, as record batches of ``columns``;
        with ``column_range`` ``[a, b)``, only files whose ``column`` statistics may hold a value in
        it are read (the rows are not filtered by it)."""
        for f in self._files if only is None else [only]:
            if f.hi < lo or f.lo >= hi:
                continue
            known = column_range is not None and f.column_lo is not None and f.column_hi is not None
            if known and (f.column_hi < column_range[0] or f.column_lo >= column_range[1]):  # type: ignore[index, operator]
                continue
            with lake_io(f"reading output table {self._path.name}"), self._open(f.location) as parquet:
                groups = _row_groups(parquet, lo, hi)
                if not groups:
                    continue
                for batch in parquet.iter_batches(row_groups=groups, columns=list(dict.fromkeys([*columns, INTO_TS]))):
                    ts = batch.column(INTO_TS)
                    keep = pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi))
                    batch = batch.filter(keep)
                    if batch.num_rows:
                        yield batch

    def _bounds(self, location: LakePath) -> tuple[IntoTime | None, IntoTime | None]:
        """A file without statistics (another writer's): its bounds from its own column."""
        with self._open(location) as parquet:
            column = parquet.read(columns=[INTO_TS]).column(INTO_TS)
        bounds = pc.min_max(column)
        return bounds["min"].as_py(), bounds["max"].as_py()

    def _open(self, location: LakePath) -> pq.ParquetFile:
        if isinstance(location, Path):
            return pq.ParquetFile(location)
        return pq.ParquetFile(self._store.filesystem().open_input_file(location.location))


def event_ms(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """An event-time column as epoch milliseconds (int64): integers as they are, timestamps
    floored to the millisecond."""
    if pa.types.is_timestamp(values.type):
        return pc.cast(pc.cast(values, pa.timestamp("ms", values.type.tz), safe=False), pa.int64())
    return pc.cast(values, pa.int64())


def _epoch_ms(value: Any) -> int | None:
    """A statistic of an event-time column as epoch ms (a naive timestamp is UTC)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return int((aware - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1))
    return int(value)


def _row_groups(parquet: pq.ParquetFile, lo: IntoTime, hi: IntoTime) -> list[int]:
    """The row groups that may hold an into time in ``[lo, hi)``, by their statistics.

    A file ``optimize`` merged spans many windows; its row groups each span fewer, so a window
    reads only its own part of the file.
    """
    meta = parquet.metadata
    leaves = [meta.schema.column(j).path for j in range(meta.num_columns)]
    if INTO_TS not in leaves:
        return list(range(meta.num_row_groups))
    column = leaves.index(INTO_TS)  # a leaf index: nested columns before it have several leaves
    groups = []
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max or (stats.min < hi and stats.max >= lo):
            groups.append(i)
    return groups
