"""Window definitions: windows over into time, complete by construction.

A :class:`Window` groups the rows of one append output (or of another window's table, ``from``)
into windows of into time and its ``group_by`` columns, and aggregates each group. Its ``kind``
says which windows:

- ``tumbling`` (``size_ms``): ``[k * size, (k + 1) * size)``, aligned to the epoch;
- ``hop`` (``size_ms``, ``slide_ms``): ``[k * slide, k * slide + size)``, overlapping;
- ``cumulate`` (``step_ms``, ``max_size_ms``): ``[b, b + j * step)`` for ``j = 1 .. max/step``
  in each tumbling ``[b, b + max)``: a growing prefix of it, emitted every step;
- ``session`` (``gap_ms``): per group, a run of rows each less than ``gap`` after the one before,
  ``[first, last + gap)``;
- ``count`` (``size``): per group, every ``size`` rows in ``(_into_ts, _partition, _offset)``
  order, emitted once its last row is in.

Each window ``[s, e)`` is emitted once the input's upper (its commit label + 1, see
``docs/concepts.md``) reaches ``e``, because from then on no row with an into time inside it can
ever land: every later row is stamped by a later binding. That is why no watermark is needed.
``having`` filters the emitted rows by a SQL predicate over their columns.

This module is the definition only (names, aggregates, validation), light enough for config
parsing; :mod:`reclock.runtime.window_kinds` enumerates each kind's windows,
:mod:`reclock.runtime.windowing` closes them and :mod:`reclock.persist.windows` keeps their tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reclock.envelope import APPEND
from reclock.errors import ConfigError

__all__ = [
    "AGGREGATES",
    "KINDS",
    "MAX_LENGTH_MS",
    "WINDOW_END",
    "WINDOW_START",
    "Aggregate",
    "Window",
    "check_windows",
    "parse_windows",
]

#: Columns of a window table besides the group and aggregate columns (and ``_into_ts``).
WINDOW_START = "_window_start"
WINDOW_END = "_window_end"

#: The aggregate functions a window computes; ``count(*)`` counts rows, ``count(col)`` non-nulls.
AGGREGATES = ("count", "sum", "min", "max", "avg", "first", "last")

#: The kinds of window, and the keys that size each (every one required, no other allowed).
KINDS: Mapping[str, tuple[str, ...]] = {
    "tumbling": ("size_ms",),
    "hop": ("size_ms", "slide_ms"),
    "cumulate": ("step_ms", "max_size_ms"),
    "session": ("gap_ms",),
    "count": ("size",),
}
_SIZES = ("size_ms", "slide_ms", "step_ms", "max_size_ms", "gap_ms", "size")

#: The longest length a window may have, in milliseconds: 1,000 years of 365.25 days. Span ends,
#: a session's ``last + gap`` and the labels a window table reaches (up to the upper plus twice a
#: length) are then far inside a 64-bit into time, so no arithmetic on them can wrap.
MAX_LENGTH_MS = 1_000 * 36_525 * 86_400_000 // 100

_CALL = re.compile(r"^\s*(\w+)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_KEYS = (
    "name",
    "kind",
    "output",
    "from",
    *_SIZES,
    "time_column",
    "allowed_lateness_ms",
    "group_by",
    "aggregates",
    "having",
    "empty",
    "max_groups",
)


@dataclass(frozen=True)
class Aggregate:
    """One aggregate column: ``name = function(column)``; ``column`` is ``None`` for ``count(*)``."""

    name: str
    function: str
    column: str | None

    @classmethod
    def parse(cls, name: str, text: str, where: str) -> Aggregate:
        """``"sum(price)"`` -> ``Aggregate(name, "sum", "price")``; errors name ``where``."""
        match = _CALL.match(text) if isinstance(text, str) else None
        if match is None:
            raise ConfigError(where, f"expected function(column) or count(*), got {text!r}")
        function, column = match.group(1).lower(), match.group(2)
        if function not in AGGREGATES:
            raise ConfigError(where, f"unknown aggregate {function!r} (known: {', '.join(AGGREGATES)})")
        if column == "*" and function != "count":
            raise ConfigError(where, f"{function}(*) is not an aggregate; only count(*) takes every row")
        return cls(name, function, None if column == "*" else column)

    def __str__(self) -> str:
        return f"{self.function}({self.column or '*'})"


@dataclass(frozen=True)
class Window:
    """A window definition over one output (or, with ``from_window``, over another window's table),
    written to its own Delta table.

    ``aggregates`` maps each result column to ``"function(column)"`` (``count(*)``, ``sum(price)``,
    ``first(bidder)``...). ``first`` and ``last`` take the value of the group's first and last row
    in into-time order, ties broken by source order (``_partition``, then ``_offset``), nulls
    included: the same rows give the same answer in any run. ``max_groups`` bounds the groups one
    window may hold in memory; a window with more fails the pipeline with an error naming it, and
    since windows are recomputed from their input table, raising the bound and restarting emits it
    whole (see ``docs/windows.md``). ``having`` is a SQL predicate over the emitted columns; a row
    it is not true for is not written. ``empty`` emits a row for a span with no rows too (counts
    0, other aggregates null), from the input's first row on, so a dashboard sees zeros.
    """

    name: str
    output: str | None
    size_ms: int | None = None
    aggregates: Mapping[str, str] = field(default_factory=dict)
    group_by: tuple[str, ...] = ()
    max_groups: int = 100_000
    kind: str = "tumbling"
    slide_ms: int | None = None
    step_ms: int | None = None
    max_size_ms: int | None = None
    gap_ms: int | None = None
    size: int | None = None
    having: str | None = None
    from_window: str | None = None
    empty: bool = False
    time_column: str | None = None
    allowed_lateness_ms: int = 0
    parsed: tuple[Aggregate, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"windows.{self.name}"
        if not isinstance(self.name, str) or not _IDENTIFIER.match(self.name):
            raise ConfigError("windows.name", f"{self.name!r} must be an identifier of at most 64 characters")
        if self.kind not in KINDS:
            raise ConfigError(f"{where}.kind", f"unknown kind {self.kind!r} (known: {', '.join(KINDS)})")
        for key in _SIZES:
            value = getattr(self, key)
            if key not in KINDS[self.kind]:
                if value is not None:
                    raise ConfigError(f"{where}.{key}", f"is not a setting of a {self.kind} window")
                continue
            if value is None:
                raise ConfigError(
                    f"{where}.{key}", f"missing (a {self.kind} window needs {', '.join(KINDS[self.kind])})"
                )
            _whole(f"{where}.{key}", value)
            if key.endswith("_ms") and value > MAX_LENGTH_MS:
                raise ConfigError(
                    f"{where}.{key}",
                    f"must be at most {MAX_LENGTH_MS} (1,000 years), got {value}: longer windows would overflow "
                    "the 64-bit into times of their ends",
                )
        _whole(f"{where}.max_groups", self.max_groups)
        if self.kind == "hop" and self.slide_ms > self.size_ms:  # type: ignore[operator]
            raise ConfigError(f"{where}.slide_ms", f"must be at most size_ms={self.size_ms} (rows between windows)")
        if self.kind == "cumulate" and self.max_size_ms % self.step_ms:  # type: ignore[operator]
            raise ConfigError(f"{where}.max_size_ms", f"must be a multiple of step_ms={self.step_ms}")
        if (self.output is None) == (self.from_window is None):
            raise ConfigError(f"{where}.output", "give either the output the window reads or from = another window")
        for key, value in (("output", self.output), ("from", self.from_window)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{where}.{key}", "must name what the window reads")
        if self.having is not None and (not isinstance(self.having, str) or not self.having.strip()):
            raise ConfigError(f"{where}.having", "must be a SQL predicate over the window's columns")
        if not isinstance(self.empty, bool):
            raise ConfigError(f"{where}.empty", f"must be true or false, got {self.empty!r}")
        if self.empty and (self.group_by or self.kind in ("session", "count")):
            raise ConfigError(
                f"{where}.empty", "needs a window of fixed spans without group_by (which groups would be empty?)"
            )
        if self.time_column is not None:
            if not isinstance(self.time_column, str) or not self.time_column:
                raise ConfigError(f"{where}.time_column", "must name a column of event times")
            if self.kind != "tumbling" or self.from_window is not None or self.empty:
                raise ConfigError(f"{where}.time_column", "event time is for tumbling windows over an output")
        if not isinstance(self.allowed_lateness_ms, int) or isinstance(self.allowed_lateness_ms, bool):
            raise ConfigError(
                f"{where}.allowed_lateness_ms", f"must be a whole number >= 0, got {self.allowed_lateness_ms!r}"
            )
        if self.allowed_lateness_ms < 0 or (self.allowed_lateness_ms and self.time_column is None):
            raise ConfigError(f"{where}.allowed_lateness_ms", "must be >= 0, and needs time_column")
        if self.allowed_lateness_ms > MAX_LENGTH_MS:
            raise ConfigError(f"{where}.allowed_lateness_ms", f"must be at most {MAX_LENGTH_MS} (1,000 years)")
        object.__setattr__(self, "group_by", tuple(self.group_by))
        if not all(isinstance(c, str) for c in self.group_by) or len(set(self.group_by)) < len(self.group_by):
            raise ConfigError(f"{where}.group_by", f"must be distinct column names, got {list(self.group_by)!r}")
        if not isinstance(self.aggregates, Mapping) or not self.aggregates:
            raise ConfigError(f"{where}.aggregates", 'give at least one, as name = "function(column)"')
        parsed = []
        for name, text in self.aggregates.items():
            if not _IDENTIFIER.match(str(name)) or str(name).startswith("_"):
                raise ConfigError(f"{where}.aggregates.{name}", "must be an identifier not starting with '_'")
            if name in self.group_by:
                raise ConfigError(f"{where}.aggregates.{name}", "is also a group_by column")
            parsed.append(Aggregate.parse(str(name), text, f"{where}.aggregates.{name}"))
        object.__setattr__(self, "aggregates", dict(self.aggregates))
        object.__setattr__(self, "parsed", tuple(parsed))

    @property
    def input(self) -> str:
        """What the window reads: its output's name, or ``windows/<name>`` for a ``from`` window."""
        return self.output if self.from_window is None else f"windows/{self.from_window}"  # type: ignore[return-value]

    @property
    def columns(self) -> tuple[str, ...]:
        """The input's columns the window reads (besides ``_into_ts`` and lineage)."""
        used = [*self.group_by, *(a.column for a in self.parsed if a.column is not None)]
        used += [self.time_column] if self.time_column is not None else []
        return tuple(dict.fromkeys(used))

    @property
    def ordered(self) -> bool:
        """Whether an aggregate depends on row order (``first``, ``last``): lineage is read too."""
        return any(a.function in ("first", "last") for a in self.parsed)

    @property
    def longest_ms(self) -> int:
        """The longest window of this kind, in into time: how far before its end it reads."""
        lengths = {"cumulate": self.max_size_ms, "session": self.gap_ms}
        return lengths.get(self.kind, self.size_ms)  # type: ignore[return-value]

    def window_of(self, into_ts: int) -> int:
        """Start of the tumbling window holding ``into_ts``."""
        return into_ts // self.longest_ms * self.longest_ms

    def to_dict(self) -> dict[str, Any]:
        """The definition as TOML says it (stored with the pipeline and in the window table).

        A tumbling window without ``having`` over an output says exactly what it said before the
        other kinds existed: its table's stored definition must still match.
        """
        out: dict[str, Any] = {"name": self.name}
        if self.kind != "tumbling":
            out["kind"] = self.kind
        out |= {"output": self.output} if self.from_window is None else {"from": self.from_window}
        out |= {key: getattr(self, key) for key in KINDS[self.kind]}
        out |= {"group_by": list(self.group_by), "aggregates": dict(self.aggregates)}
        if self.having is not None:
            out["having"] = self.having
        if self.empty:
            out["empty"] = True
        if self.time_column is not None:
            out |= {"time_column": self.time_column, "allowed_lateness_ms": self.allowed_lateness_ms}
        out["max_groups"] = self.max_groups
        return out


def _whole(where: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(where, f"must be a whole number >= 1, got {value!r}")


def parse_windows(raw: Any, file: str | None = None) -> tuple[Window, ...]:
    """``[[windows]]`` tables of a definition; a mistake is one ConfigError naming the field."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(w, Mapping) for w in raw):
        raise ConfigError("windows", "must be an array of tables ([[windows]])", file=file)
    windows = []
    for i, section in enumerate(raw):
        label = section.get("name", i)
        for key in section:
            if key not in _KEYS:
                raise ConfigError(f"windows.{label}.{key}", f"unknown key (known: {', '.join(_KEYS)})", file=file)
        kind = section.get("kind", "tumbling")
        for key in ("name", "aggregates", *KINDS.get(kind, ())):
            if key not in section:
                raise ConfigError(f"windows.{label}.{key}", "missing", file=file)
        if "output" not in section and "from" not in section:
            raise ConfigError(f"windows.{label}.output", "missing (or from = another window)", file=file)
        group_by = section.get("group_by", [])
        if not isinstance(group_by, list):
            raise ConfigError(f"windows.{label}.group_by", "must be a list of column names", file=file)
        try:
            windows.append(
                Window(
                    section["name"],
                    section.get("output"),
                    section.get("size_ms"),
                    section["aggregates"],
                    tuple(group_by),
                    section.get("max_groups", 100_000),
                    kind=kind,
                    slide_ms=section.get("slide_ms"),
                    step_ms=section.get("step_ms"),
                    max_size_ms=section.get("max_size_ms"),
                    gap_ms=section.get("gap_ms"),
                    size=section.get("size"),
                    having=section.get("having"),
                    from_window=section.get("from"),
                    empty=section.get("empty", False),
                    time_column=section.get("time_column"),
                    allowed_lateness_ms=section.get("allowed_lateness_ms", 0),
                )
            )
        except ConfigError as exc:
            raise ConfigError(exc.field, exc.reason, file=file) from None
    names = [w.name for w in windows]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"windows.{name}", "is defined twice", file=file)
    return tuple(windows)


def check_windows(windows: Iterable[Window], outputs: Sequence[Any]) -> None:
    """Each window reads an append output (or an earlier window) that has the columns it names,
    of types it can aggregate, and its ``having`` is a predicate that plans over its columns.

    ``outputs`` are the pipeline's :class:`~reclock.sources.base.Output` values as it writes them:
    ``_errors`` included, shaped and routed outputs with the columns their transform returns
    (:func:`~reclock.runtime.shaping.route_outputs`), so ``create`` refuses what ``start`` would.
    An upsert output is refused: its rows are replaced by later ones, so a closed window's content
    would depend on when it was computed, and a window must be a pure function of the timeline.
    """
    from reclock.runtime.window_state import window_schema

    by_name = {o.name: o for o in outputs}
    tables: dict[str, tuple[Window, Any]] = {}
    windows = list(windows)
    names = {w.name for w in windows}
    for window in windows:
        where = f"windows.{window.name}"
        if window.time_column is not None and f"{window.name}_late" in names:
            raise ConfigError(where, f"its late rows' table is windows/{window.name}_late: rename that window")
        if window.from_window is not None:
            schema = _check_tilt(window, tables)
        else:
            output = by_name.get(window.output)
            if output is None:
                known = ", ".join(sorted(by_name)) or "none"
                raise ConfigError(f"{where}.output", f"the pipeline has no output {window.output!r} (known: {known})")
            if output.envelope != APPEND:
                raise ConfigError(
                    f"{where}.output",
                    f"{window.output!r} is an {output.envelope} output; windows read append outputs only "
                    "(a replaced row would change a window already emitted)",
                )
            schema = output.schema
        _check_columns(
            window, schema, f"output {window.output!r}" if window.output else f"window {window.from_window!r}"
        )
        emitted = window_schema(window, schema)
        if window.having is not None:
            _check_having(window, emitted)
        tables[window.name] = (window, emitted)


def _check_columns(window: Window, schema: Any, what: str) -> None:
    import pyarrow as pa

    where = f"windows.{window.name}"
    for column in window.columns:
        if column not in schema.names:
            has = ", ".join(schema.names) or "none"
            raise ConfigError(f"{where}", f"{what} has no column {column!r} (it has: {has})")
    if window.time_column is not None:
        kind = schema.field(window.time_column).type
        if not (pa.types.is_integer(kind) or pa.types.is_timestamp(kind)):
            raise ConfigError(f"{where}.time_column", f"must be epoch milliseconds or a timestamp, not {kind}")
    for agg in window.parsed:
        if agg.column is None or agg.function in ("count", "first", "last"):
            continue
        kind = schema.field(agg.column).type
        exact = pa.types.is_decimal(kind) and kind.scale == 0  # a finer window's sums
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or exact
        nested = pa.types.is_nested(kind) or pa.types.is_dictionary(kind)
        if (agg.function in ("sum", "avg") and not numeric) or nested:
            raise ConfigError(
                f"{where}.aggregates.{agg.name}", f"{agg} cannot aggregate column {agg.column!r} of type {kind}"
            )


def _check_tilt(window: Window, earlier: Mapping[str, tuple[Window, Any]]) -> Any:
    """A ``from`` window reads a finer tumbling window defined before it, whose windows tile its
    own exactly, so each of its windows is the union of whole finer ones; the finer's schema."""
    where = f"windows.{window.name}.from"
    if window.from_window not in earlier:
        known = ", ".join(earlier) or "none"
        raise ConfigError(where, f"no window {window.from_window!r} is defined before it (known: {known})")
    finer, schema = earlier[window.from_window]  # type: ignore[index]
    if window.kind in ("session", "count"):
        raise ConfigError(where, f"a {window.kind} window reads an output: it needs every row")
    if finer.kind != "tumbling" or finer.having is not None or finer.time_column is not None:
        raise ConfigError(
            where, f"window {finer.name!r} must be a tumbling window of into time without having to feed another"
        )
    lengths = [getattr(window, key) for key in KINDS[window.kind]]
    if any(n % finer.size_ms for n in lengths):
        raise ConfigError(where, f"the window's sizes must be multiples of {finer.name!r}'s size_ms={finer.size_ms}")
    means = {a.name for a in finer.parsed if a.function == "avg"}
    for agg in window.parsed:
        if agg.function == "avg" and agg.column in means:
            raise ConfigError(
                f"windows.{window.name}.aggregates.{agg.name}",
                f"{agg} over {finer.name!r}'s avg would be a mean of means, not the mean of the rows: keep a sum "
                f"and a count in {finer.name!r} and divide",
            )
    if window.ordered and tuple(window.group_by) != tuple(finer.group_by):
        raise ConfigError(
            where, f"first/last over {finer.name!r} need its group_by {list(finer.group_by)} (one row per window)"
        )
    return schema


def _check_having(window: Window, emitted: Any) -> None:
    """``having`` plans as a filter over the window's columns, with no function whose value is
    not fixed by its arguments: a replay must keep exactly the rows the first run kept."""
    from reclock.runtime.shaping.engine import INPUT, inspect

    where = f"windows.{window.name}.having"
    try:
        found = inspect(f"SELECT * FROM {INPUT} WHERE ({window.having})", emitted.empty_table())
    except Exception as exc:  # the engine's own message: an unknown column, a syntax error
        raise ConfigError(where, f"does not plan over the window's columns: {str(exc).splitlines()[0]}") from None
    if found.across is not None:
        raise ConfigError(where, f"must judge each row alone, found {found.across}")
    if found.unrepeatable:
        raise ConfigError(where, f"calls {', '.join(found.unrepeatable)}, whose value a replay may not repeat")
