"""Event-time windows: tumbling windows over a column of the rows, closed by a watermark derived
from durable data only.

The watermark after into time ``T`` is ``W(T) = M(T) - allowed_lateness``, where ``M(T)`` is the
greatest event time among the rows with ``_into_ts < T``: rows bound at or before the binding
before ``T``, which are in the output for good. So ``W`` is a function of the timeline, and a
replay after any crash derives the same watermark at every binding.

Event window ``[s, e)`` closes at ``C_e``, the first into time where ``W >= e``: one past the into
time ``t*`` of the first row with an event time at or above ``e + lateness``. Its rows are those
with ``s <= event < e`` and ``_into_ts < C_e``; its ``_into_ts`` is ``C_e - 1``, the last into
time it depends on. A row with ``s <= event < e`` and ``_into_ts >= C_e`` is *late*: its window
closed before it was bound, and it goes to the window's late table (``windows/<name>_late``), as
the row it is, with its coordinates. A row without an event time is late too. Each row is judged
once, by the pass over its into time: in its window or late, never both, never neither.

A pass covers into times ``[lo, hi)`` (the window table's upper to the output's): ``M(lo)`` comes
from file statistics (reading only files that straddle ``lo``), the new rows give ``M`` at each of
their into times, and the windows whose ends lie in ``(W(lo), W(hi)]`` close. Once the pipeline
is finished every window closes. No state: everything is the output's rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.persist.windows import InputScan, event_ms
from reclock.runtime.window_kinds import ms
from reclock.runtime.window_state import LINEAGE_ORDER, State
from reclock.runtime.windows import Window
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION, IntoTime

__all__ = ["LINEAGE", "event_pass", "late_schema"]

#: The lineage a late row keeps: where it came from.
LINEAGE = (PARTITION, OFFSET)


def late_schema(own: pa.Schema) -> pa.Schema:
    """A late table's own columns: the output's, then the lineage of each row (``_into_ts`` is
    added by the table, as for an output)."""
    return pa.schema([*own, pa.field(PARTITION, pa.string()), pa.field(OFFSET, pa.int64())])


def event_pass(
    window: Window,
    scan: InputScan,
    own: pa.Schema,
    schema: pa.Schema,
    lo: IntoTime,
    hi: IntoTime,
    finished: bool,
) -> tuple[pa.Table, pa.Table]:
    """The window rows closing and the late rows bound in the pass over into times ``[lo, hi)``
    (``scan`` refreshed already): window rows in the table's ``schema``, late rows as the
    output's ``own`` columns, their lineage and ``_into_ts``."""
    column, size, lateness = window.time_column, ms(window, "size_ms"), window.allowed_lateness_ms
    assert column is not None
    # Step 1: M(lo), from the rows bound before the pass.
    before = scan.column_max(lo)
    # Step 2: the new rows, and per row M before its into time; late rows.
    names = [*own.names, *LINEAGE, INTO_TS]
    batches = list(scan.batches(lo, hi, names))
    new = (
        pa.Table.from_batches(batches).select(names)
        if batches
        else late_schema(own).append(pa.field(INTO_TS, pa.int64())).empty_table()
    )
    values = event_ms(new.column(column))
    known = pc.is_valid(values).to_numpy(zero_copy_only=False)
    ev = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    into = new.column(INTO_TS).to_numpy()
    prior = _prior_max(into, ev, known, before)
    seen = prior > np.iinfo(np.int64).min  # no event bound before: no watermark yet
    late = ~known | (seen & ((ev // size + 1) * size <= np.where(seen, prior, 0) - lateness))
    late_rows = new.filter(pa.array(late))
    # Step 3: the windows whose ends lie in (W(lo), W(hi)], or all of them once finished.
    w_lo = None if before is None else before - lateness
    tops = [v for v in (before, int(ev[known].max()) if known.any() else None) if v is not None]
    w_hi = None if not tops else max(tops) - lateness
    rows = []
    for start, end in _closing(scan, hi, size, w_lo, w_hi, finished):
        # C_e: one past the first into time of a row at or above end + lateness (hi if none yet).
        pushed = into[known & (ev >= end + lateness)]
        closes = int(pushed.min()) + 1 if len(pushed) else hi
        rows.append(_compute(window, scan, own, schema, start, end, closes))
    done = pa.concat_tables(rows) if rows else schema.empty_table()
    return done, late_rows


def _prior_max(into: np.ndarray, ev: np.ndarray, known: np.ndarray, before: int | None) -> np.ndarray:
    """Per row, M at its into time: the greatest event time among rows of earlier into times
    (``before`` for those of earlier passes); the least int64 where there is none."""
    floor = np.iinfo(np.int64).min if before is None else before
    out = np.full(len(into), floor, dtype=np.int64)
    if not len(into):
        return out
    times, at = np.unique(into, return_inverse=True)
    best = np.full(len(times), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(best, at[known], ev[known])
    running = np.maximum.accumulate(np.concatenate(([floor], best[:-1])))  # max of earlier into times
    return np.maximum(out, running[at])


def _closing(
    scan: InputScan, hi: IntoTime, size: int, w_lo: int | None, w_hi: int | None, finished: bool
) -> list[tuple[int, int]]:
    """The windows ``[s, s + size)`` with rows, whose end lies in ``(w_lo, w_hi]`` (any end above
    ``w_lo`` once ``finished``), in the order of their ends."""
    spans: set[tuple[int, int]] = set()
    for first, last in scan.column_extents(hi):
        if w_lo is not None:
            first = max(first, w_lo - size + 1)  # a window ending after w_lo starts after w_lo - size
        if not finished:
            if w_hi is None:
                continue
            last = min(last, w_hi - 1)  # a window ending by w_hi holds only events below it
        for start in range(first // size * size, last // size * size + 1, size):
            end = start + size
            if (w_lo is None or end > w_lo) and (finished or (w_hi is not None and end <= w_hi)):
                spans.add((start, end))
    return sorted(spans, key=lambda s: s[1])


def _compute(
    window: Window, scan: InputScan, own: pa.Schema, schema: pa.Schema, start: int, end: int, closes: IntoTime
) -> pa.Table:
    """Window ``[start, end)`` of event time: its rows bound before ``closes``, ``_into_ts`` then
    ``closes - 1``."""
    column = window.time_column
    assert column is not None
    order = LINEAGE_ORDER if window.ordered else (INTO_TS,)
    names = list(dict.fromkeys([*window.columns, *order]))
    state = State(window, own, order, f"[{start}, {end}) of {column}")
    least = scan.least if scan.least is not None else closes
    for batch in scan.batches(least, closes, names, column_range=(start, end)):
        values = event_ms(batch.column(column))
        keep = pc.and_(pc.greater_equal(values, start), pc.less(values, end))
        rows = pa.Table.from_batches([batch]).filter(pc.fill_null(keep, False))
        if rows.num_rows:
            state.add(rows)
    done = state.result(schema, start, end)
    return done.set_column(done.schema.get_field_index(INTO_TS), INTO_TS, pa.array(np.full(done.num_rows, closes - 1)))
