"""The SQL engine of transforms: Apache DataFusion, Arrow in and Arrow out, one context a thread.

Chosen by measurement (``benchmarks/shaping_engine.py``, ``docs/design/20261123_shaping_engine.md``):
it costs a few milliseconds a batch and runs millions of rows a second, in the driver and in a
Spark task alike, and like Spark SQL in ANSI mode it *fails* a query on an integer division by zero
or a failed cast, where DuckDB returns NULL or infinity: a row that cannot be computed becomes an
error the transform isolates, never a silently wrong value.

A context holds the one table ``input`` only while a query runs; a thread keeps its context (a
Spark worker or an in-driver thread runs many tasks), so only the first batch pays for creating it.

A transform is checked on the plan DataFusion makes of it (:func:`inspect`), never on its text:
the plan has resolved every name, quoting and comment (``"now"()``, ``random/**/()``), and each
function is judged by the volatility DataFusion itself declares for it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["INPUT", "Inspection", "inspect", "run_sql"]

#: The name the decoded rows have in a transform's SQL.
INPUT = "input"

#: Plan nodes of a query that computes each row from that row alone. Any other (an aggregate, a
#: window, a sort, a limit, a join, a union, an unnest) makes a row's result depend on the other
#: rows of its batch, so on how records happened to be grouped, which a replay need not repeat.
_ROW_LOCAL = frozenset({"Projection", "Filter", "TableScan", "SubqueryAlias"})
#: Expressions that read another relation: a row's result then depends on more than its record.
_SUBQUERY = frozenset({"ScalarSubquery", "Exists", "InSubquery", "OuterReferenceColumn"})
#: Expressions with no operand to walk (``rex_call_operands`` returns the expression itself).
_LEAVES = frozenset({"Column", "Literal", "ScalarVariable"})

_local = threading.local()


def run_sql(sql: str, table: pa.Table) -> pa.Table:
    """``sql`` over ``table`` registered as :data:`INPUT`; the engine's exception if it fails."""
    with _registered(table) as ctx:
        return ctx.sql(sql).to_arrow_table()


@dataclass(frozen=True)
class Inspection:
    """What the logical plan of a transform says about the rows it computes."""

    #: What makes a row's result depend on other rows of its batch: a plan node's name, or
    #: ``"Subquery"``; ``None`` when every row stands alone.
    across: str | None
    #: The scalar functions it calls (by DataFusion's name, aliases resolved) whose value is not
    #: fixed by their arguments: DataFusion declares them volatile (``random``) or stable (``now``).
    unrepeatable: tuple[str, ...]


def inspect(sql: str, table: pa.Table) -> Inspection:
    """The plan of ``sql`` over a table shaped as ``table``, walked: its nodes, then every
    expression of every node; the engine's exception if the query does not plan."""
    with _registered(table) as ctx:
        plan = ctx.sql(sql).logical_plan()
    nodes, expressions = [plan], []
    while nodes:
        node = nodes.pop()
        variant = node.to_variant()
        name = type(variant).__name__
        if name not in _ROW_LOCAL:
            return Inspection(name, ())
        nodes.extend(node.inputs())
        expressions.extend(_expressions(variant))
    calls, pending = [], expressions[::-1]  # depth first, in the order the query reads
    while pending:
        expression = pending.pop()
        kind = expression.variant_name()
        if kind in _SUBQUERY:
            return Inspection("Subquery", ())
        if kind == "ScalarFunction":
            calls.append(expression.rex_call_operator())
        if kind not in _LEAVES:
            pending.extend(expression.rex_call_operands()[::-1])
    fixed = _immutable()
    return Inspection(None, tuple(dict.fromkeys(name for name in calls if name not in fixed)))


def _expressions(variant: Any) -> list[Any]:
    kind = type(variant).__name__
    if kind == "Projection":
        return list(variant.projections())
    if kind == "Filter":
        return [variant.predicate()]
    if kind == "TableScan":
        return list(variant.filters())
    return []


@functools.cache
def _immutable() -> frozenset[str]:
    """Names of the scalar functions DataFusion declares immutable (the same value for the same
    arguments, always), asked of the engine itself: ``information_schema.routines`` reports
    ``is_deterministic`` as exactly that volatility. A separate context, so that transforms
    never see an ``information_schema``."""
    import datafusion

    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_information_schema(True))
    rows = ctx.sql(
        "SELECT routine_name FROM information_schema.routines WHERE function_type = 'SCALAR' "
        "GROUP BY routine_name HAVING bool_and(is_deterministic)"
    ).to_arrow_table()
    return frozenset(rows.column(0).to_pylist())


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
