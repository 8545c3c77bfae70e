"""What the status page knows about a lake: one refresh, shared by every viewer and every endpoint.

A page that asked the lake on every request would cost the lake ``viewers x panels x refreshes``
reads; :class:`LakeView` reads it once per :meth:`LakeView.refresh` (the server calls it every
few seconds from one thread) and endpoints answer from what it read, so their cost does not grow
with the lake's tables or the number of open pages. Every read is cheap when nothing changed:

* Delta tables (outputs, remap tables, status tables) are opened once and brought up to date with
  ``update_incremental``; a table whose version did not move is not read again;
* a status table's rows are read by *file*: Delta data files are immutable, so a new version
  reads only the files it added (a version that removed files, after retention or optimize, is
  read again whole);
* ``status.json`` and ``definition.json`` are small files, read each time.

What it computes is what :mod:`reclock.persist.asof` and ``reclock status`` compute, from the same
tables: an output's upper is its label + 1, a pipeline's readable upper is the least of its
outputs' (or :data:`~reclock.persist.asof.CLOSED_UPPER` once finished), and a pipeline's state is
:func:`reclock.job.status.read_status`'s health, ``detached`` while detached.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from reclock.job.detach import is_detached
from reclock.job.secrets import redacted
from reclock.job.status import read_status
from reclock.persist.asof import CLOSED_UPPER
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import RemapTable
from reclock.persist.status_tables import STATUS_SCHEMAS
from reclock.persist.store import LakePath
from reclock.sources.base import ERRORS
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION, label_upper, wall_clock_ms
from reclock.timeline.resume import resume_upper

__all__ = ["LakeView", "OutputState", "PipelineState"]

log = logging.getLogger("reclock.ui")

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: The columns of ``_errors`` the errors panel shows.
_ERROR_COLUMNS = ["kind", "message", PARTITION, OFFSET, INTO_TS]


@dataclass(frozen=True)
class OutputState:
    """One output as of a refresh: rows in its latest version, and its upper (label + 1)."""

    rows: int | None
    upper: int | None


@dataclass(frozen=True)
class PipelineState:
    """One pipeline as of a refresh (see the module doc for where each field comes from)."""

    name: str
    definition: Mapping[str, Any]
    status: Mapping[str, Any]
    detached: bool
    outputs: Mapping[str, OutputState]
    readable_upper: int | None
    finished: bool
    bindings_upper: int
    problems: tuple[str, ...] = ()
    #: The ``${NAME}`` variables the stored definition references (their values are secrets).
    env_names: tuple[str, ...] = ()

    @property
    def source_kind(self) -> str:
        return str(self.definition.get("source", {}).get("kind", "?"))


@dataclass(frozen=True)
class Snapshot:
    """Everything a refresh read; endpoints read one snapshot, never a half-refreshed one."""

    taken_ms: int
    duration_ms: int
    pipelines: Mapping[str, PipelineState] = field(default_factory=dict)
    #: Per status table, per pipeline: its rows, oldest first (split once per refresh, not per request).
    tables: Mapping[str, Mapping[str, pa.Table]] = field(default_factory=dict)


class _TableRows:
    """A Delta table's rows, kept up to date by reading only the files each new version adds."""

    def __init__(self, lake: Lake, path: LakePath, schema: pa.Schema, columns: list[str] | None = None) -> None:
        self.lake, self.path, self.schema, self.columns = lake, path, schema, columns
        self._table: DeltaTable | None = None
        self._version = -1
        self._files: dict[str, pa.Table] = {}
        self.rows = schema.empty_table()

    def read(self) -> pa.Table:
        store = self.lake.store
        if self._table is None:
            if not store.is_table(self.path):
                return self.rows
            self._table = store.open_table(self.path)
        else:
            self._table.update_incremental()
        version = self._table.version()
        if version == self._version:
            return self.rows
        uris = self._table.file_uris()
        kept = {uri: self._files[uri] for uri in uris if uri in self._files}
        new = [uri for uri in uris if uri not in kept]
        schema = self._file_schema()
        columns = None if self.columns is None else [c for c in self.columns if c in schema.names]
        for uri in new:
            kept[uri] = self._conform(store.read_parquet([uri], schema=schema, columns=columns))
        self._files, self._version = kept, version
        parts = [kept[uri] for uri in uris]
        rows = pa.concat_tables(parts) if parts else self.schema.empty_table()
        self.rows = rows.sort_by("time_ms") if "time_ms" in rows.column_names else rows
        return self.rows

    def _file_schema(self) -> pa.Schema:
        assert self._table is not None
        return pa.schema(self._table.schema().to_arrow())

    def _conform(self, data: pa.Table) -> pa.Table:
        """The rows with exactly :attr:`schema`'s columns: a column an older file lacks is null."""
        columns = []
        for f in self.schema:
            columns.append(
                data.column(f.name).cast(f.type) if f.name in data.column_names else pa.nulls(len(data), f.type)
            )
        return pa.Table.from_arrays(columns, schema=self.schema)


class _PipelineTables:
    """One pipeline's Delta tables, opened once and brought up to date at each refresh."""

    def __init__(self, lake: Lake, name: str) -> None:
        self.lake, self.name = lake, name
        self.outputs: dict[str, DeltaTable] = {}
        self.output_states: dict[str, tuple[int, OutputState]] = {}  # output -> (version, state)
        self.remap: DeltaTable | None = None
        self.remap_version = -1
        self.closed, self.bindings_upper = False, 0
        self.errors = _TableRows(
            lake,
            lake.output_path(name, ERRORS),
            pa.schema([(c, _ERROR_TYPES[c]) for c in _ERROR_COLUMNS]),
            _ERROR_COLUMNS,
        )

    def output_state(self, output: str) -> OutputState:
        table = self.outputs.get(output)
        if table is None:
            table = self.outputs[output] = self.lake.store.open_table(self.lake.output_path(self.name, output))
        else:
            table.update_incremental()
        version = table.version()
        cached = self.output_states.get(output)
        if cached is not None and cached[0] == version:
            return cached[1]
        rows = 0
        actions = pa.table(table.get_add_actions()) if table.file_uris() else None
        if actions is not None:
            root = self.lake.output_path(self.name, output)
            for path, records in zip(
                actions.column("path").to_pylist(), actions.column("num_records").to_pylist(), strict=True
            ):
                rows += records if records is not None else self.lake.store.parquet_rows(root / path)
        state = OutputState(rows, label_upper(table.transaction_version(sink_id(self.name, output))))
        self.output_states[output] = (version, state)
        return state

    def read_remap(self) -> None:
        """Whether the bindings are closed and how far they reach, replayed only when they moved."""
        path = self.lake.remap_path(self.name)
        if self.remap is None:
            if not self.lake.store.is_table(path):
                return
            self.remap = self.lake.store.open_table(path)
        else:
            self.remap.update_incremental()
        if self.remap.version() != self.remap_version:
            bindings = RemapTable(path, self.lake.store).bindings
            self.closed, self.bindings_upper = bindings.is_closed, bindings.upper
            self.remap_version = self.remap.version()


_ERROR_TYPES = {
    "kind": pa.string(),
    "message": pa.string(),
    PARTITION: pa.string(),
    OFFSET: pa.int64(),
    INTO_TS: pa.int64(),
}


class LakeView:
    """The lake as of the last :meth:`refresh`; :attr:`snapshot` is replaced whole by each one."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self._pipelines: dict[str, _PipelineTables] = {}
        self._status = {
            name: _TableRows(lake, lake.status_table_path(name), schema) for name, schema in STATUS_SCHEMAS.items()
        }
        self._split: dict[str, tuple[pa.Table, dict[str, pa.Table]]] = {}
        self._lock = threading.Lock()
        self.snapshot = Snapshot(taken_ms=0, duration_ms=0)

    def refresh(self) -> Snapshot:
        """Read what changed since the last refresh; one at a time."""
        with self._lock:
            started = wall_clock_ms()
            pipelines = {}
            for name in self.lake.pipelines():
                tables = self._pipelines.setdefault(name, _PipelineTables(self.lake, name))
                pipelines[name] = self._pipeline(tables)
            tables_read = {}
            for table, rows in self._status.items():
                try:
                    data = rows.read()
                except Exception as exc:  # a status table mid-maintenance: keep the last rows
                    log.info("status table %s not read this time: %s", table, exc)
                    data = rows.rows
                split = self._split.get(table)
                if split is None or split[0] is not data:  # split again only what a refresh changed
                    split = self._split[table] = (data, _by_pipeline(data))
                tables_read[table] = split[1]
            now = wall_clock_ms()
            self.snapshot = Snapshot(taken_ms=now, duration_ms=now - started, pipelines=pipelines, tables=tables_read)
            return self.snapshot

    def record_errors(self, name: str) -> pa.Table:
        """Rows of the pipeline's ``_errors`` output (record errors and skipped ranges)."""
        tables = self._pipelines.get(name)
        if tables is None:
            return pa.schema([(c, _ERROR_TYPES[c]) for c in _ERROR_COLUMNS]).empty_table()
        with self._lock:
            return tables.errors.read()

    def _pipeline(self, tables: _PipelineTables) -> PipelineState:
        lake, name = self.lake, tables.name
        try:
            raw = lake.store.read_text(lake.definition_path(name))
            definition = redacted(json.loads(raw)["definition"])
        except (OSError, ValueError, KeyError):
            raw, definition = "", {}
        status = read_status(lake, name) or {}
        outputs: dict[str, OutputState] = {}
        problems = []
        for output in lake.outputs(name):
            try:
                outputs[output] = tables.output_state(output)
            except Exception as exc:  # a damaged table: say so, show the rest of the lake
                outputs[output] = OutputState(None, None)
                problems.append(f"cannot read output {output!r}: {_first_line(exc)}")
        try:
            tables.read_remap()
        except Exception as exc:
            problems.append(f"cannot read the remap table: {_first_line(exc)}")
        uppers = [o.upper for o in outputs.values() if o.upper is not None]
        # As readable_upper: a finished pipeline (closed bindings, every output past the closing
        # one) holds nobody back.
        finished = tables.closed and bool(uppers) and resume_upper(uppers) >= tables.bindings_upper
        if problems:
            readable = None
        elif not uppers:
            readable = 0
        else:
            readable = CLOSED_UPPER if finished else min(uppers)
        return PipelineState(
            name=name,
            definition=definition,
            status=status,
            detached=is_detached(lake, name),
            outputs=outputs,
            readable_upper=readable,
            finished=finished,
            bindings_upper=tables.bindings_upper,
            problems=tuple(problems),
            env_names=tuple(sorted(set(_ENV.findall(raw)))),
        )


def _by_pipeline(rows: pa.Table) -> dict[str, pa.Table]:
    """The rows of each pipeline, each oldest first: one sort, then a slice per pipeline."""
    if rows.num_rows == 0:
        return {}
    rows = rows.take(pc.sort_indices(rows, [("pipeline", "ascending"), ("time_ms", "ascending")]))
    counts = pc.value_counts(rows.column("pipeline"))
    out, start = {}, 0
    for name, count in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
        out[name] = rows.slice(start, count)
        start += count
    return out


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
