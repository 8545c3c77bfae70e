"""Session windows over into time: per group, a run of rows each less than ``gap`` after the one
before, ``[first, last + gap)``.

A session is *closed* once its input's upper reaches ``last + gap``: every row of its group below
that is in the input, and none lies in ``(last, last + gap)``, so no row can extend it any more.
Like every window, a session is computed from the input table, never from kept state: a pass
from table upper ``lo`` to due ``hi`` finds the sessions ending in ``(lo, hi]`` (their last row in
``(lo - gap, hi - gap]``) among the rows of ``[begin, hi)``, and moves ``begin`` back, doubling the
step, while some such session's first row could have a row of its group less than ``gap`` before
it outside the range. A session that has gone on for hours is read back whole: a pass costs the
rows of the sessions it closes (and of other groups' rows in their span), not the table.

The sessions a pass closes are aggregated by :class:`~reclock.runtime.window_state.State`, grouped
by session and group; a range where more than ``max_groups`` sessions are open at one into time
fails the pipeline (:class:`~reclock.runtime.window_state.MaxGroupsExceeded`), nothing written and
nothing lost.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from reclock.persist.windows import InputScan
from reclock.runtime.window_kinds import ms
from reclock.runtime.window_state import LINEAGE_ORDER, MaxGroupsExceeded, State, group_ids, window_schema
from reclock.runtime.windows import WINDOW_END, WINDOW_START, Window
from reclock.timeline.frontier import INTO_TS, IntoTime

__all__ = ["session_rows"]

_SESSION = "__session"


def session_rows(
    window: Window, scan: InputScan, input_schema: pa.Schema, schema: pa.Schema, lo: IntoTime, hi: IntoTime
) -> pa.Table:
    """The rows of every session of ``window`` ending in ``(lo, hi]``, in the table's ``schema``,
    ordered by end and group; ``scan`` is refreshed already."""
    gap = ms(window, "gap_ms")
    order = LINEAGE_ORDER if window.ordered else (INTO_TS,)
    columns = list(dict.fromkeys([*window.columns, *order]))
    begin, step = lo - gap + 1, gap
    least = scan.least
    while True:
        rows = _read(scan, begin, hi, columns, input_schema)
        session, first, last = _sessions(rows, window, gap)
        closing = (last + gap > lo) & (last + gap <= hi)
        starts = first[closing]
        # Step: a closing session whose first row has room for an earlier one before the range.
        if not len(starts) or least is None or starts.min() - gap + 1 >= begin or begin <= least:
            break
        begin, step = max(begin - step, least), step * 2
    if not closing.any():
        return schema.empty_table()
    keep = closing[session]
    rows = rows.filter(pa.array(keep)).append_column(_SESSION, pa.array(session[keep]))
    sessions = max(int(closing.sum()), 1)  # bounded by the check on sessions open at once
    keyed = (_SESSION, *window.group_by)
    by_session = dataclasses.replace(window, group_by=keyed, having=None, max_groups=sessions)
    state = State(by_session, rows.schema, order, f"sessions ending in ({lo}, {hi}]")
    state.add(rows)
    inner = window_schema(by_session, rows.schema).append(pa.field(INTO_TS, pa.int64()))
    done = state.result(inner, 0, 0)
    ids = done.column(_SESSION).to_numpy()
    ends = last[ids] + gap
    done = done.set_column(0, WINDOW_START, pa.array(first[ids]))
    done = done.set_column(1, WINDOW_END, pa.array(ends))
    done = done.set_column(done.schema.get_field_index(INTO_TS), INTO_TS, pa.array(ends - 1))
    done = done.drop_columns([_SESSION]).select(schema.names).cast(schema)
    return done.sort_by([(WINDOW_END, "ascending"), *((c, "ascending") for c in window.group_by)])


def _read(scan: InputScan, begin: IntoTime, hi: IntoTime, columns: list[str], schema: pa.Schema) -> pa.Table:
    batches = list(scan.batches(begin, hi, columns))
    if not batches:
        return pa.schema(
            [schema.field(c) if c in schema.names else pa.field(c, pa.int64()) for c in columns]
        ).empty_table()
    return pa.Table.from_batches(batches).select(columns)


def _sessions(rows: pa.Table, window: Window, gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row its session's index; per session its first and last into time.

    Rows are ordered by group, then into time; a session starts at a new group or where the
    into time jumps by ``gap`` or more. More than ``max_groups`` sessions open at one into time
    fail the pass: a catch-up over hours closes many sessions, one after the other, and only
    those that overlap are a window's worth of state.
    """
    ts = rows.column(INTO_TS).to_numpy()
    gid, _ = group_ids(rows, list(window.group_by))
    order = np.lexsort((ts, gid))
    g, t = gid[order], ts[order]
    new = np.ones(len(t), dtype=bool)
    new[1:] = (g[1:] != g[:-1]) | (t[1:] - t[:-1] >= gap)
    ids = np.cumsum(new) - 1
    count = int(ids[-1]) + 1 if len(ids) else 0
    session = np.empty(len(t), dtype=np.int64)
    session[order] = ids
    first = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, ids, t)
    np.maximum.at(last, ids, t)
    open_at_once = _most_open(first, last + gap)
    if open_at_once > window.max_groups:
        raise MaxGroupsExceeded(
            f"window {window.name!r} has more than max_groups={window.max_groups} sessions of "
            f"{list(window.group_by)} open at once ({open_at_once}) in into times "
            f"[{int(t.min())}, {int(t.max()) + 1}); raise max_groups and restart "
            f"(the sessions are recomputed from {window.input!r}, nothing is lost)"
        )
    return session, first, last


def _most_open(starts: np.ndarray, ends: np.ndarray) -> int:
    """The most sessions ``[start, end)`` open at one into time: what a stream processor would hold
    as state, and what ``max_groups`` bounds (a session ends before one starting at its end)."""
    if not len(starts):
        return 0
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.lexsort((deltas, times))
    return int(np.cumsum(deltas[order]).max())
