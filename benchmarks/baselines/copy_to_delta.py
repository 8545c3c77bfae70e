"""Baseline: a table's snapshot as a capable user writes it by hand. One ``COPY (SELECT ...) TO
STDOUT (FORMAT csv)`` over psycopg2 into memory, parsed by ``pyarrow.csv`` straight into the
table's types, and one ``write_deltalake``.

Written fairly: no row goes through Python objects, the types are declared rather than inferred,
and the Delta table gets one commit. What it does not give is what the Postgres source is for: no
slot, so no consistent point to stream on from, nothing bound on a timeline, the whole table in
memory at once, and a crash means starting over.
"""

from __future__ import annotations

import io
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv

__all__ = ["run"]


def run(dsn: str, table: str, schema: pa.Schema, lake: Path) -> int:
    """Copy ``table`` (its columns as ``schema`` names and types them) into the Delta table ``lake/<table>``;
    the rows written."""
    import psycopg2
    from deltalake import write_deltalake

    buffer = io.BytesIO()
    with closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        columns = ", ".join(schema.names)
        cur.copy_expert(f"COPY (SELECT {columns} FROM {table}) TO STDOUT (FORMAT csv)", buffer)
    buffer.seek(0)
    rows = pa_csv.read_csv(
        buffer,
        read_options=pa_csv.ReadOptions(column_names=schema.names),
        convert_options=pa_csv.ConvertOptions(column_types=schema),
    )
    write_deltalake(str(lake / table), rows, mode="append")
    return rows.num_rows
