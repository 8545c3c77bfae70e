"""Reading a Delta table snapshot into Arrow without deltalake's pyarrow-dataset bridge.

``DeltaTable.to_pyarrow_table`` scans through delta-rs's own filesystem handler inside a pyarrow
dataset; on these machines that leaves threads that abort the interpreter at exit ("terminate
called without an active exception", delta-io/delta-rs#2184), which would turn every CLI call and
test run into a crash. Our tables use neither deletion vectors nor column mapping, so the snapshot's
files read directly with pyarrow are exactly the table; a partitioned table's partition columns
come from its log (``partitionValues``), not from its files. A column a file lacks (added by a
later schema change) reads as null.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from reclock.persist.layout import read_groups, serialize_partition_value
from reclock.persist.store import LOCAL, Store, parse_lake

__all__ = ["read_table"]


def read_table(
    table: DeltaTable,
    *,
    columns: Sequence[str] | None = None,
    filters: list[tuple[str, str, Any]] | None = None,
    store: Store = LOCAL,
) -> pa.Table:
    """The rows of ``table``'s loaded version (optionally some columns, filtered), as Arrow.

    ``store`` reads the files of a table in an object store (the one the table was opened with).
    """
    schema = pa.schema(table.schema().to_arrow())
    if table.metadata().partition_columns:
        data = _read_partitioned(table, schema, filters, store)
        return data.select(list(columns)) if columns is not None else data
    files = table.file_uris()
    if not files:
        empty = schema.empty_table()
        return empty.select(list(columns)) if columns is not None else empty
    data = store.read_parquet(
        files, schema=schema, columns=list(columns) if columns is not None else None, filters=filters
    )
    return data


def _read_partitioned(
    table: DeltaTable, schema: pa.Schema, filters: list[tuple[str, str, Any]] | None, store: Store
) -> pa.Table:
    """A partitioned table: its files hold no partition columns, the log's ``partitionValues`` do."""
    if not table.file_uris():
        return schema.empty_table()
    names = table.metadata().partition_columns
    actions = pa.table(table.get_add_actions(flatten=True))
    root = parse_lake(table.table_uri.rstrip("/"))
    groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
    for row in actions.select(["path", *(f"partition.{c}" for c in names)]).to_pylist():
        key = tuple((c, serialize_partition_value(row[f"partition.{c}"])) for c in names)
        groups.setdefault(key, []).append(str(root / urllib.parse.unquote(row["path"])))
    stored = [f for f in (filters or []) if f[0] not in names]
    data = read_groups(store, groups, schema, filters=stored or None)
    for name, op, value in filters or []:
        if name in names:
            data = data.filter(_COMPARE[op](data.column(name), value))
    return data


_COMPARE = {"<=": pc.less_equal, "<": pc.less, ">=": pc.greater_equal, ">": pc.greater, "=": pc.equal, "==": pc.equal}
