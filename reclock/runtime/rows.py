"""A reader's batches as rows of output tables: stamped, in the table's columns, envelopes unwrapped.

Shared by the data plane's tasks, the pipeline's skipped-range rows and the redrive of
``_errors``, so every row that reaches an output is built the one same way.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.envelope import APPEND, DEBEZIUM
from reclock.errors import ContractError
from reclock.persist.layout import INTO_DATE, PARTITION_ERROR, into_dates, to_delta_type, unplaceable
from reclock.persist.merge import UNSENT
from reclock.persist.sink import DELETED, TRUNCATED
from reclock.sources.base import error_batch
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION

__all__ = ["output_rows", "split_null_keys", "split_unplaceable", "unwrap"]


def unwrap(batch: pa.RecordBatch, envelope: str, key: tuple[str, ...]) -> pa.RecordBatch:
    """Give upsert and debezium batches the row columns plus ``_deleted``, ``_truncated`` (false
    unless the source marks a TRUNCATE) and ``_unsent`` (null unless the source names columns a
    record did not send, :data:`~reclock.persist.merge.UNSENT`); append passes through."""
    if envelope == APPEND:
        return batch
    batch = _deletes(batch, envelope, key)
    if batch.schema.get_field_index(TRUNCATED) < 0:
        batch = batch.append_column(TRUNCATED, pa.array(np.zeros(batch.num_rows, dtype=bool)))
    if batch.schema.get_field_index(UNSENT) < 0:
        batch = batch.append_column(UNSENT, pa.nulls(batch.num_rows, pa.list_(pa.string())))
    return batch


def _deletes(batch: pa.RecordBatch, envelope: str, key: tuple[str, ...]) -> pa.RecordBatch:
    """``_deleted``: a debezium ``d``, the source's own column, or an upsert record of nulls only."""
    if envelope == DEBEZIUM:
        deleted = pc.fill_null(pc.equal(batch.column("op"), "d"), False)
        before, after = batch.column("before"), batch.column("after")
        names = [f.name for f in after.type]
        columns = [
            pc.if_else(deleted, pc.struct_field(before, [i]), pc.struct_field(after, [i])) for i in range(len(names))
        ]
        others = [n for n in batch.schema.names if n not in (PARTITION, OFFSET, "before", "after", "op")]
        return pa.RecordBatch.from_arrays(
            [
                batch.column(PARTITION),
                batch.column(OFFSET),
                *columns,
                *(batch.column(n) for n in others),
                deleted,
            ],
            names=[PARTITION, OFFSET, *names, *others, DELETED],
        )
    if batch.schema.get_field_index(DELETED) >= 0:
        return batch
    values = [n for n in batch.schema.names if n not in (PARTITION, OFFSET, *key)]
    deleted = pa.array(np.ones(batch.num_rows, dtype=bool))
    for name in values:
        deleted = pc.and_(deleted, pc.is_null(batch.column(name)))
    return batch.append_column(DELETED, deleted)


def split_null_keys(table: pa.Table, key: tuple[str, ...], errors: pa.Schema) -> tuple[pa.Table, pa.Table]:
    """Rows without a key cannot be upserted: they become ``_errors`` rows, never silently lost.
    A TRUNCATE record has no key: it stays."""
    missing = pc.is_null(table.column(key[0]))
    for name in key[1:]:
        missing = pc.or_(missing, pc.is_null(table.column(name)))
    if TRUNCATED in table.column_names:
        missing = pc.and_(missing, pc.invert(pc.fill_null(table.column(TRUNCATED), False)))
    if not pc.any(missing).as_py():
        return table, errors.empty_table()
    bad = table.filter(missing)
    n = bad.num_rows
    reasons = error_batch(
        bad.column(PARTITION).combine_chunks(),
        bad.column(OFFSET).combine_chunks(),
        ["null_key"] * n,
        [f"upsert key {list(key)} is null"] * n,
        [None] * n,
    )
    orphans = output_rows(reasons, bad.column(INTO_TS).combine_chunks(), errors)
    return table.filter(pc.invert(missing)), orphans


def split_unplaceable(table: pa.Table, partition_by: tuple[str, ...], errors: pa.Schema) -> tuple[pa.Table, pa.Table]:
    """Rows whose value a partition column cannot hold (:func:`~reclock.persist.layout.unplaceable`)
    become ``_errors`` rows, each alone, with the row's own columns as JSON: the rest still land."""
    problems = unplaceable(table, partition_by) if partition_by else {}
    if not problems:
        return table, errors.empty_table()
    at = sorted(problems)
    bad = table.take(pa.array(at, pa.int64()))
    own = [n for n in bad.column_names if n not in (PARTITION, OFFSET, INTO_TS, INTO_DATE)]
    reasons = error_batch(
        bad.column(PARTITION).combine_chunks(),
        bad.column(OFFSET).to_pylist(),
        [PARTITION_ERROR] * len(at),
        [problems[i] for i in at],
        [json.dumps(row, default=str).encode() for row in bad.select(own).to_pylist()],
    )
    keep = np.ones(table.num_rows, dtype=bool)
    keep[at] = False
    return table.filter(pa.array(keep)), output_rows(reasons, bad.column(INTO_TS).combine_chunks(), errors)


def output_rows(batch: pa.RecordBatch | pa.Table, into: np.ndarray | pa.Array, schema: pa.Schema) -> pa.Table:
    """A reader's batch, or a transform's rows, as rows of its output table: stamped with
    ``_into_ts`` (and ``_into_date`` where the table has it), in the table's column order and
    types. A batch missing a column of its output is a broken source."""
    columns = []
    for target in schema:
        if target.name == INTO_TS:
            columns.append(pa.array(into, pa.int64()))
            continue
        if target.name == INTO_DATE:
            columns.append(into_dates(into))
            continue
        index = batch.schema.get_field_index(target.name)
        if index < 0:
            raise ContractError(f"source batch lacks column {target.name!r} of its output")
        column = batch.column(index)
        columns.append(column if column.type == target.type else to_delta_type(column, target.type))
    return pa.Table.from_arrays(columns, schema=schema)
