"""The SQL engine of transforms: Apache DataFusion, Arrow in and Arrow out, one context a thread.

Chosen by measurement (``benchmarks/shaping_engine.py``, ``docs/design/20261123_shaping_engine.md``):
it costs a few milliseconds a batch and runs millions of rows a second, in the driver and in a
Spark task alike, and like Spark SQL in ANSI mode it *fails* a query on an integer division by zero
or a failed cast, where DuckDB returns NULL or infinity: a row that cannot be computed becomes an
error the transform isolates, never a silently wrong value.

A context holds the one table ``input`` only while a query runs; a thread keeps its context (a
Spark worker or an in-driver thread runs many tasks), so only the first batch pays for creating it.
"""

from __future__ import annotations

import threading

import pyarrow as pa

__all__ = ["INPUT", "run_sql"]

#: The name the decoded rows have in a transform's SQL.
INPUT = "input"

_local = threading.local()


def run_sql(sql: str, table: pa.Table) -> pa.Table:
    """``sql`` over ``table`` registered as :data:`INPUT`; the engine's exception if it fails."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        import datafusion

        ctx = _local.ctx = datafusion.SessionContext()
    batches = table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]
    ctx.register_record_batches(INPUT, [batches])
    try:
        return ctx.sql(sql).to_arrow_table()
    finally:
        ctx.deregister_table(INPUT)
