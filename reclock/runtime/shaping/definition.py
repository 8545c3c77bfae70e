"""Shaped outputs: what a transform is, where its rows come from, and the checks made before a run.

A :class:`Shape` is an output table whose rows are a transform of a *source output*'s decoded
rows: a SQL ``SELECT ... FROM input WHERE ...`` or a Python function over Arrow batches. Named
after its source output it shapes that output in place; under another name (``input`` set) it is
one more route of the same records, so one record may land in several outputs, each with its own
transform (Tremor's ``select ... into``). :func:`route_outputs` resolves the definitions against
the source's outputs once, on the driver: every mistake is a :class:`ConfigError` naming
``outputs.<name>.<field>``, raised before anything runs.

What a transform sees and may change:

* ``input`` has the source output's columns and the record's lineage, ``_partition``, ``_offset``
  and ``_into_ts``, which it may read (filter on them, say) but never change: the shaped row gets
  them from its record. A SQL transform is rewritten to carry its rows' identity, the row number
  :data:`ROW` of its input (``SELECT __reclock_row AS __reclock_id, ...``), free to match; a
  Python function must return the ``_partition`` and ``_offset`` of each row it keeps, matched
  to its records by a join. Lineage columns in a result are dropped, other result columns
  starting with ``_`` are refused.
* Every timestamp a transform yields, nested or not, is stored in **microseconds**
  (:func:`stored_type`): DataFusion computes in nanoseconds (``CAST(s AS TIMESTAMP)``), and a
  nanosecond column makes the Delta table require the ``timestampNanos`` reader feature, which
  polars, DuckDB and delta-rs's own reader refuse. Sub-microsecond digits are dropped (each
  instant floored to its microsecond). A zoned timestamp stays zoned, as the same instant in UTC
  (Delta's ``timestamp`` has no other zone), a naive one stays naive (``timestamp_ntz``).
* A transform maps each record to at most one row: a result row whose identity is not a record
  of its batch, or appears twice, is a broken transform (an aggregate, a join), refused.
* A transform is deterministic: a replay after a crash must write the same rows. SQL calling a
  function whose value is not fixed by its arguments is refused here, judged on DataFusion's plan
  by the volatility DataFusion declares (volatile: ``random()``, ``uuid()``; stable: ``now()``,
  ``current_date``); a Python function must be deterministic by contract (see
  ``docs/shaping.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.envelope import APPEND
from reclock.errors import ConfigError
from reclock.persist.lake import NAME_PATTERN
from reclock.runtime.shaping.engine import inspect, run_sql
from reclock.sources.base import ERRORS, LINEAGE_FIELDS, Output
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION

__all__ = [
    "ID",
    "ROW",
    "Route",
    "Shape",
    "Transform",
    "input_schema",
    "own_schema",
    "route_outputs",
    "shapes_from_toml",
    "shapes_to_toml",
    "stored",
    "stored_type",
    "with_rows",
]

#: A Python transform: a batch of decoded rows (with lineage) to the rows to keep, with lineage.
Transform = Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table]

#: The row number of each input row in its batch, and the name a rewritten SQL transform's result
#: carries it under as the identity of each row (``SELECT *`` brings :data:`ROW` along as well).
ROW, ID = "__reclock_row", "__reclock_id"
_LINEAGE = (PARTITION, OFFSET, INTO_TS)

_SELECT = re.compile(r"^\s*select\s", re.IGNORECASE)
_RESERVED = re.compile(r"__reclock", re.IGNORECASE)


@dataclass(frozen=True)
class Shape:
    """An output whose rows are ``input``'s decoded rows through ``sql`` or ``function``.

    ``input`` is the source output it reads (default: ``name``, shaping that output in place).
    Exactly one of ``sql`` and ``function`` is set. ``schema`` (the output's own columns) is
    derived by running the transform on an empty batch; give it when the function cannot run on
    one. A function must be picklable (Spark ships it to its tasks) and deterministic.
    """

    name: str
    input: str | None = None
    sql: str | None = None
    function: Transform | None = field(default=None, compare=False)
    schema: pa.Schema | None = None

    @property
    def source_output(self) -> str:
        return self.input or self.name


@dataclass(frozen=True)
class Route:
    """Where a source output's rows go: ``output``, through ``shape`` (``None``: as read).
    ``query`` is the SQL actually run (the user's, carrying the rows' identity)."""

    output: str
    shape: Shape | None = None
    query: str | None = None
    schema: pa.Schema | None = None  # the output's own columns, for a shaped output
    #: What the transform reads (:func:`input_schema`): a batch is conformed to it first, so a
    #: source that breaks its contract fails the batch instead of sending every row to ``_errors``.
    input: pa.Schema | None = None


def route_outputs(
    outputs: Mapping[str, Output], shapes: Sequence[Shape]
) -> tuple[dict[str, Output], dict[str, tuple[Route, ...]]]:
    """The pipeline's outputs with ``shapes`` applied, and the routes of every shaped source
    output (a source output no shape reads keeps its rows as read, and has no entry)."""
    resolved = dict(outputs)
    routes: dict[str, list[Route]] = {}
    names: set[str] = set()
    for shape in shapes:
        where = f"outputs.{shape.name}"
        if not isinstance(shape.name, str) or not NAME_PATTERN.match(shape.name) or shape.name.startswith("_"):
            raise ConfigError(where, "an output name is an identifier not starting with '_'")
        if shape.name in names:
            raise ConfigError(where, "is declared twice")
        names.add(shape.name)
        source = outputs.get(shape.source_output)
        if source is None or shape.source_output == ERRORS:
            known = ", ".join(sorted(n for n in outputs if n != ERRORS))
            raise ConfigError(f"{where}.from", f"the source has no output {shape.source_output!r} (it has: {known})")
        if source.envelope != APPEND:
            raise ConfigError(
                f"{where}.from", f"output {source.name!r} is {source.envelope}: only append outputs are shaped"
            )
        if shape.input not in (None, shape.name) and shape.name in outputs:
            raise ConfigError(where, f"is a source output already; shape it in place without 'from = {shape.input!r}'")
        route = _resolve(shape, source, where)
        routes.setdefault(source.name, []).append(route)
        resolved[shape.name] = Output(shape.name, route.schema)
    for name, taken in routes.items():
        if not any(route.output == name for route in taken):
            taken.insert(0, Route(name))  # shaped only elsewhere: the source output still lands as read
    return resolved, {name: tuple(taken) for name, taken in routes.items()}


def input_schema(source: Output) -> pa.Schema:
    """What a transform of ``source`` sees: lineage, the output's columns, then ``_into_ts``."""
    return pa.schema([*LINEAGE_FIELDS, *source.schema, pa.field(INTO_TS, pa.int64(), nullable=False)])


def _resolve(shape: Shape, source: Output, where: str) -> Route:
    if (shape.sql is None) == (shape.function is None):
        raise ConfigError(f"{where}.sql", "give exactly one transform: sql, or a Python function")
    empty = input_schema(source).empty_table()
    if shape.sql is not None:
        field_name = f"{where}.sql"
        if not isinstance(shape.sql, str) or not _SELECT.match(shape.sql):
            raise ConfigError(field_name, "must be one SELECT ... FROM input [WHERE ...]")
        if _RESERVED.search(shape.sql):
            raise ConfigError(field_name, "names starting with __reclock are reclock's own")
        try:
            plan = inspect(shape.sql, empty)
        except Exception as exc:  # the engine's own message says what is wrong with the query
            raise ConfigError(field_name, _first_line(exc)) from None
        if plan.across is not None:
            raise ConfigError(
                field_name,
                f"{plan.across} in the query: a transform computes each row from its record alone (SELECT ... "
                "FROM input WHERE ...), so that how records are grouped into batches never changes a row",
            )
        if plan.unrepeatable:
            raise ConfigError(
                field_name,
                f"{plan.unrepeatable[0]}() is not deterministic (DataFusion declares it volatile or stable): a "
                "replay after a crash would write other rows (exactly once needs the same rows every time)",
            )
        query = _SELECT.sub(f"SELECT {ROW} AS {ID}, ", shape.sql, count=1)
        try:
            result = run_sql(query, with_rows(empty))
        except Exception as exc:
            if _RESERVED.search(str(exc)):  # the rewrite's identity column is out of its reach
                raise ConfigError(field_name, "must select FROM input itself, not from a subquery") from None
            raise ConfigError(field_name, _first_line(exc)) from None
        own = own_schema(result.schema, (ID,), field_name)
        return Route(shape.name, shape, query, _given(shape.schema) or own, empty.schema)
    field_name = f"{where}.function"
    if shape.schema is not None:
        return Route(shape.name, shape, None, _given(shape.schema), empty.schema)
    try:
        result = shape.function(_empty_batch(empty.schema))  # type: ignore[misc]
    except Exception as exc:
        message = f"fails on an empty batch ({_first_line(exc)}); give the output's schema"
        raise ConfigError(field_name, message) from None
    own = own_schema(_schema_of(result, field_name), (PARTITION, OFFSET), field_name)
    return Route(shape.name, shape, None, own, empty.schema)


def with_rows(table: pa.Table) -> pa.Table:
    """``table`` with its row numbers as :data:`ROW`: the input a rewritten SQL transform reads."""
    return table.append_column(
        pa.field(ROW, pa.int64(), nullable=False), pa.array(np.arange(table.num_rows, dtype=np.int64))
    )


def own_schema(result: pa.Schema, identity: tuple[str, ...], where: str) -> pa.Schema:
    """A result's own columns: identity and lineage dropped, every column nullable, of the type
    the output table stores (:func:`stored_type`)."""
    missing = [name for name in identity if name not in result.names]
    if missing:
        raise ConfigError(where, f"the result lacks {missing[0]!r}: a transform keeps each row's lineage")
    fields = []
    for f in result:
        if f.name in identity or f.name in _LINEAGE or f.name in (ID, ROW):
            continue
        if f.name.startswith("_"):
            raise ConfigError(where, f"result column {f.name!r}: names starting with '_' are reclock's")
        if pa.types.is_null(f.type):
            raise ConfigError(where, f"result column {f.name!r} has no type (a bare NULL?): cast it")
        fields.append(pa.field(f.name, stored_type(f.type)))
    return pa.schema(fields)


def _given(schema: pa.Schema | None) -> pa.Schema | None:
    return None if schema is None else pa.schema([f.with_type(stored_type(f.type)) for f in schema])


def stored_type(kind: pa.DataType) -> pa.DataType:
    """The type an output table stores for a result column of type ``kind``: string and binary
    views as plain types, and every timestamp in it, nested or not, in microseconds, zoned in UTC
    or naive (the only timestamps a Delta table holds without the ``timestampNanos`` feature)."""
    if pa.types.is_string_view(kind) or pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_binary_view(kind) or pa.types.is_large_binary(kind):
        return pa.binary()
    return _timestamps(kind, lambda t: pa.timestamp("us", None if t.tz is None else "UTC"))


def stored(column: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``column`` as ``target``, its :func:`stored_type`: nanoseconds floored to their microsecond
    (the only loss allowed), then a safe cast (seconds that overflow microseconds raise)."""
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([_floored(chunk) for chunk in column.chunks], column.type).cast(target)
    return _floored(column).cast(target)


def _floored(array: pa.Array) -> pa.Array:
    """``array`` with every nanosecond timestamp in it, at any depth, floored to its microsecond:
    the instant just before 1970 stays in 1969 (Arrow's own cast would truncate towards zero)."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        if kind.unit != "ns":
            return array
        return pc.floor_temporal(array.view(pa.timestamp("ns")), unit="microsecond").view(kind)
    if not pa.types.is_nested(kind):
        return array
    array = pa.concat_arrays([array])  # at offset 0, its children cut to the values it holds
    if pa.types.is_struct(kind):
        own, children = array.buffers()[:1], [array.field(i) for i in range(kind.num_fields)]
    else:  # a list, large list, fixed-size list or map: validity (and offsets), then its values
        own, children = array.buffers()[: 1 if pa.types.is_fixed_size_list(kind) else 2], [array.values]
    return pa.Array.from_buffers(kind, len(array), own, array.null_count, 0, [_floored(c) for c in children])


def _timestamps(kind: pa.DataType, convert: Callable[[pa.TimestampType], pa.DataType]) -> pa.DataType:
    """``kind`` with every timestamp type in it, at any depth, replaced by ``convert`` of it."""
    if pa.types.is_timestamp(kind):
        return convert(kind)
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_timestamps(f.type, convert)) for f in kind])
    if pa.types.is_map(kind):
        key, item = kind.key_field, kind.item_field
        return pa.map_(key.with_type(_timestamps(key.type, convert)), item.with_type(_timestamps(item.type, convert)))
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(kind.value_field.with_type(_timestamps(kind.value_type, convert)), kind.list_size)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        make = pa.list_ if pa.types.is_list(kind) else pa.large_list
        return make(kind.value_field.with_type(_timestamps(kind.value_type, convert)))
    return kind


def _schema_of(result: object, where: str) -> pa.Schema:
    if not isinstance(result, pa.RecordBatch | pa.Table):
        raise ConfigError(where, f"must return a pyarrow RecordBatch or Table, not {type(result).__name__}")
    return result.schema


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def shapes_from_toml(section: Mapping[str, object]) -> tuple[Shape, ...]:
    """``[outputs.<name>]`` tables of a definition (``from``, ``sql``) as shapes; checks what can be
    checked without the source (the query itself waits for :func:`route_outputs`: only planned
    against the source's columns does it say which functions it calls)."""
    shapes = []
    for name, spec in section.items():
        where = f"outputs.{name}"
        if not isinstance(spec, Mapping):
            raise ConfigError(where, "must be a table with sql (and from, to route another output's records)")
        unknown = sorted(set(spec) - {"from", "sql"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", "unknown key (known: from, sql)")
        sql, source = spec.get("sql"), spec.get("from")
        if not isinstance(sql, str):
            raise ConfigError(f"{where}.sql", "missing" if sql is None else f"expected a string, got {sql!r}")
        if source is not None and not isinstance(source, str):
            raise ConfigError(f"{where}.from", f"expected an output name, got {source!r}")
        shapes.append(Shape(name, source, sql))
    return tuple(shapes)


def shapes_to_toml(shapes: Sequence[Shape]) -> dict[str, dict[str, str]]:
    """The ``[outputs]`` tables that :func:`shapes_from_toml` reads back (SQL shapes only)."""
    return {s.name: {**({"from": s.input} if s.input else {}), "sql": s.sql} for s in shapes if s.sql is not None}
