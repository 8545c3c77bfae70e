"""Closing windows: a window is emitted exactly when its input's upper passes its end.

Window ``[s, e)`` over output ``o`` is *closed* once ``upper_o >= e``: ``o`` then holds every row
with ``_into_ts < e`` (its commit label says so), and no later batch can add one, because every
later row is stamped by a later binding, at or above ``e``. So a closed window is complete: no
watermark, no allowed lateness, no late data. A finished pipeline (its source closed) also closes
the windows holding its last binding: nothing can ever reach them. Which spans each kind has is
:mod:`reclock.runtime.window_kinds`; a ``from`` window reads a finer window's table, whose label
is its upper exactly as an output's is, so a tilt frame closes by the same rule.

Window state is never kept between passes. Each pass (:meth:`WindowCloser.close`, run by the
pipeline after each batch and at the start of every step, see :class:`Windows`) recomputes the
windows between the window table's upper and the input's from the input table itself, reading
only the files whose ``_into_ts`` statistics overlap them, and commits their rows labelled with
the end of the last one. After any crash the next pass starts from the label: a window committed
before is skipped, one not committed is computed again from the same immutable rows, so each
window lands once, with one content. A window's rows are aggregated by
:class:`~reclock.runtime.window_state.State`, one row per group, bounded by ``max_groups``;
``having`` keeps the rows its predicate is true for, evaluated by the shaping engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from reclock.errors import describe
from reclock.persist.lake import Lake
from reclock.persist.store import LakePath
from reclock.persist.windows import InputScan, WindowTable, window_path
from reclock.runtime.window_counts import count_rows
from reclock.runtime.window_events import event_pass, late_schema
from reclock.runtime.window_kinds import Span, closing_spans, due, every_span
from reclock.runtime.window_sessions import session_rows
from reclock.runtime.window_state import (
    EXACT_SUM,
    LINEAGE_ORDER,
    MaxGroupsExceeded,
    State,
    SumOutOfRange,
    window_schema,
    zero_row,
)
from reclock.runtime.windows import Window, check_windows
from reclock.sources.base import Output
from reclock.timeline.frontier import INTO_TS, IntoTime

__all__ = ["EXACT_SUM", "MaxGroupsExceeded", "SumOutOfRange", "WindowCloser", "Windows", "window_schema"]

log = logging.getLogger("reclock.windowing")


class Windows:
    """A pipeline's windows: each closed by the upper of what it reads.

    The pipeline calls :meth:`close_after_batch` right after a batch commits (so a job that stops
    then has emitted every window its outputs closed) and :meth:`close` first thing in every step.
    The batch before the first is committed already, so a failure there is only logged; the
    second retries, and its failure is the step's, stalling or failing the pipeline by the usual
    rules (:class:`MaxGroupsExceeded` fails it at once).

    Windows close in definition order, so a ``from`` window (defined after the finer window it
    reads, which :func:`~reclock.runtime.windows.check_windows` requires) sees the finer table's
    upper of this very pass.
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
        self.closers: list[WindowCloser] = []
        self._lake = lake
        self._on_commit = on_commit
        self.add(windows, outputs)

    def add(self, windows: Sequence[Window], outputs: Mapping[str, Output]) -> None:
        """Close ``windows`` too, from now on: those over an output born while the pipeline runs
        (:meth:`~reclock.runtime.pipeline.Pipeline._born_outputs`), checked by the caller with
        :func:`~reclock.runtime.windows.check_windows` against ``outputs`` and the windows here."""
        by_name = {c.window.name: c for c in self.closers}
        for w in windows:
            finer = by_name.get(w.from_window) if w.from_window is not None else None
            schema = outputs[w.output].schema if finer is None else finer.table.schema  # type: ignore[index]
            closer = WindowCloser(self._lake, self.pipeline, w, schema, on_commit=self._on_commit, finer=finer)
            self.closers.append(closer)
            by_name[w.name] = closer

    @property
    def defined(self) -> list[Window]:
        """The windows closed here, in definition order."""
        return [c.window for c in self.closers]

    def current(self, uppers: Mapping[str, IntoTime], finished: bool) -> bool:
        """Every window the outputs' ``uppers`` close is in its table."""
        return all(c.current(c.input_upper(uppers), finished) for c in self.closers)

    def close(self, uppers: Mapping[str, IntoTime], finished: bool) -> int:
        """Emit every window the outputs' ``uppers`` close; how many had rows."""
        return sum(c.close(c.input_upper(uppers), finished) for c in self.closers)

    def close_after_batch(self, uppers: Mapping[str, IntoTime], finished: bool) -> None:
        try:
            self.close(uppers, finished)
        except Exception as exc:  # retried, and then raised, by the next step
            log.warning("pipeline %s: closing windows failed, retried next step: %s", self.pipeline, describe(exc))

    def paths(self) -> dict[str, LakePath]:
        """The window tables (and late tables), named for maintenance reports (``windows/<name>``)."""
        tables = {f"windows/{c.window.name}": c.table.path for c in self.closers}
        tables |= {f"windows/{c.window.name}_late": c.late.path for c in self.closers if c.late is not None}
        return tables


class WindowCloser:
    """Emits one window definition's closed windows into its table; owned by the pipeline.

    ``finer`` is the closer of the window a ``from`` window reads: its table is this one's input
    and its label this one's input upper.
    """

    def __init__(
        self,
        lake: Lake,
        pipeline: str,
        window: Window,
        input_schema: pa.Schema,
        *,
        on_commit: Callable[[str], None] | None = None,
        finer: WindowCloser | None = None,
    ) -> None:
        self.window = window
        self._input = input_schema
        self._finer = finer
        # max_groups changes no window's content, only what may be held: it may change freely.
        definition = {k: v for k, v in window.to_dict().items() if k != "max_groups"}
        self.table = WindowTable(lake, pipeline, window.name, window_schema(window, input_schema), definition)
        self.late: WindowTable | None = None
        if window.time_column is not None:  # the late rows' table, labelled like the window's
            own = late_schema(input_schema)
            self.late = WindowTable(lake, pipeline, f"{window.name}_late", own, {"late_of": window.name})
        if finer is None:
            output = lake.output_path(pipeline, window.output)  # type: ignore[arg-type]
            self._scan = InputScan(lake.store, output, window.time_column)
            self._order: tuple[str, ...] = LINEAGE_ORDER if window.ordered else (INTO_TS,)
        else:  # one row per group and finer window: into time alone orders them (check_windows)
            self._scan = InputScan(lake.store, window_path(lake, pipeline, finer.window.name))
            self._order = (INTO_TS,)
        self._scan_store = lake.store
        self._on_commit = on_commit or (lambda step: None)

    def input_upper(self, uppers: Mapping[str, IntoTime]) -> IntoTime:
        """The upper of what the window reads: its output's, or the finer window table's."""
        return uppers[self.window.output] if self._finer is None else self._finer.table.upper  # type: ignore[index]

    def due(self, input_upper: IntoTime, finished: bool) -> IntoTime:
        """The upper the table should reach: the end of the last window ``input_upper`` closes
        (and once the pipeline is ``finished``, of those holding its last into time too)."""
        if self.window.time_column is not None:  # event time: every pass over new into times
            return input_upper + 1 if finished else input_upper
        if self.window.kind == "count":  # complete with its last row: every pass over new rows
            return input_upper
        return due(self.window, input_upper, finished)

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
        if self.late is not None:
            emitted = 0
            while self.table.upper < target:  # twice after a crash between the two commits
                emitted += self._close_events(input_upper, target, self.table.upper, finished)
            return emitted
        if self.window.kind == "count":
            done = InputScan(self._scan_store, self.table.path)
            done.refresh()
            rows = count_rows(self.window, self._scan, done, self._input, self.table.schema, planned, target)
            rows = self._having(rows)
            self._commit([rows], target, planned)
            return rows.num_rows
        if self.window.kind == "session":
            rows = self._having(session_rows(self.window, self._scan, self._input, self.table.schema, planned, target))
            self._commit([rows], target, planned)
            return rows.num_rows
        if self.window.empty:
            spans = every_span(self.window, planned, target, self._scan.least)
        else:
            extents = self._scan.extents(planned - self.window.longest_ms + 1, target)
            spans = closing_spans(self.window, extents, planned, target)
        waiting: list[pa.Table] = []
        emitted = 0
        for span in spans:
            rows = self._having(self._compute(span))
            if rows.num_rows:
                waiting.append(rows)
                emitted += 1
            if sum(t.num_rows for t in waiting) >= self.window.max_groups:
                self._commit(waiting, span[1], planned)
                planned, waiting = span[1], []
        self._commit(waiting, target, planned)
        return emitted

    def _close_events(self, input_upper: IntoTime, target: IntoTime, planned: IntoTime, finished: bool) -> int:
        """One event-time pass: late rows first, then the windows, both labelled ``target - 1``.

        A crash between the two commits leaves the late table ahead; the pass is then redone to
        exactly its target, so the late commit is recognised by its label and the windows land
        as they would have (see :mod:`reclock.runtime.window_events`)."""
        assert self.late is not None
        ahead = self.late.refresh()
        if ahead > planned:  # redo exactly the pass the late table holds
            finished = finished and ahead > input_upper
            target = ahead
        rows, late = event_pass(
            self.window, self._scan, self._input, self.table.schema, planned, min(target, input_upper), finished
        )
        self.late.commit(late.cast(self.late.schema), target, planned_upper=planned)
        self._on_commit(f"windowed:{self.window.name}_late")
        rows = self._having(rows)
        self._commit([rows], target, planned)
        return rows.num_rows

    def _commit(self, waiting: list[pa.Table], upper: IntoTime, planned: IntoTime) -> None:
        rows = pa.concat_tables(waiting) if waiting else self.table.schema.empty_table()
        self.table.commit(rows, upper, planned_upper=planned)
        self._on_commit(f"windowed:{self.window.name}")

    def _compute(self, span: Span) -> pa.Table:
        """The rows of window ``[start, end)``, sorted by group, from the input table."""
        start, end = span
        columns = [*self.window.columns, *self._order]
        state = State(self.window, self._input, self._order, f"[{start}, {end})")
        for batch in self._scan.batches(start, end, columns):
            state.add(pa.Table.from_batches([batch]))
        if state.rows is None and self.window.empty:
            return zero_row(self.window, self.table.schema, start, end)
        return state.result(self.table.schema, start, end)

    def _having(self, rows: pa.Table) -> pa.Table:
        """The rows ``having`` is true for (all without one), evaluated by the shaping engine;
        the predicate was checked to judge each row alone and repeatably (``check_windows``)."""
        if self.window.having is None or not rows.num_rows:
            return rows
        from reclock.runtime.shaping.engine import INPUT, run_sql

        kept = run_sql(f"SELECT * FROM {INPUT} WHERE ({self.window.having})", rows)
        return kept.select(rows.column_names).cast(rows.schema)
