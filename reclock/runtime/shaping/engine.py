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

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

__all__ = ["INPUT", "batch_dependence", "run_sql"]

#: The name the decoded rows have in a transform's SQL.
INPUT = "input"

#: Plan nodes of a query that computes each row from that row alone. Any other (an aggregate, a
#: window, a sort, a limit, a join, a union, an unnest) makes a row's result depend on the other
#: rows of its batch, so on how records happened to be grouped, which a replay need not repeat.
_ROW_LOCAL = frozenset({"Projection", "Filter", "TableScan", "SubqueryAlias"})

_local = threading.local()


def run_sql(sql: str, table: pa.Table) -> pa.Table:
    """``sql`` over ``table`` registered as :data:`INPUT`; the engine's exception if it fails."""
    with _registered(table) as ctx:
        return ctx.sql(sql).to_arrow_table()


def batch_dependence(sql: str, table: pa.Table) -> str | None:
    """What in ``sql`` (over a table shaped as ``table``) makes a row's result depend on other
    rows: a plan node's name, or ``"Subquery"``; ``None`` when every row stands alone."""
    with _registered(table) as ctx:
        plan = ctx.sql(sql).logical_plan()
    if re.search(r"^\s*Subquery:", plan.display_indent(), re.MULTILINE):
        return "Subquery"
    nodes = [plan]
    while nodes:
        node = nodes.pop()
        name = type(node.to_variant()).__name__
        if name not in _ROW_LOCAL:
            return name
        nodes.extend(node.inputs())
    return None


@contextmanager
def _registered(table: pa.Table) -> Iterator[Any]:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        import datafusion

        ctx = _local.ctx = datafusion.SessionContext()
    batches = table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]
    ctx.register_record_batches(INPUT, [batches])
    try:
        yield ctx
    finally:
        ctx.deregister_table(INPUT)
