"""Window definitions: tumbling windows over into time, complete by construction.

A :class:`Window` groups the rows of one append output by ``floor(_into_ts / size_ms)`` and its
``group_by`` columns, and aggregates each group. Window ``k`` covers into times
``[k * size_ms, (k + 1) * size_ms)``; it is emitted once the output's upper (its commit label + 1,
see ``docs/concepts.md``) reaches its end, because from then on no row with an into time inside it
can ever land: every later row is stamped by a later binding. That is why no watermark is needed.

This module is the definition only (names, aggregates, validation), light enough for config
parsing; :mod:`reclock.runtime.windowing` closes windows and :mod:`reclock.persist.windows` keeps their
tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reclock.errors import ConfigError

__all__ = ["AGGREGATES", "WINDOW_END", "WINDOW_START", "Aggregate", "Window", "check_windows", "parse_windows"]

#: Columns of a window table besides the group and aggregate columns (and ``_into_ts``).
WINDOW_START = "_window_start"
WINDOW_END = "_window_end"

#: The aggregate functions a window computes; ``count(*)`` counts rows, ``count(col)`` non-nulls.
AGGREGATES = ("count", "sum", "min", "max", "avg", "first", "last")

_CALL = re.compile(r"^\s*(\w+)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_KEYS = ("name", "output", "size_ms", "group_by", "aggregates", "max_groups")


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
    """A tumbling window over one output, written to its own Delta table.

    ``aggregates`` maps each result column to ``"function(column)"`` (``count(*)``, ``sum(price)``,
    ``first(bidder)``...). ``first`` and ``last`` take the value of the group's first and last row
    in into-time order, ties broken by source order (``_partition``, then ``_offset``), nulls
    included: the same rows give the same answer in any run. ``max_groups`` bounds the groups one
    window may hold in memory; a window with more fails the pipeline with an error naming it, and
    since windows are recomputed from the output table, raising the bound and restarting emits it
    whole (see ``docs/windows.md``).
    """

    name: str
    output: str
    size_ms: int
    aggregates: Mapping[str, str]
    group_by: tuple[str, ...] = ()
    max_groups: int = 100_000
    parsed: tuple[Aggregate, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"windows.{self.name}"
        if not isinstance(self.name, str) or not _IDENTIFIER.match(self.name):
            raise ConfigError("windows.name", f"{self.name!r} must be an identifier of at most 64 characters")
        for key, value in (("size_ms", self.size_ms), ("max_groups", self.max_groups)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{where}.{key}", f"must be a whole number >= 1, got {value!r}")
        if not isinstance(self.output, str) or not self.output:
            raise ConfigError(f"{where}.output", "must name the output the window reads")
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
    def columns(self) -> tuple[str, ...]:
        """The output's columns the window reads (besides ``_into_ts`` and lineage)."""
        used = [*self.group_by, *(a.column for a in self.parsed if a.column is not None)]
        return tuple(dict.fromkeys(used))

    @property
    def ordered(self) -> bool:
        """Whether an aggregate depends on row order (``first``, ``last``): lineage is read too."""
        return any(a.function in ("first", "last") for a in self.parsed)

    def window_of(self, into_ts: int) -> int:
        """Start of the window holding ``into_ts``."""
        return into_ts // self.size_ms * self.size_ms

    def to_dict(self) -> dict[str, Any]:
        """The definition as TOML says it (stored with the pipeline and in the window table)."""
        return {
            "name": self.name,
            "output": self.output,
            "size_ms": self.size_ms,
            "group_by": list(self.group_by),
            "aggregates": dict(self.aggregates),
            "max_groups": self.max_groups,
        }


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
        for key in ("name", "output", "size_ms", "aggregates"):
            if key not in section:
                raise ConfigError(f"windows.{label}.{key}", "missing", file=file)
        group_by = section.get("group_by", [])
        if not isinstance(group_by, list):
            raise ConfigError(f"windows.{label}.group_by", "must be a list of column names", file=file)
        try:
            windows.append(
                Window(
                    section["name"],
                    section["output"],
                    section["size_ms"],
                    section["aggregates"],
                    tuple(group_by),
                    section.get("max_groups", 100_000),
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
    """Each window reads an append output that has the columns it names, of types it can aggregate.

    ``outputs`` are the pipeline's :class:`~reclock.sources.base.Output` values as it writes them:
    ``_errors`` included, shaped and routed outputs with the columns their transform returns
    (:func:`~reclock.runtime.shaping.route_outputs`), so ``create`` refuses what ``start`` would.
    An upsert output is refused: its rows are replaced by later ones, so a closed window's content
    would depend on when it was computed, and a window must be a pure function of the timeline.
    """
    import pyarrow as pa

    by_name = {o.name: o for o in outputs}
    for window in windows:
        where = f"windows.{window.name}"
        output = by_name.get(window.output)
        if output is None:
            known = ", ".join(sorted(by_name)) or "none"
            raise ConfigError(f"{where}.output", f"the pipeline has no output {window.output!r} (known: {known})")
        if output.envelope != "append":
            raise ConfigError(
                f"{where}.output",
                f"{window.output!r} is an {output.envelope} output; windows read append outputs only "
                "(a replaced row would change a window already emitted)",
            )
        schema = output.schema
        for column in window.columns:
            if column not in schema.names:
                has = ", ".join(schema.names) or "none"
                raise ConfigError(f"{where}", f"output {window.output!r} has no column {column!r} (it has: {has})")
        for agg in window.parsed:
            if agg.column is None or agg.function in ("count", "first", "last"):
                continue
            kind = schema.field(agg.column).type
            numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
            nested = pa.types.is_nested(kind) or pa.types.is_dictionary(kind)
            if (agg.function in ("sum", "avg") and not numeric) or nested:
                raise ConfigError(
                    f"{where}.aggregates.{agg.name}", f"{agg} cannot aggregate column {agg.column!r} of type {kind}"
                )
