"""Output layout: how an output table is partitioned, and what happens to fields it does not know.

An output may be **partitioned** (Delta partition columns) by data columns of its own and by
``_into_date``, the UTC day of ``_into_ts``: a column reclock derives from the stamp, like a
generated column, so a reader that prunes by day never opens another day's files. The table is
created partitioned; a file holds the rows of one partition value, in a Hive-style folder
(``_into_date=2026-11-23/part-....parquet``), without its partition columns (the Delta protocol
keeps their values in the log's ``partitionValues``). Partitioning changes where rows are, never
which rows an output holds: labels, uppers and as-of reads are those of an unpartitioned output.

A value a partition column cannot hold faithfully is bad data of its record, found by
:func:`unplaceable` before any file is written: its row goes to ``_errors`` (kind
:data:`PARTITION_ERROR`) and the rest of its batch lands. Those are a value whose folder name
would be longer than a file system's 255 bytes (about 250 ASCII characters, or 21 emoji once
escaped), and the two strings Delta reads back as null: the empty string (the protocol stores an
empty partition value as null) and ``__HIVE_DEFAULT_PARTITION__`` (the null partition's folder
name, which delta-rs and polars take for null).

Every output has a **schema evolution** policy (after Auto Loader's ``schemaEvolutionMode``) for
fields a record carries that its output's declared columns lack (see
:mod:`reclock.persist.evolution`): ``none`` (the default: ignore them, as always), ``fail``,
``add`` (new nullable string columns) or ``rescue`` (into the ``_rescued`` JSON column).
"""

from __future__ import annotations

import posixpath
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.envelope import APPEND, UPSERT
from reclock.errors import ConfigError
from reclock.persist.store import LakePath, Store
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION

__all__ = [
    "EVOLUTION_MODES",
    "INTO_DATE",
    "RESCUED",
    "PARTITION_ERROR",
    "delta_type",
    "to_delta_type",
    "EvolutionMode",
    "OutputLayout",
    "into_dates",
    "layout_schema",
    "layouts_to_dict",
    "output_layouts",
    "parse_layouts",
    "partition_groups",
    "read_files",
    "read_groups",
    "serialize_partition_value",
    "unplaceable",
]

#: The derived column of outputs partitioned by day: the UTC date of ``_into_ts``.
INTO_DATE = "_into_date"

#: The column of ``rescue`` outputs: a record's unknown fields as one JSON object (null if none).
RESCUED = "_rescued"

EvolutionMode: TypeAlias = Literal["none", "fail", "add", "rescue"]
EVOLUTION_MODES: tuple[str, ...] = ("none", "fail", "add", "rescue")

#: ``kind`` of an ``_errors`` row whose value a partition column cannot hold (:func:`unplaceable`).
PARTITION_ERROR = "partition"

_MS_PER_DAY = 86_400_000
#: Delta's (and Hive's) folder name for a null partition value.
_NULL_FOLDER = "__HIVE_DEFAULT_PARTITION__"
#: The longest file or folder name, in bytes, that common file systems take (NAME_MAX).
_NAME_MAX = 255
_PARTITION_TYPES = (pa.types.is_integer, pa.types.is_string, pa.types.is_date32, pa.types.is_boolean)


@dataclass(frozen=True)
class OutputLayout:
    """One output's partition columns (in folder order) and its schema evolution policy."""

    partition_by: tuple[str, ...] = ()
    schema_evolution: EvolutionMode = "none"

    @property
    def partitioned(self) -> bool:
        return bool(self.partition_by)

    def check(self, output: str, own: pa.Schema, envelope: str) -> None:
        """Refuse, naming the field, what this output cannot do with its columns and envelope."""
        field = f"outputs.{output}"
        if self.schema_evolution not in EVOLUTION_MODES:
            raise ConfigError(
                f"{field}.schema_evolution",
                f"must be one of {', '.join(EVOLUTION_MODES)}, got {self.schema_evolution!r}",
            )
        if self.schema_evolution == "add" and envelope not in (APPEND, UPSERT):
            raise ConfigError(
                f"{field}.schema_evolution", f"'add' needs an append or upsert output; {output!r} is {envelope}"
            )
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ConfigError(f"{field}.partition_by", "names a column twice")
        for name in self.partition_by:
            if name == INTO_DATE:
                continue
            index = own.get_field_index(name)
            if index < 0:
                raise ConfigError(
                    f"{field}.partition_by", f"{name!r} is neither {INTO_DATE!r} nor a column of {output!r}"
                )
            kind = own.field(index).type
            if not any(test(kind) for test in _PARTITION_TYPES):
                raise ConfigError(
                    f"{field}.partition_by", f"column {name!r} is {kind}: partition by a string, integer, bool or date"
                )


def output_layouts(outputs: Mapping[str, Any], layouts: Mapping[str, OutputLayout]) -> dict[str, OutputLayout]:
    """Check ``layouts`` against a source's outputs (a source asked to keep unknown fields for
    the outputs that evolve is the runtime's business, :func:`~reclock.runtime.outputs.layouts_of`)."""
    for name, layout in layouts.items():
        output = outputs.get(name)
        if output is None or name.startswith("_"):
            known = ", ".join(n for n in outputs if not n.startswith("_"))
            raise ConfigError(f"outputs.{name}", f"the source has no output {name!r} (outputs: {known})")
        layout.check(name, output.schema, output.envelope)
    return dict(layouts)


def parse_layouts(raw: Any, *, prefix: str = "outputs") -> dict[str, OutputLayout]:
    """``[outputs.<name>]`` tables of a definition (``partition_by``, ``schema_evolution``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(prefix, "must be a table of outputs")
    layouts = {}
    for name, section in raw.items():
        where = f"{prefix}.{name}"
        if not isinstance(section, Mapping):
            raise ConfigError(where, "must be a table")
        for key in section:
            if key not in ("partition_by", "schema_evolution"):
                raise ConfigError(f"{where}.{key}", "unknown key (known: partition_by, schema_evolution)")
        partition_by = section.get("partition_by", [])
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        if not isinstance(partition_by, list) or not all(isinstance(c, str) and c for c in partition_by):
            raise ConfigError(f"{where}.partition_by", f"must be a list of column names, got {partition_by!r}")
        mode = section.get("schema_evolution", "none")
        if mode not in EVOLUTION_MODES:
            raise ConfigError(f"{where}.schema_evolution", f"must be one of {', '.join(EVOLUTION_MODES)}, got {mode!r}")
        layouts[str(name)] = OutputLayout(tuple(partition_by), mode)
    return layouts


def layouts_to_dict(layouts: Mapping[str, OutputLayout]) -> dict[str, dict[str, Any]]:
    """``[outputs.<name>]`` tables as a definition stores them (:func:`parse_layouts` reads them)."""
    return {
        name: {"partition_by": list(layout.partition_by), "schema_evolution": layout.schema_evolution}
        for name, layout in layouts.items()
    }


def layout_schema(own: pa.Schema, layout: OutputLayout, *, lineage: bool = True) -> pa.Schema:
    """An output table's schema: its own columns (each of its :func:`delta_type`), ``_rescued``,
    ``_into_ts``, ``_into_date``, lineage."""
    fields = [f.with_type(delta_type(f.type)) for f in own]
    if layout.schema_evolution == "rescue":
        fields.append(pa.field(RESCUED, pa.string()))
    fields.append(pa.field(INTO_TS, pa.int64(), nullable=False))
    if INTO_DATE in layout.partition_by:
        fields.append(pa.field(INTO_DATE, pa.date32(), nullable=False))
    if lineage:
        fields += [pa.field(PARTITION, pa.string(), nullable=False), pa.field(OFFSET, pa.int64(), nullable=False)]
    return pa.schema(fields)


def delta_type(kind: pa.DataType) -> pa.DataType:
    """The one Arrow type a Delta table holds a column of ``kind`` in, as every writer of it
    writes it: timestamps in microseconds (Delta's only unit; with a zone, in UTC), strings,
    binaries and lists in their plain form (not ``large_`` nor ``_view``), inside structs and
    lists too. Tasks write their files in it, so a file written by delta-rs (schema evolution,
    ``optimize``) and one written by a task hold a column in the same physical type."""
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", tz="UTC" if kind.tz else None)
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_struct(kind):
        return pa.struct([kind.field(i).with_type(delta_type(kind.field(i).type)) for i in range(kind.num_fields)])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(delta_type(kind.value_type)))
    if pa.types.is_map(kind):
        return pa.map_(delta_type(kind.key_type), delta_type(kind.item_type))
    return kind


def to_delta_type(column: pa.Array | pa.ChunkedArray, kind: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``column`` cast to its table's ``kind``: a nanosecond timestamp is truncated to its
    microsecond (Delta holds no finer), every other cast must lose nothing."""
    return column.cast(kind, safe=not _finer_than_us(column.type))


def _finer_than_us(kind: pa.DataType) -> bool:
    if pa.types.is_timestamp(kind):
        return kind.unit == "ns"
    if pa.types.is_struct(kind):
        return any(_finer_than_us(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _finer_than_us(kind.value_type)
    return False


def into_dates(into: np.ndarray | pa.Array) -> pa.Array:
    """``_into_date`` of each ``_into_ts``: days since the epoch (UTC), floor-divided."""
    ms = np.asarray(into, dtype=np.int64)
    return pa.array(np.floor_divide(ms, _MS_PER_DAY).astype(np.int32), pa.int32()).cast(pa.date32())


def partition_groups(
    table: pa.Table, partition_by: tuple[str, ...]
) -> list[tuple[str, dict[str, str | None], pa.Table]]:
    """Split ``table`` by its partition values: ``(folder, partitionValues, rows without them)``.

    Folders and values are as Delta writes them: ``col=value`` segments, a value as its
    serialized text (``2026-11-23``, ``42``, ``true``) with characters outside ``[A-Za-z0-9-_.~]``
    escaped Hive-style (``%2F``), a null (or an empty string, which Delta reads as null) as
    ``__HIVE_DEFAULT_PARTITION__`` and ``None``. A folder is a path on disk; the log names it as
    a URI, escaped once more by delta-rs when it writes the add action (``%2F`` is ``%252F``
    there). Each group becomes a file of its own, so their order does not matter.
    """
    order = pa.array(np.arange(table.num_rows, dtype=np.int64))
    keyed = table.select(list(partition_by)).append_column("__row", order)
    combos = keyed.group_by(list(partition_by), use_threads=False).aggregate([("__row", "list")])
    groups = []
    for combo in combos.to_pylist():
        rows = table.take(pa.array(combo["__row_list"], pa.int64())).drop_columns(list(partition_by))
        values = {name: serialize_partition_value(combo[name]) for name in partition_by}
        folder = posixpath.join(*(f"{name}={_escape(values[name])}" for name in partition_by))
        groups.append((folder, values, rows))
    return groups


def unplaceable(table: pa.Table, partition_by: tuple[str, ...]) -> dict[int, str]:
    """Rows of ``table`` a partition column cannot hold, by row number: what is wrong, naming the
    column. Judged once per distinct value, so a batch of few partition values costs little."""
    problems: dict[int, str] = {}
    for name in partition_by:
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue  # an integer, date or bool: short, and never read back as something else
        bad = {v: why for v in pc.unique(column).to_pylist() if v is not None and (why := _unfit(name, v))}
        if not bad:
            continue
        reasons = list(bad.values())
        which = pc.index_in(column, value_set=pa.array(list(bad), column.type)).fill_null(-1).to_numpy()
        for row in np.flatnonzero(which >= 0):
            problems.setdefault(int(row), f"partition column {name!r}: {reasons[which[row]]}")
    return problems


def _unfit(name: str, value: str) -> str | None:
    if value == "":
        return "the empty string reads back as null (Delta stores an empty partition value as null)"
    if value == _NULL_FOLDER:
        return f"{_NULL_FOLDER!r} is the null partition's folder name: it reads back as null"
    size = len(f"{name}={_escape(value)}".encode())
    if size > _NAME_MAX:
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"the folder of value {shown!r} would be named in {size} bytes, over the {_NAME_MAX} a file system takes"
    return None


def read_files(store: Store, root: LakePath, files: Iterable[Any], schema: pa.Schema) -> pa.Table:
    """Rows of data files (``path`` under ``root``, ``partition_values``) as a table of
    ``schema``: a column a file lacks reads as null, partition columns come from the values."""
    groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
    for f in files:
        groups.setdefault(tuple(sorted(f.partition_values.items())), []).append(str(root / f.path))
    return read_groups(store, groups, schema)


def read_groups(
    store: Store, groups: Mapping[tuple[tuple[str, str | None], ...], list[str]], schema: pa.Schema, **kwargs: Any
) -> pa.Table:
    """Files grouped by their partition values, read as one table of ``schema`` (see :func:`read_files`)."""
    parts = []
    for values, uris in groups.items():
        constants = dict(values)
        stored = pa.schema([f for f in schema if f.name not in constants])
        rows = store.read_parquet(uris, schema=stored, **kwargs)
        columns = []
        for f in schema:
            if f.name in constants:
                value = pa.array([constants[f.name]], pa.string()).cast(f.type)[0]
                columns.append(pa.repeat(value, rows.num_rows))
            else:
                columns.append(rows.column(f.name))
        parts.append(pa.Table.from_arrays(columns, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def serialize_partition_value(value: Any) -> str | None:
    """A partition value as Delta's ``partitionValues`` hold it; an empty string is null there."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _escape(value: str | None) -> str:
    if value is None:
        return _NULL_FOLDER
    return urllib.parse.quote(value, safe="-_.~")
