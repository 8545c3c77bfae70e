"""The MERGE of an upsert or debezium output's batch, written by reclock: files and actions.

:meth:`~reclock.persist.sink.OutputSink.commit` hands over the batch's latest record per key
(``_deleted`` says which delete their key); this module turns it into the parquet files and the
``add`` and ``remove`` actions of one Delta commit, which the sink makes with its label:

Step 1: a record that did not send some columns (``_unsent``: an update of a database row that
left a large TOASTed value unchanged, so the server did not send it) takes their values from the
key's earlier record in the batch (:func:`fold_unsent`, before the batch keeps the latest
record per key), and else from the row the table holds (step 3): the output then equals the
source's table under any replica identity.
Step 2: the table's files that may hold a key of the batch (by the first key column's bounds in
the log) are read by their key columns; each file holding one is removed, and its other rows
are written again, in its partition.
Step 3: the records that are not deletes are written as new files, with the table's schema.

A TRUNCATE in the batch removes every file instead (the records before it are already gone).

Why not delta-rs's MERGE, which did this before: the files it writes hold ``string_view`` and
``binary_view`` columns where every other writer of the table (tasks, the snapshot, schema
evolution, ``optimize``) writes ``string`` and ``binary``, so one table held two physical types
per column and a reader trusting the files' schemas (pyarrow's concatenation) failed; and keeping
a target's value per column for the records that did not send it needed a ``CASE`` per column.
Every file written here is :func:`~reclock.persist.data_files.write_data_files`' own, of the table's
schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.transaction import AddAction, RemoveAction

from reclock.persist.data_files import write_data_files
from reclock.persist.layout import read_groups
from reclock.persist.store import LakePath, Store

__all__ = ["MARK", "UNSENT", "fold_unsent", "merge_batch"]

#: Staged-only column of upsert outputs: the columns a record did not send (null: it sent all),
#: whose values the MERGE keeps from the key's earlier record or from the table.
UNSENT = "_unsent"


@dataclass(frozen=True)
class _File:
    path: str
    size: int
    partition_values: Mapping[str, str | None]
    low: Any
    high: Any


def fold_unsent(order: pa.Table, key: Sequence[str], deleted: str) -> pa.Table:
    """``order`` (a batch's records, in order) with each unsent value of a record taken from the
    key's latest earlier record that has it, and no longer listed as unsent. A delete between
    them ends the search: its key's row is gone, and a later record is an insert that sent
    everything. Only batches with an unsent value pay the walk (over the keys; values are taken
    as columns, so any value Arrow holds is copied as it is)."""
    if UNSENT not in order.column_names or order.column(UNSENT).null_count == order.num_rows:
        return order
    flags: list[list[str] | None] = order.column(UNSENT).to_pylist()
    gone = pc.fill_null(order.column(deleted), False).to_pylist()
    keys = list(zip(*(order.column(k).to_pylist() for k in key), strict=True))
    names = sorted({name for f in flags if f for name in f})
    taken = {name: np.arange(order.num_rows) for name in names}
    latest: dict[tuple, int] = {}
    for i, k in enumerate(keys):
        unsent = flags[i]
        before = latest.get(k)
        if unsent and before is not None and not gone[before]:
            still = []
            for name in unsent:
                if flags[before] and name in flags[before]:  # type: ignore[operator]
                    still.append(name)
                else:
                    taken[name][i] = taken[name][before]
            flags[i] = still or None
        latest[k] = i
    for name in names:
        at = order.schema.get_field_index(name)
        order = order.set_column(at, order.schema.field(at), order.column(name).take(pa.array(taken[name])))
    at = order.schema.get_field_index(UNSENT)
    return order.set_column(at, order.schema.field(at), pa.array(flags, order.schema.field(at).type))


def merge_batch(
    table: DeltaTable,
    store: Store,
    root: LakePath,
    batch: pa.Table,
    key: Sequence[str],
    schema: pa.Schema,
    properties: CommitProperties,
    hooks: Any,
    *,
    partition_by: Sequence[str] = (),
    truncated: bool = False,
    new: Sequence[str] = (),
    deleted: str,
    now_ms: int,
) -> None:
    """Commit the MERGE of ``batch`` (its latest record per ``key``, with the column ``deleted``)
    into ``table`` at ``root`` as one commit with ``properties`` (the label) and ``hooks``;
    ``schema`` is the table's columns in order, the fields ``new`` brings included.

    Without new fields the files are written here (:func:`_merge_actions`) and committed with
    their ``add`` and ``remove`` actions. With them, the schema must change in the same commit,
    which delta-rs's commit of files written elsewhere cannot do: the rows go through
    ``write_deltalake`` (overwrite of the batch's keys, ``schema_mode="merge"``), whose files
    hold the table's types too. The commit's custom metadata says ``reclock.commit = merge``."""
    marked = CommitProperties(
        app_transactions=properties.app_transactions,
        custom_metadata={**(properties.custom_metadata or {}), MARK: "merge"},
    )
    if not new:
        actions = _merge_actions(
            table,
            store,
            root,
            batch,
            key,
            schema,
            partition_by=partition_by,
            truncated=truncated,
            deleted=deleted,
            now_ms=now_ms,
        )
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            partition_by=list(partition_by) or None,
            commit_properties=marked,
            post_commithook_properties=hooks,
        )
        return
    live = _live(batch, deleted)
    if UNSENT in live.column_names:
        held = [rows for _, rows, _ in _holders(table, store, root, batch, key, schema)] if not truncated else []
        live = _with_held(live, held, key, schema)
    write_deltalake(
        table,
        live.select(schema.names).cast(schema),
        mode="overwrite",
        predicate=None if truncated else _key_predicate(batch, key),
        schema_mode="merge",
        partition_by=list(partition_by) or None,
        commit_properties=marked,
        post_commithook_properties=hooks,
    )


#: The custom metadata key of a MERGE's commit (its Delta operation is a ``WRITE``).
MARK = "reclock.commit"


def _live(batch: pa.Table, deleted: str) -> pa.Table:
    return batch.filter(pc.invert(pc.fill_null(batch.column(deleted), False)))


def _holders(
    table: DeltaTable, store: Store, root: LakePath, batch: pa.Table, key: Sequence[str], schema: pa.Schema
) -> list[tuple[_File, pa.Table, pa.Table]]:
    """The table's files holding a key of ``batch``: each with its rows of those keys and its others."""
    keys = batch.select(list(key))
    out = []
    for f in _touching(_files(table, key[0]), keys.column(key[0])):
        group = {tuple(sorted(f.partition_values.items())): [str(root / unquote(f.path))]}
        found = _holding(read_groups(store, group, pa.schema([schema.field(k) for k in key])), keys, key)
        if not found.any():
            continue
        rows = read_groups(store, group, schema)
        hit = pa.array(found)
        out.append((f, rows.filter(hit), rows.filter(pc.invert(hit))))
    return out


def _merge_actions(
    table: DeltaTable,
    store: Store,
    root: LakePath,
    batch: pa.Table,
    key: Sequence[str],
    schema: pa.Schema,
    *,
    partition_by: Sequence[str],
    truncated: bool,
    deleted: str,
    now_ms: int,
) -> list[AddAction | RemoveAction]:
    """Steps 2 and 3: write the MERGE's files into the table's folder and return its actions.
    On an exception the files written so far are orphans for ``vacuum``."""
    output = root.name
    removes: list[AddAction | RemoveAction] = []
    adds: list[AddAction | RemoveAction] = []
    held: list[pa.Table] = []  # the table's rows of the batch's keys (their values for unsent columns)
    if truncated:
        removes = [RemoveAction(f.path, True, now_ms, f.size, dict(f.partition_values)) for f in _files(table, key[0])]
    else:
        for f, hit, kept in _holders(table, store, root, batch, key, schema):
            held.append(hit)
            removes.append(RemoveAction(f.path, True, now_ms, f.size, dict(f.partition_values)))
            if kept.num_rows:
                for written in write_data_files(root, output, kept, store, partition_by=tuple(partition_by)):
                    adds.append(_add(written, now_ms))
    live = _live(batch, deleted)
    rows = _with_held(live, held, key, schema) if UNSENT in live.column_names else live
    rows = rows.select(schema.names).cast(schema)
    if rows.num_rows:
        for written in write_data_files(root, output, rows, store, partition_by=tuple(partition_by)):
            adds.append(_add(written, now_ms))
    return [*removes, *adds]


def _key_predicate(batch: pa.Table, key: Sequence[str]) -> str:
    """A SQL predicate true exactly for the rows of ``batch``'s keys."""
    if len(key) == 1:
        values = pc.unique(batch.column(key[0]).combine_chunks())
        return f"`{key[0]}` IN ({', '.join(_literal(v) for v in values.to_pylist())})"
    rows = batch.select(list(key)).group_by(list(key)).aggregate([]).to_pylist()
    return " OR ".join("(" + " AND ".join(f"`{k}` = {_literal(row[k])}" for k in key) + ")" for row in rows)


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, date):
        return f"'{value.isoformat()}'"
    raise ValueError(f"a key value of type {type(value).__name__} has no SQL literal here: {value!r}")


def _add(written: Any, now_ms: int) -> AddAction:
    return AddAction(written.path, written.size, dict(written.partition_values), now_ms, True, written.stats)


def _files(table: DeltaTable, first: str) -> list[_File]:
    """The table's live files, with the bounds of column ``first`` where the log has them."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if not actions.num_rows:
        return []
    names = actions.column_names
    parts = [n for n in names if n.startswith("partition.")]
    lows = actions.column(f"min.{first}").to_pylist() if f"min.{first}" in names else [None] * actions.num_rows
    highs = actions.column(f"max.{first}").to_pylist() if f"max.{first}" in names else [None] * actions.num_rows
    out = []
    for i, (path, size) in enumerate(
        zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True)
    ):
        values = {n.removeprefix("partition."): _text(actions.column(n)[i].as_py()) for n in parts}
        out.append(_File(path, size, values, lows[i], highs[i]))
    return out


def _text(value: Any) -> str | None:
    """A partition value as ``partitionValues`` hold it (the flattened actions type them)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _touching(files: list[_File], first: pa.ChunkedArray | pa.Array) -> list[_File]:
    """The files whose bounds of the first key column hold one of the batch's values of it (all
    files of a column without bounds)."""
    values = pc.unique(first.combine_chunks() if isinstance(first, pa.ChunkedArray) else first).drop_null()
    if not len(values):
        return []
    ordered = pc.sort_indices(values)
    sorted_values = values.take(ordered).to_pylist()
    out = []
    for f in files:
        if f.low is None or f.high is None or not isinstance(f.low, type(sorted_values[0])):
            out.append(f)
            continue
        at = int(np.searchsorted(np.array(sorted_values, dtype=object), f.low, side="left"))
        if at < len(sorted_values) and sorted_values[at] <= f.high:
            out.append(f)
    return out


def _holding(found: pa.Table, keys: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Per row of ``found`` (a file's key columns): whether its key is one of ``keys``."""
    if len(key) == 1:
        return pc.fill_null(
            pc.is_in(found.column(key[0]), value_set=keys.column(key[0]).combine_chunks()), False
        ).to_numpy(zero_copy_only=False)
    numbered = found.append_column("__row", pa.array(np.arange(found.num_rows, dtype=np.int64)))
    joined = numbered.join(keys.group_by(list(key)).aggregate([]), list(key), join_type="inner")
    hit = np.zeros(found.num_rows, dtype=bool)
    hit[joined.column("__row").to_numpy()] = True
    return hit


def _with_held(live: pa.Table, held: list[pa.Table], key: Sequence[str], schema: pa.Schema) -> pa.Table:
    """``live`` with each value a record did not send taken from the row the table holds for
    its key (null if the table holds none: the value is known nowhere)."""
    flags: list[list[str] | None] = live.column(UNSENT).to_pylist()
    names = sorted({name for f in flags if f for name in f})
    if not names:
        return live
    table = pa.concat_tables(held) if held else schema.empty_table()
    numbered = live.select(list(key)).append_column("__row", pa.array(np.arange(live.num_rows, dtype=np.int64)))
    target = table.select(list(key)).append_column("__held", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    joined = numbered.join(target, list(key), join_type="left outer").sort_by("__row")
    where = joined.column("__held")
    for name in names:
        flag = pa.array([f is not None and name in f for f in flags])
        at = live.schema.get_field_index(name)
        kept = table.column(name).take(where).cast(live.schema.field(at).type)
        live = live.set_column(at, live.schema.field(at), pc.if_else(flag, kept, live.column(name)))
    return live
