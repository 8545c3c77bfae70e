"""A route's transform over one batch, in a task: good rows, rows in error, rows filtered out.

Every input row ends in exactly one of three places, so nothing is silently lost:

* **rows**: what the transform returned, its own columns with the record's lineage and
  ``_into_ts`` attached by identity ``(_partition, _offset)``, in input order (the engine may
  reorder; the table must not depend on it);
* **errors**: rows whose evaluation fails (an integer division by zero, a failed cast, a Python
  exception), each with its coordinates and the message, for ``_errors``;
* **filtered**: rows the transform dropped on purpose (``WHERE``), counted, never stored.

A SQL query fails whole when one row fails, so a failing batch is *bisected*: each half runs
again until every failing slice is one row (when the first half of a failing slice succeeds, the
second is known to fail and only its halves run). Good rows land whatever their neighbours do, and
the rows in error are exactly those that fail alone, so the outcome does not depend on how records
were grouped into batches. Isolating ``k`` bad rows of ``n`` costs about ``1.5k·log2(n/k)`` extra
queries of shrinking size. A result that breaks the contract (a row of no record, two rows of
one record, a missing column or one of another type) is a broken transform: raised, never bisected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.errors import ContractError
from reclock.runtime.rows import output_rows
from reclock.runtime.shaping.definition import ID, Route, stored, stored_type, with_rows
from reclock.runtime.shaping.engine import run_sql
from reclock.sources.base import ERRORS, clip_message, error_batch
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION

__all__ = ["TRANSFORM_ERROR", "Outcome", "apply_route", "shape_batch"]

#: ``kind`` of an ``_errors`` row a transform rejected.
TRANSFORM_ERROR = "transform"
_LINEAGE = (PARTITION, OFFSET, INTO_TS)


@dataclass(frozen=True)
class Outcome:
    """Where the rows of one batch went (see the module docstring)."""

    rows: pa.Table  # own columns, then _partition, _offset, _into_ts
    errors: pa.Table  # an error batch's columns, then _into_ts
    filtered: pa.Table  # _partition, _offset, _into_ts of the rows dropped on purpose


def shape_batch(
    route: Route, batch: pa.RecordBatch, into: np.ndarray, uppers: Mapping[str, int], schemas: Mapping[str, pa.Schema]
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A task's stamped source batch through ``route``: the rows its output lacks and the rows
    ``_errors`` lacks, each in its table's write schema, and the lineage of the rows filtered out
    that the output lacks. Rows are evaluated while the output *or* ``_errors`` lacks them, so a
    crash between those two commits still lands each rejected row exactly once. The output's rows
    are built by :func:`~reclock.runtime.rows.output_rows`, like rows landed as read, so a column
    reclock derives from the stamp (``_into_date``) is there whatever the output's route."""
    upper, errors_upper = uppers[route.output], uppers[ERRORS]
    keep = into >= min(upper, errors_upper)
    table = pa.Table.from_batches([batch]).append_column(INTO_TS, pa.array(into, pa.int64()))
    outcome = apply_route(route, table if keep.all() else table.filter(pa.array(keep)))
    rows = outcome.rows.filter(pc.greater_equal(outcome.rows.column(INTO_TS), upper))
    errors = outcome.errors.filter(pc.greater_equal(outcome.errors.column(INTO_TS), errors_upper))
    output, errors_schema = schemas[route.output], schemas[ERRORS]
    return (
        output_rows(rows, rows.column(INTO_TS).to_numpy(), output),
        errors.select(errors_schema.names).cast(errors_schema),
        outcome.filtered.filter(pc.greater_equal(outcome.filtered.column(INTO_TS), upper)),
    )


def apply_route(route: Route, table: pa.Table) -> Outcome:
    """Run ``route``'s transform over ``table`` (lineage, the source output's columns, ``_into_ts``)."""
    assert route.shape is not None and route.schema is not None, "a route without a transform lands rows as read"
    table = _conform(route, table)
    good: list[tuple[int, int, object]] = []
    bad: list[tuple[int, str]] = []
    if table.num_rows:
        _isolate(route, table, 0, table.num_rows, good, bad)
    landed = np.zeros(table.num_rows, dtype=bool)
    pieces = []
    for start, stop, result in good:
        piece = table.slice(start, stop - start)
        rows, records = _identify(route, piece, result)
        own = [_column(route, result, f).take(pa.array(rows)) for f in route.schema]
        lineage = [piece.column(name).take(pa.array(records)) for name in _LINEAGE]
        pieces.append(pa.Table.from_arrays([*own, *lineage], names=[*route.schema.names, *_LINEAGE]))
        landed[start + records] = True
    for at, _ in bad:
        landed[at] = True
    schema = pa.schema([*route.schema, *(table.schema.field(name) for name in _LINEAGE)])
    return Outcome(
        pa.concat_tables(pieces).cast(schema) if pieces else schema.empty_table(),
        _errors(route, table, bad),
        table.select(list(_LINEAGE)).filter(pa.array(~landed)),
    )


def _conform(route: Route, table: pa.Table) -> pa.Table:
    """``table`` as the transform was checked against: its columns, in order, of their types."""
    assert route.input is not None
    columns = []
    for target in route.input:
        if target.name not in table.column_names:
            raise ContractError(f"source batch lacks column {target.name!r} of output {route.output!r}'s input")
        column = table.column(target.name)
        columns.append(column if column.type == target.type else column.cast(target.type))
    return pa.Table.from_arrays(columns, schema=route.input)


def _isolate(route: Route, table: pa.Table, start: int, stop: int, good: list, bad: list, fails: bool = False) -> bool:
    """Evaluate rows ``[start, stop)``; on failure, each half again, down to single rows. Whether
    it failed. ``fails``: it is known to (it failed whole and its other half did not), so only
    its halves run; a single row always runs, for its own message."""
    if not fails or stop - start == 1:
        try:
            good.append((start, stop, _run(route, table.slice(start, stop - start))))
            return False
        except Exception as exc:  # the row's own fault: it goes to the error port, with the message
            if stop - start == 1:
                bad.append((start, clip_message(f"output {route.output!r}: {_first_line(exc)}")))
                return True
    middle = (start + stop) // 2
    left = _isolate(route, table, start, middle, good, bad)
    _isolate(route, table, middle, stop, good, bad, fails=not left)
    return True


def _run(route: Route, piece: pa.Table) -> object:
    if route.query is not None:
        return run_sql(route.query, with_rows(piece))
    assert route.shape is not None and route.shape.function is not None
    batches = piece.combine_chunks().to_batches()
    return route.shape.function(batches[0] if batches else pa.RecordBatch.from_pylist([], schema=piece.schema))


def _identify(route: Route, piece: pa.Table, result: object) -> tuple[np.ndarray, np.ndarray]:
    """``(result rows, piece rows)``: which record each result row is, in the piece's order."""
    if not isinstance(result, pa.Table | pa.RecordBatch):
        raise ContractError(f"the transform of output {route.output!r} returned {type(result).__name__}, not Arrow")
    n = result.num_rows
    if route.query is not None:  # the rewritten query carries each row's number in its batch
        positions, matched = np.arange(n), np.asarray(result.column(ID).to_numpy(), np.int64)
        found = int(((matched >= 0) & (matched < piece.num_rows)).sum())
    else:
        if PARTITION not in result.schema.names or OFFSET not in result.schema.names:
            raise ContractError(f"the transform of output {route.output!r} dropped {PARTITION} or {OFFSET}")
        records = pa.table({"p": piece.column(PARTITION), "o": piece.column(OFFSET), "i": np.arange(piece.num_rows)})
        ids = pa.table({"p": result.column(PARTITION), "o": result.column(OFFSET), "j": np.arange(n)})
        joined = ids.join(records, ["p", "o"], join_type="inner")
        positions, matched = joined.column("j").to_numpy(), joined.column("i").to_numpy()
        found = joined.num_rows
    order = np.argsort(matched, kind="stable")
    ordered = matched[order]
    if found != n or bool((ordered[1:] == ordered[:-1]).any()):
        raise ContractError(
            f"the transform of output {route.output!r} returned {n} rows for a batch of {piece.num_rows} records, "
            f"{found} of them matching a record: a transform keeps each row's lineage and returns at most one row "
            "per record"
        )
    return positions[order], ordered


def _column(route: Route, result: pa.Table | pa.RecordBatch, target: pa.Field) -> pa.Array | pa.ChunkedArray:
    if target.name not in result.schema.names:
        raise ContractError(f"the transform of output {route.output!r} returned no column {target.name!r}")
    column = result.column(target.name)
    try:
        if column.type == target.type:
            return column
        return stored(column, target.type) if stored_type(column.type) == target.type else column.cast(target.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ContractError(
            f"the transform of output {route.output!r} returned column {target.name!r} as {column.type}, "
            f"which is not its {target.type}: {exc}"
        ) from None


def _errors(route: Route, table: pa.Table, bad: list[tuple[int, str]]) -> pa.Table:
    """One ``_errors`` row per rejected record: coordinates, message, the record as JSON."""
    at = pa.array([i for i, _ in bad], pa.int64())
    own = [name for name in table.column_names if name not in _LINEAGE]
    raws = [json.dumps(row, default=str).encode() for row in table.select(own).take(at).to_pylist()]
    batch = error_batch(
        table.column(PARTITION).take(at).combine_chunks(),
        table.column(OFFSET).take(at).to_pylist(),
        [TRANSFORM_ERROR] * len(bad),
        [message for _, message in bad],
        raws,
    )
    return pa.Table.from_batches([batch]).append_column(INTO_TS, table.column(INTO_TS).take(at))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
