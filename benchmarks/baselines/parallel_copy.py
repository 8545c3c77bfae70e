"""Not a baseline to beat but a floor to read reclock against: a snapshot as fast as a hand-written
script can land it on both cores, doing the per-row work any design must do and nothing else.

The table is cut into ``parts`` ``ctid`` ranges copied by a pool of warm worker processes (as
Spark's Python workers are warm), each ``COPY ... TO STDOUT (FORMAT csv)`` parsed by
``pyarrow.csv`` straight into the table's types, given the columns an ``upsert`` output's file
holds beside the table's (``_partition``, ``_offset``, ``_deleted``, ``_truncated``, ``_into_ts``)
and written as one snappy parquet file into the Delta table's folder; the driver then commits
every file in one Delta commit. ``two_pass`` first writes each range as a chunk file (lz4, the
capture's settings) and lands the chunks in a second round, as the Postgres source must: its
chunks are read back after the binding that stamps them exists.

What it leaves out, and reclock cannot: a replication slot and its exported snapshot (so no
consistent point to stream on from), a manifest, a binding, labelled commits, statistics in the
Delta log, Spark. The gap between this floor and reclock is what those cost here.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

__all__ = ["Floor"]

#: The columns an upsert output's data file holds beside the table's, in its order.
LINEAGE = ("_partition", "_offset")
FLAGS = ("_deleted", "_truncated", "_into_ts")


class Floor:
    """A warm pool of ``workers`` processes; :meth:`run` lands a table through it."""

    def __init__(self, workers: int = 2) -> None:
        self.pool = ProcessPoolExecutor(workers)
        list(self.pool.map(abs, range(workers * 2)))  # start and warm every worker

    def close(self) -> None:
        self.pool.shutdown()

    def run(
        self, dsn: str, table: str, schema: pa.Schema, lake: Path, *, parts: int = 4, two_pass: bool = False
    ) -> int:
        """Land ``table`` (its columns as ``schema`` names and types them) in the Delta table
        ``lake/<table>``: its ``parts`` ranges on the pool, then one commit; the rows written."""
        import psycopg2
        from deltalake import DeltaTable
        from deltalake.transaction import AddAction

        with closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int", (table,))
            pages = int(cur.fetchone()[0])
        folder = lake / table
        folder.mkdir(parents=True)
        step = max(1, -(-pages // parts))
        ranges = [(low, low + step if low + step < pages else None) for low in range(0, pages, step)]
        written = list(
            self.pool.map(_capture, [(dsn, table, schema, low, high, str(folder), two_pass) for low, high in ranges])
        )
        if two_pass:
            written = list(self.pool.map(_land_chunk, [path for path, _ in written]))
        now = int(time.time() * 1000)
        delta = DeltaTable.create(str(folder), schema=_with_lineage(schema.empty_table()).schema)
        delta.create_write_transaction(
            [
                AddAction(
                    os.path.basename(path), os.path.getsize(path), {}, now, True, json.dumps({"numRecords": rows})
                )
                for path, rows in written
            ],
            mode="append",
            schema=delta.schema(),
        )
        return sum(rows for _, rows in written)


def _copy(dsn: str, table: str, schema: pa.Schema, low: int, high: int | None) -> pa.Table:
    import psycopg2

    where = f"ctid >= '({low},0)'::tid" + (f" AND ctid < '({high},0)'::tid" if high is not None else "")
    buffer = io.BytesIO()
    with closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.copy_expert(
            f"COPY (SELECT {', '.join(schema.names)} FROM {table} WHERE {where}) TO STDOUT (FORMAT csv)", buffer
        )
    buffer.seek(0)
    return pa_csv.read_csv(
        buffer,
        read_options=pa_csv.ReadOptions(column_names=schema.names),
        convert_options=pa_csv.ConvertOptions(column_types=schema),
    )


def _with_lineage(rows: pa.Table) -> pa.Table:
    n = rows.num_rows
    falses = pa.array(np.zeros(n, dtype=bool))
    arrays: Sequence[pa.Array] = [
        pa.repeat(pa.scalar("wal", pa.string()), n),
        pa.array(np.ones(n, dtype=np.int64)),
        *(column.combine_chunks() for column in rows.columns),
        falses,
        falses,
        pa.array(np.full(n, 1_700_000_000_000, dtype=np.int64)),
    ]
    return pa.Table.from_arrays(arrays, names=[*LINEAGE, *rows.column_names, *FLAGS])


def _capture(job: tuple) -> tuple[str, int]:
    dsn, table, schema, low, high, folder, two_pass = job
    rows = _copy(dsn, table, schema, low, high)
    if two_pass:
        path = os.path.join(folder, f"chunk-{low}.parquet")
        pq.write_table(rows, path, compression="lz4", use_dictionary=False, write_statistics=False)
    else:
        path = os.path.join(folder, f"part-{low}.snappy.parquet")
        pq.write_table(_with_lineage(rows), path, compression="snappy")
    return path, rows.num_rows


def _land_chunk(chunk: str) -> tuple[str, int]:
    folder = os.path.dirname(chunk)
    rows = pq.read_table(chunk)
    os.unlink(chunk)
    path = os.path.join(
        folder, "part-" + os.path.basename(chunk).removeprefix("chunk-").replace(".parquet", ".snappy.parquet")
    )
    pq.write_table(_with_lineage(rows), path, compression="snappy")
    return path, rows.num_rows
