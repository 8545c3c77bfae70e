"""Count windows: per group, every ``size`` rows in the input's own order, emitted when complete.

A group's rows are ordered by ``(_into_ts, _partition, _offset)``: rows of one into time are all
in the output together, so that order never depends on how batches were read. Window ``j`` of a
group is its rows ``j * size .. (j + 1) * size - 1``; it is complete, for good, once its last row
is in, and emitted in the pass over that row's into time. ``_window_start`` is its first row's
into time, ``_window_end`` its last row's plus one, ``_into_ts`` its last row's, and
``_last_partition``/``_last_offset`` that row's coordinates.

No state: where a group's next window starts is read back. A pass over into times ``[lo, hi)``
takes the groups with new rows, finds each one's last emitted window in the window table (moving
back, doubling, from ``lo``; a group with none starts at the input's first row), and reads the
rows after it: the rows of the windows it completes, plus the other groups' rows of that span. A
group whose open window began long ago is read back from there, as a long session is. More than
``max_groups`` groups with new rows in one pass fail it, nothing written.
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

__all__ = ["LAST_OFFSET", "LAST_PARTITION", "count_rows"]

LAST_PARTITION = "_last_partition"
LAST_OFFSET = "_last_offset"
_WINDOW = "__window"


def count_rows(
    window: Window,
    scan: InputScan,
    emitted: InputScan,
    input_schema: pa.Schema,
    schema: pa.Schema,
    lo: IntoTime,
    hi: IntoTime,
) -> pa.Table:
    """The count windows completed by the rows of into times ``[lo, hi)``, in the table's
    ``schema``; ``emitted`` scans the window table itself (both scans refreshed already)."""
    size, keys = ms(window, "size"), list(window.group_by)
    new = _read(scan, lo, hi, [*keys, INTO_TS])
    if new is None:
        return schema.empty_table()
    touched = new.select(keys).group_by(keys, use_threads=False).aggregate([]) if keys else new.select([]).slice(0, 1)
    if touched.num_rows > window.max_groups:
        raise MaxGroupsExceeded(
            f"window {window.name!r} has more than max_groups={window.max_groups} groups of {keys} with new "
            f"rows in into times [{lo}, {hi}); raise max_groups and restart (recomputed from "
            f"{window.input!r}, nothing is lost)"
        )
    last = _last_emitted(window, emitted, touched, lo)  # per touched group: (ts, partition, offset) or None
    starts = [c[0] for c in last if c is not None]
    since = min(
        [*starts, *([scan.least] if any(c is None for c in last) and scan.least is not None else [])], default=lo
    )
    order = LINEAGE_ORDER
    rows = _read(scan, since, hi, list(dict.fromkeys([*window.columns, *order])))
    assert rows is not None
    gid = _match(rows, touched, keys)
    after = _after(rows, gid, last)
    rows, gid = rows.filter(pa.array(after)), gid[after]
    # Step: per group, in order, the index of each row; complete windows of size rows.
    ts, part, off = (rows.column(c).to_numpy(zero_copy_only=False) for c in order)
    sort = np.lexsort((off, part.astype(str), ts, gid))
    g = gid[sort]
    first_of_group = np.ones(len(g), dtype=bool)
    first_of_group[1:] = g[1:] != g[:-1]
    position = np.arange(len(g)) - np.maximum.accumulate(np.where(first_of_group, np.arange(len(g)), 0))
    counts = np.bincount(g, minlength=touched.num_rows) if len(g) else np.zeros(touched.num_rows, np.int64)
    complete_upto = counts[g] // size * size
    keep_sorted = position < complete_upto
    if not keep_sorted.any():
        return schema.empty_table()
    picked = sort[keep_sorted]
    window_id = g[keep_sorted] * (2**31) + position[keep_sorted] // size
    chosen = rows.take(pa.array(picked)).append_column(_WINDOW, pa.array(window_id))
    by_window = dataclasses.replace(window, group_by=(_WINDOW, *keys), having=None, max_groups=len(picked))
    state = State(by_window, chosen.schema, order, f"count windows of [{lo}, {hi})")
    state.add(chosen)
    own = [f for f in window_schema(by_window, chosen.schema) if f.name not in (LAST_PARTITION, LAST_OFFSET)]
    inner = pa.schema([*own, pa.field(INTO_TS, pa.int64())])
    done = state.result(inner, 0, 0)
    firsts = chosen.group_by(_WINDOW, use_threads=False).aggregate([(INTO_TS, "min")])
    ends = {
        w: t
        for w, t in zip(firsts.column(_WINDOW).to_pylist(), firsts.column(f"{INTO_TS}_min").to_pylist(), strict=True)
    }
    lasts = chosen.take(pa.array(np.flatnonzero(np.r_[window_id[1:] != window_id[:-1], True])))
    tails = {w: (t, p, o) for w, t, p, o in zip(*(lasts.column(c).to_pylist() for c in (_WINDOW, *order)), strict=True)}
    ids = done.column(_WINDOW).to_pylist()
    done = done.set_column(0, WINDOW_START, pa.array([ends[w] for w in ids], pa.int64()))
    done = done.set_column(1, WINDOW_END, pa.array([tails[w][0] + 1 for w in ids], pa.int64()))
    done = done.set_column(
        done.schema.get_field_index(INTO_TS), INTO_TS, pa.array([tails[w][0] for w in ids], pa.int64())
    )
    done = done.append_column(LAST_PARTITION, pa.array([tails[w][1] for w in ids], pa.string()))
    done = done.append_column(LAST_OFFSET, pa.array([tails[w][2] for w in ids], pa.int64()))
    done = done.drop_columns([_WINDOW]).select(schema.names).cast(schema)
    return done.sort_by([(WINDOW_END, "ascending"), *((c, "ascending") for c in keys)])


def _read(scan: InputScan, lo: IntoTime, hi: IntoTime, columns: list[str]) -> pa.Table | None:
    batches = list(scan.batches(lo, hi, columns))
    return pa.Table.from_batches(batches).select(columns) if batches else None


def _match(rows: pa.Table, touched: pa.Table, keys: list[str]) -> np.ndarray:
    """Per row of ``rows``, the index of its group in ``touched``; -1 for a group not there."""
    if not keys:
        return np.zeros(rows.num_rows, dtype=np.int64)
    both = pa.concat_tables([touched.select(keys), rows.select(keys).cast(touched.select(keys).schema)])
    gid, _ = group_ids(both, keys)
    index = np.full(int(gid.max()) + 1, -1, dtype=np.int64)
    index[gid[: touched.num_rows]] = np.arange(touched.num_rows)
    return index[gid[touched.num_rows :]]


def _after(rows: pa.Table, gid: np.ndarray, last: list[tuple | None]) -> np.ndarray:
    """Rows of a touched group that come after its last emitted window's last row."""
    keep = gid >= 0
    ts, part, off = (rows.column(c).to_pylist() for c in LINEAGE_ORDER)
    for i in np.flatnonzero(keep):
        mark = last[gid[i]]
        if mark is not None and (ts[i], part[i], off[i]) <= mark:
            keep[i] = False
    return keep


def _last_emitted(window: Window, emitted: InputScan, touched: pa.Table, lo: IntoTime) -> list[tuple | None]:
    """Per touched group, the coordinates of the last row of its last emitted window."""
    keys = list(window.group_by)
    found: list[tuple | None] = [None] * touched.num_rows
    least = emitted.least
    if least is None:
        return found
    begin, step = lo, 1024
    while True:
        begin = max(begin - step, least)
        rows = _read(emitted, begin, lo, [*keys, INTO_TS, LAST_PARTITION, LAST_OFFSET])
        if rows is not None:
            gid = _match(rows, touched, keys)
            marks = zip(*(rows.column(c).to_pylist() for c in (INTO_TS, LAST_PARTITION, LAST_OFFSET)), strict=True)
            for g, mark in zip(gid, marks, strict=True):
                if g >= 0 and (found[g] is None or mark > found[g]):
                    found[g] = mark
        if all(f is not None for f in found) or begin <= least:
            return found
        step *= 2
