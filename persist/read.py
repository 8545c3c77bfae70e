"""Reading a Delta table snapshot into Arrow without deltalake's pyarrow-dataset bridge.

``DeltaTable.to_pyarrow_table`` scans through delta-rs's own filesystem handler inside a pyarrow
dataset; on these machines that leaves threads that abort the interpreter at exit ("terminate
called without an active exception", delta-io/delta-rs#2184), which would turn every CLI call and
test run into a crash. Our tables use neither deletion vectors nor column mapping, so the snapshot's
files read directly with pyarrow are exactly the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from reclock.persist.store import LOCAL, Store

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
    files = table.file_uris()
    if not files:
        empty = schema.empty_table()
        return empty.select(list(columns)) if columns is not None else empty
    data = store.read_parquet(
        files, schema=schema, columns=list(columns) if columns is not None else None, filters=filters
    )
    return data
