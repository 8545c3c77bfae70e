"""A window's aggregation state: one row per group, merged batch by batch.

Aggregation is partial and streaming: every record batch becomes one *state row* per row, merged
with the window's state so far by group (``count`` and ``sum`` add, ``min`` and ``max`` keep the
extreme, ``avg`` keeps a sum and a count, ``first`` and ``last`` keep the row least and greatest in
``(_into_ts, _partition, _offset)``). The state holds one row per group, so a window's memory is
its groups, which ``max_groups`` bounds. The state lives only while one window is computed: no
window keeps anything between passes (see :mod:`reclock.runtime.windowing`).

Sums of integers are kept as :data:`EXACT_SUM` (decimal128(38, 0)), never in int64 or float64: no
value of a window can then wrap or fail to convert, and an ``avg`` is the correctly rounded
quotient of the exact sum by the count (see ``docs/design/20261124_exact_window_aggregates.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.errors import DefiniteSourceError
from reclock.runtime.windows import WINDOW_END, WINDOW_START, Aggregate, Window
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION

__all__ = ["EXACT_SUM", "MaxGroupsExceeded", "State", "SumOutOfRange", "window_schema", "zero_row"]

#: The order ``first`` and ``last`` follow over an output's rows.
LINEAGE_ORDER = (INTO_TS, PARTITION, OFFSET)
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
    if window.kind == "count":  # where the group's next window starts (window_counts.py)
        fields += [pa.field("_last_partition", pa.string()), pa.field("_last_offset", pa.int64())]
    return pa.schema(fields)


def zero_row(window: Window, schema: pa.Schema, start: int, end: int) -> pa.Table:
    """The row of a span with no rows (``empty = true``): counts 0, every other aggregate null,
    as SQL's aggregates over no rows are."""
    row: dict[str, object] = {WINDOW_START: start, WINDOW_END: end, INTO_TS: end - 1}
    row |= {agg.name: 0 if agg.function == "count" else None for agg in window.parsed}
    return pa.Table.from_pylist([row], schema=schema)


def _result_type(agg: Aggregate, schema: pa.Schema) -> pa.DataType:
    if agg.function == "count":
        return pa.int64()
    if agg.function == "avg":
        return pa.float64()
    if agg.function == "sum":
        return _sum_type(agg, schema)
    return schema.field(agg.column).type


def _sum_type(agg: Aggregate, schema: pa.Schema) -> pa.DataType:
    """What a ``sum`` or ``avg`` adds its values in: exact for integers (and a finer window's exact
    sums), float64 for floats."""
    kind = schema.field(agg.column).type
    return EXACT_SUM if pa.types.is_integer(kind) or pa.types.is_decimal(kind) else pa.float64()


class State:
    """The aggregation state of one window being computed: at most ``max_groups`` group rows.

    ``order`` is what ``first``/``last`` sort by: an output's lineage, or ``_into_ts`` alone over
    a finer window's table (one row per group and window there, so that order is total).
    """

    def __init__(self, window: Window, input_schema: pa.Schema, order: Sequence[str], bounds: str) -> None:
        self.window = window
        self.order = tuple(order)
        self._input = input_schema
        self._bounds = bounds
        self._first = tuple(f"__first{c}" for c in self.order)
        self._last = tuple(f"__last{c}" for c in self.order)
        self.rows: pa.Table | None = None

    def add(self, rows: pa.Table) -> None:
        """Merge ``rows`` of the input in; :class:`MaxGroupsExceeded` past the bound."""
        part = self._state_rows(rows)
        self.rows = self._merge(part if self.rows is None else pa.concat_tables([self.rows, part]))
        window = self.window
        if self.rows.num_rows > window.max_groups:
            raise MaxGroupsExceeded(
                f"window {window.name!r} {self._bounds} has more than max_groups={window.max_groups} groups "
                f"of {list(window.group_by)}; raise max_groups and restart (the window is recomputed from "
                f"{window.input!r}, nothing is lost)"
            )

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
            for name, first, last in zip(self.order, self._first, self._last, strict=True):
                columns[first] = columns[last] = rows.column(name)
        return pa.table(columns)

    def _merge(self, state: pa.Table) -> pa.Table:
        """One state row per group: the rows of ``state`` merged by their group columns."""
        group_by = list(self.window.group_by)
        gid, keys = group_ids(state, group_by)
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
            firsts = state.take(_pick(gid, state, self._first, "ascending"))
            lasts = state.take(_pick(gid, state, self._last, "descending"))
            for i, agg in enumerate(self.window.parsed):
                if agg.function in ("first", "last"):
                    out[f"__{i}"] = (firsts if agg.function == "first" else lasts).column(f"__{i}")
            out.update({c: firsts.column(c) for c in self._first})
            out.update({c: lasts.column(c) for c in self._last})
        return pa.table(out).select(state.column_names)

    def result(self, schema: pa.Schema, start: int, end: int) -> pa.Table:
        """The window's rows from its final state, in the table's ``schema``, ordered by group;
        ``_into_ts`` is ``end - 1``, the last into time the rows depend on."""
        if self.rows is None:
            return schema.empty_table()
        state = self.rows
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
            if value.type == EXACT_SUM and schema.field(agg.name).type == pa.int64():  # a table made before
                self._check_fits(agg, value, state)
            columns[agg.name] = value
        columns[INTO_TS] = pa.array(np.full(n, end - 1, dtype=np.int64))
        table = pa.table(columns).cast(schema)
        if not self.window.group_by:
            return table
        return table.sort_by([(c, "ascending") for c in self.window.group_by])  # nulls last

    def _check_fits(self, agg: Aggregate, value: pa.ChunkedArray, state: pa.Table) -> None:
        """A sum for the int64 column of an older table: refused, naming its group, if it does not fit."""
        low, high = pa.scalar(-(2**63), EXACT_SUM), pa.scalar(2**63 - 1, EXACT_SUM)
        fits = pc.and_(pc.greater_equal(value, low), pc.less_equal(value, high))
        outside = pc.indices_nonzero(pc.invert(pc.fill_null(fits, True)))
        if len(outside):
            at = outside[0].as_py()
            group = {c: state.column(c)[at].as_py() for c in self.window.group_by}
            raise SumOutOfRange(
                f"window {self.window.name!r} {self._bounds} group {group}: {agg.name!r} = {agg} is "
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


def group_ids(state: pa.Table, group_by: list[str]) -> tuple[np.ndarray, pa.Table]:
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
