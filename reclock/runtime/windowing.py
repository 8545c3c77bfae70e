"""Closing windows: a window is emitted exactly when its input's upper passes its end.

Window ``[s, e)`` over output ``o`` is *closed* once ``upper_o >= e``: ``o`` then holds every row
with ``_into_ts < e`` (its commit label says so), and no later batch can add one, because every
later row is stamped by a later binding, at or above ``e``. So a closed window is complete: no
watermark, no allowed lateness, no late data. A finished pipeline (its source closed) also closes
the window holding its last binding: nothing can ever reach it.

Window state is never kept between passes. Each pass (:meth:`WindowCloser.close`, run by the
pipeline after each batch and at the start of every step, see :class:`Windows`) recomputes the
windows between the window table's upper and the input's from the output table itself, reading
only the files whose ``_into_ts`` statistics overlap them, and commits their rows labelled with
the end of the last one. After any crash the
next pass starts from the label: a window committed before is skipped, one not committed is
computed again from the same immutable rows, so each window lands once, with one content.

Aggregation is partial and streaming: every record batch becomes one *state row* per row, merged
with the window's state so far by group (``count`` and ``sum`` add, ``min`` and ``max`` keep the
extreme, ``avg`` keeps a sum and a count, ``first`` and ``last`` keep the row least and greatest in
``(_into_ts, _partition, _offset)``). The state holds one row per group, so a window's memory is
its groups, which ``max_groups`` bounds.

Sums of integers are kept as :data:`EXACT_SUM` (decimal128(38, 0)), never in int64 or float64: no
value of a window can then wrap or fail to convert, and an ``avg`` is the correctly rounded
quotient of the exact sum by the count (see ``docs/design/20261124_exact_window_aggregates.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.errors import DefiniteSourceError, describe
from reclock.persist.lake import Lake
from reclock.persist.store import LakePath
from reclock.persist.windows import InputScan, WindowTable
from reclock.runtime.windows import WINDOW_END, WINDOW_START, Aggregate, Window, check_windows
from reclock.sources.base import Output
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION, IntoTime

__all__ = ["EXACT_SUM", "MaxGroupsExceeded", "SumOutOfRange", "WindowCloser", "Windows", "window_schema"]

log = logging.getLogger("reclock.windowing")

_ORDER = (INTO_TS, PARTITION, OFFSET)
_FIRST = tuple(f"__first{c}" for c in _ORDER)
_LAST = tuple(f"__last{c}" for c in _ORDER)
_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}

#: The type of a sum of integers, in the state and in the table: 38 digits hold the sum of any
#: 5 * 10**18 values of 64 bits (more rows than a window can read), so it is exact.
EXACT_SUM = pa.decimal128(38, 0)


class MaxGroupsExceeded(DefiniteSourceError):
    """A window has more groups than its ``max_groups``.

    Definite: the same rows give the same groups on every retry, so the pipeline fails with this
    message instead of retrying. Nothing is lost: raise ``max_groups`` (or group by fewer columns,
    under a new window name) and restart, and the window is computed whole from the output table.
    """


class SumOutOfRange(DefiniteSourceError):
    """An exact sum does not fit the int64 column of a window table made before sums were exact.

    Such a table keeps its column type (it stays readable and appendable as it was); a sum beyond
    int64 cannot be written to it, and writing anything else would be a wrong value. Definite: the
    same rows give the same sum. The window under a new name gets a decimal(38, 0) column and is
    computed from the output's whole history.
    """


def window_schema(window: Window, input_schema: pa.Schema) -> pa.Schema:
    """A window table's own columns: its bounds, the group columns, then one per aggregate."""
    fields = [pa.field(WINDOW_START, pa.int64(), nullable=False), pa.field(WINDOW_END, pa.int64(), nullable=False)]
    fields += [pa.field(c, input_schema.field(c).type) for c in window.group_by]
    for agg in window.parsed:
        fields.append(pa.field(agg.name, _result_type(agg, input_schema)))
    return pa.schema(fields)


def _result_type(agg: Aggregate, schema: pa.Schema) -> pa.DataType:
    if agg.function == "count":
        return pa.int64()
    if agg.function == "avg":
        return pa.float64()
    if agg.function == "sum":
        return _sum_type(agg, schema)
    return schema.field(agg.column).type


def _sum_type(agg: Aggregate, schema: pa.Schema) -> pa.DataType:
    """What a ``sum`` or ``avg`` adds its values in: exact for integers, float64 for floats."""
    return EXACT_SUM if pa.types.is_integer(schema.field(agg.column).type) else pa.float64()


class Windows:
    """A pipeline's windows: each closed by the upper of the output it reads.

    The pipeline calls :meth:`close_after_batch` right after a batch commits (so a job that stops
    then has emitted every window its outputs closed) and :meth:`close` first thing in every step.
    The batch before the first is committed already, so a failure there is only logged; the
    second retries, and its failure is the step's, stalling or failing the pipeline by the usual
    rules (:class:`MaxGroupsExceeded` fails it at once).
    """

    def __init__(
        self,
        lake: Lake,
        pipeline: str,
        windows: Sequence[Window],
        outputs: Mapping[str, Output],
        *,
        on_commit: Callable[[str], None] | None = None,
    ) -> None:
        check_windows(windows, list(outputs.values()))
        self.pipeline = pipeline
        self.closers = [WindowCloser(lake, pipeline, w, outputs[w.output].schema, on_commit=on_commit) for w in windows]

    def current(self, uppers: Mapping[str, IntoTime], finished: bool) -> bool:
        """Every window the outputs' ``uppers`` close is in its table."""
        return all(c.current(uppers[c.window.output], finished) for c in self.closers)

    def close(self, uppers: Mapping[str, IntoTime], finished: bool) -> int:
        """Emit every window the outputs' ``uppers`` close; how many had rows."""
        return sum(c.close(uppers[c.window.output], finished) for c in self.closers)

    def close_after_batch(self, uppers: Mapping[str, IntoTime], finished: bool) -> None:
        try:
            self.close(uppers, finished)
        except Exception as exc:  # retried, and then raised, by the next step
            log.warning("pipeline %s: closing windows failed, retried next step: %s", self.pipeline, describe(exc))

    def paths(self) -> dict[str, LakePath]:
        """The window tables, named for maintenance reports (``windows/<name>``)."""
        return {f"windows/{c.window.name}": c.table.path for c in self.closers}


class WindowCloser:
    """Emits one window definition's closed windows into its table; owned by the pipeline."""

    def __init__(
        self,
        lake: Lake,
        pipeline: str,
        window: Window,
        input_schema: pa.Schema,
        *,
        on_commit: Callable[[str], None] | None = None,
    ) -> None:
        self.window = window
        self._input = input_schema
        # max_groups changes no window's content, only what may be held: it may change freely.
        definition = {k: v for k, v in window.to_dict().items() if k != "max_groups"}
        self.table = WindowTable(lake, pipeline, window.name, window_schema(window, input_schema), definition)
        self._scan = InputScan(lake.store, lake.output_path(pipeline, window.output))
        self._on_commit = on_commit or (lambda step: None)

    def due(self, input_upper: IntoTime, finished: bool) -> IntoTime:
        """The upper the table should reach: the end of the last window ``input_upper`` closes.

        ``input_upper`` is the input output's upper; once the pipeline is ``finished`` the window
        holding its last into time (``input_upper - 1``) is closed too.
        """
        size = self.window.size_ms
        if finished and input_upper > 0:
            return ((input_upper - 1) // size + 1) * size
        return input_upper // size * size

    def current(self, input_upper: IntoTime, finished: bool) -> bool:
        """Whether every window ``input_upper`` closes is in the table already."""
        return self.table.upper >= self.due(input_upper, finished)

    def close(self, input_upper: IntoTime, finished: bool) -> int:
        """Compute and commit every window closed since the last pass; the number with rows.

        Rows wait for a commit only up to ``max_groups`` of them: past that, the windows computed
        so far are committed, labelled with the last one's end, so a long catch-up (a pipeline
        restarted after hours) holds a bounded number of rows in memory.
        """
        target = self.due(input_upper, finished)
        if self.table.upper >= target or self.table.refresh() >= target:
            return 0
        planned = self.table.upper
        self._scan.refresh()
        size = self.window.size_ms
        waiting: list[pa.Table] = []
        emitted = 0
        for start in self._scan.windows(planned, target, size):
            rows = self._compute(start)
            if rows.num_rows:
                waiting.append(rows)
                emitted += 1
            if sum(t.num_rows for t in waiting) >= self.window.max_groups:
                self._commit(waiting, start + size, planned)
                planned, waiting = start + size, []
        self._commit(waiting, target, planned)
        return emitted

    def _commit(self, waiting: list[pa.Table], upper: IntoTime, planned: IntoTime) -> None:
        rows = pa.concat_tables(waiting) if waiting else self.table.schema.empty_table()
        self.table.commit(rows, upper, planned_upper=planned)
        self._on_commit(f"windowed:{self.window.name}")

    # -- one window --------------------------------------------------------------------------------

    def _compute(self, start: IntoTime) -> pa.Table:
        """The rows of window ``[start, start + size)``, sorted by group, from the output table."""
        window = self.window
        end = start + window.size_ms
        columns = [*window.columns, *(_ORDER if window.ordered else (INTO_TS,))]
        state: pa.Table | None = None
        for batch in self._scan.batches(start, end, columns):
            part = self._state_rows(pa.Table.from_batches([batch]))
            state = self._merge(part if state is None else pa.concat_tables([state, part]))
            if state.num_rows > window.max_groups:
                raise MaxGroupsExceeded(
                    f"window {window.name!r} [{start}, {end}) has more than max_groups={window.max_groups} groups "
                    f"of {list(window.group_by)}; raise max_groups and restart (the window is recomputed from "
                    f"output {window.output!r}, nothing is lost)"
                )
        if state is None:
            return self.table.schema.empty_table()
        return self._result(state, start, end)

    def _state_rows(self, rows: pa.Table) -> pa.Table:
        """Each row as a state of its own: what a group of that one row aggregates to."""
        columns: dict[str, pa.Array | pa.ChunkedArray] = {c: rows.column(c) for c in self.window.group_by}
        for i, agg in enumerate(self.window.parsed):
            value = rows.column(agg.column) if agg.column is not None else None
            if agg.function == "count":
                ones = pa.array(np.ones(rows.num_rows, dtype=np.int64))
                columns[f"__{i}"] = ones if value is None else pc.cast(pc.is_valid(value), pa.int64())
            elif agg.function in ("sum", "avg"):
                columns[f"__{i}"] = pc.cast(value, _sum_type(agg, self._input))
                if agg.function == "avg":
                    columns[f"__{i}n"] = pc.cast(pc.is_valid(value), pa.int64())
            else:
                columns[f"__{i}"] = value
        if self.window.ordered:
            for name, first, last in zip(_ORDER, _FIRST, _LAST, strict=True):
                columns[first] = columns[last] = rows.column(name)
        return pa.table(columns)

    def _merge(self, state: pa.Table) -> pa.Table:
        """One state row per group: the rows of ``state`` merged by their group columns."""
        group_by = list(self.window.group_by)
        gid, keys = _group_ids(state, group_by)
        specs, names = [], []
        for i, agg in enumerate(self.window.parsed):
            if agg.function in _MERGE:
                specs.append((f"__{i}", _MERGE[agg.function]))
                names.append(f"__{i}")
            elif agg.function == "avg":
                specs += [(f"__{i}", "sum"), (f"__{i}n", "sum")]
                names += [f"__{i}", f"__{i}n"]
        out = {c: keys.column(c) for c in group_by}
        if specs:
            by_gid = state.select(names).append_column("__gid", pa.array(gid))
            merged = by_gid.group_by("__gid").aggregate(specs).sort_by("__gid")
            out.update({name: merged.column(f"{name}_{fn}") for name, fn in specs})
        if self.window.ordered:
            firsts = state.take(_pick(gid, state, _FIRST, "ascending"))
            lasts = state.take(_pick(gid, state, _LAST, "descending"))
            for i, agg in enumerate(self.window.parsed):
                if agg.function in ("first", "last"):
                    out[f"__{i}"] = (firsts if agg.function == "first" else lasts).column(f"__{i}")
            out.update({c: firsts.column(c) for c in _FIRST})
            out.update({c: lasts.column(c) for c in _LAST})
        return pa.table(out).select(state.column_names)

    def _result(self, state: pa.Table, start: IntoTime, end: IntoTime) -> pa.Table:
        """A window's rows from its final state, in the table's schema, ordered by group."""
        n = state.num_rows
        columns: dict[str, pa.Array | pa.ChunkedArray] = {
            WINDOW_START: pa.array(np.full(n, start, dtype=np.int64)),
            WINDOW_END: pa.array(np.full(n, end, dtype=np.int64)),
        }
        columns.update({c: state.column(c) for c in self.window.group_by})
        for i, agg in enumerate(self.window.parsed):
            value = state.column(f"__{i}")
            if agg.function == "avg":
                value = _average(value, state.column(f"__{i}n"))
            kind = self.table.schema.field(agg.name).type
            if value.type == EXACT_SUM and kind == pa.int64():  # a table made before sums were exact
                self._check_fits(agg, value, state, start, end)
            columns[agg.name] = value
        columns[INTO_TS] = pa.array(np.full(n, end - 1, dtype=np.int64))
        table = pa.table(columns).cast(self.table.schema)
        if not self.window.group_by:
            return table
        return table.sort_by([(c, "ascending") for c in self.window.group_by])  # nulls last

    def _check_fits(self, agg: Aggregate, value: pa.ChunkedArray, state: pa.Table, start: int, end: int) -> None:
        """A sum for the int64 column of an older table: refused, naming its group, if it does not fit."""
        low, high = pa.scalar(-(2**63), EXACT_SUM), pa.scalar(2**63 - 1, EXACT_SUM)
        fits = pc.and_(pc.greater_equal(value, low), pc.less_equal(value, high))
        outside = pc.indices_nonzero(pc.invert(pc.fill_null(fits, True)))
        if len(outside):
            at = outside[0].as_py()
            group = {c: state.column(c)[at].as_py() for c in self.window.group_by}
            raise SumOutOfRange(
                f"window {self.window.name!r} [{start}, {end}) group {group}: {agg.name!r} = {agg} is "
                f"{value[at].as_py()}, beyond the int64 column its table was made with (before sums were exact); "
                "give the window a new name: its table gets a decimal(38,0) column, computed from the output's history"
            )


def _average(total: pa.ChunkedArray, count: pa.ChunkedArray) -> pa.Array:
    """``total / count`` per group, null where the count is 0; an exact (decimal) total is divided
    in Python integers, so the float64 is the correctly rounded quotient whatever its size."""
    if total.type != EXACT_SUM:
        quotient = pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64()))
        return pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()), quotient)
    pairs = zip(total.to_pylist(), count.to_pylist(), strict=True)
    return pa.array([int(t) / n if n else None for t, n in pairs], pa.float64())


def _group_ids(state: pa.Table, group_by: list[str]) -> tuple[np.ndarray, pa.Table]:
    """Per row its group's index, and the groups' key columns in that order (null keys group too)."""
    n = state.num_rows
    if not group_by:
        return np.zeros(n, dtype=np.int64), state.select([])
    rows = state.select(group_by).append_column("__row", pa.array(np.arange(n, dtype=np.int64)))
    groups = rows.group_by(group_by, use_threads=False).aggregate([("__row", "list")])
    members = groups.column("__row_list").combine_chunks()
    gid = np.empty(n, dtype=np.int64)
    gid[pc.list_flatten(members).to_numpy()] = pc.list_parent_indices(members).to_numpy()
    return gid, groups.select(group_by)


def _pick(gid: np.ndarray, state: pa.Table, order: tuple[str, ...], direction: str) -> np.ndarray:
    """Per group (in index order) the row that comes first by ``order`` in ``direction``."""
    keyed = pa.table({"__gid": pa.array(gid), **{c: state.column(c) for c in order}})
    sorted_rows = pc.sort_indices(keyed, sort_keys=[("__gid", "ascending"), *((c, direction) for c in order)])
    indices = sorted_rows.to_numpy()
    ordered = gid[indices]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(ordered)) + 1)) if len(ordered) else np.array([], np.int64)
    return indices[starts]
