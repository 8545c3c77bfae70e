"""Row changes of committed transactions, as the Arrow batches of their outputs.

A reader hands every change of a transaction to :class:`ChangeBatches` once the transaction's
Commit arrived (the stream) or a snapshot chunk's rows (the snapshot); both carry the source time
``_offset``: the transaction's commit LSN, or for the snapshot the LSN just below the slot's
consistent point, so that every row of one transaction, in every table, is complete at the same
binding. The stream may instead hand many committed transactions at once, column by column
(:meth:`ChangeBatches.columns`, for the plain changes of ``upsert`` outputs): the same rows in the
same order, without a Python object per value.

* ``upsert`` outputs get the table's columns and an explicit ``_deleted``; within a transaction
  only the last change of a key is kept (they share one ``_offset``, and the upsert keeps the
  latest offset per key, so two rows of one key at one offset would leave the winner to chance).
  An update that changes the key deletes the old key. A TRUNCATE drops the transaction's
  earlier changes of its table and becomes one record marked ``_truncated`` (no key), placed
  before the transaction's later changes of the table: the sink's MERGE then empties the output
  at that point, in the batch's one commit. A TOASTed value the update did not change
  (``u``) is taken from the old row (replica identity full) or from the key's earlier change in
  the same transaction; when neither has it the change lands with that column null and named in
  ``_unsent``, and the sink's MERGE keeps the value the output holds for it (an earlier record's
  of the batch, or the table's), so the default replica identity mirrors the table too.
* ``append`` outputs get one row per change: ``before``, ``after``, ``op``, ``commit_lsn``,
  ``xid`` and ``seq`` (its order in the transaction). An update whose TOASTed value was not sent
  and is not in its old row has no earlier row here to take it from: it goes to ``_errors``
  (``unchanged_toast``), naming the column and the statement to run.

**Columns added** to a table after its output was made come after the output's columns in a
change's rows, named by the change (``added``). For an output that evolves its schema (the
runtime asks, :meth:`~reclock.sources.postgres.source.PostgresSource.keep_unknown_fields`) they
go on as the record's unknown fields, one JSON object of text values (an ``append`` output: the
new row's, or the old row's for a delete), and the output's ``schema_evolution`` decides; other
outputs ignore them.

Values are typed per column in one go (:func:`~reclock.sources.postgres.columns.typed_column`);
a value its column's type cannot hold (``NaN`` in a decimal, an ``infinity`` timestamp) is null
there and kept as text in the row's ``_unheld`` (:data:`~reclock.sources.postgres.columns.UNHELD`),
so the change still lands whole. Only a value of a column that has no such place (a type whose
every value its Arrow type holds, should the server ever send another) sends the change to
``_errors``, naming the table, the column and the value.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.envelope import UPSERT
from reclock.sources.base import ERRORS, RecordError, error_batch
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.pgoutput import UNCHANGED
from reclock.sources.postgres.values import (
    cannot_hold,
    toast_message,
    typed_rows,
    unsent_column,
    unsent_names,
    with_unchanged,
)
from reclock.timeline.frontier import OFFSET, PARTITION, UNKNOWN_FIELDS

__all__ = ["DELETED", "TRUNCATED", "UNSENT", "Change", "ChangeBatches", "ChangeColumns", "TableColumns"]

DELETED = "_deleted"
#: The sink's staged column that marks a TRUNCATE record of an upsert output.
TRUNCATED = "_truncated"
#: The sink's staged column naming the columns an upsert record did not send (unchanged TOAST).
UNSENT = "_unsent"

#: The key of a transaction's TRUNCATE of a table among its changes by key (no real key is empty).
_TRUNCATE: tuple = ()

Row = tuple  # the text values of one row, in the table's column order (None: null)


class Change(NamedTuple):
    """One change of a table: ``op`` is ``c``, ``u``, ``d``, ``t`` (truncate) or ``r`` (snapshot).
    Rows hold the output's columns, then the values of the columns ``added`` since it was made.

    An immutable named tuple rather than a frozen dataclass: a reader makes one per row, and a
    batch's changes transpose into its columns in one ``zip``."""

    op: str
    old: Row | None
    new: Row | None
    added: tuple[str, ...] = ()


@dataclass
class _Waiting:
    """One output's changes waiting for their batch, in order: each with its ``seq`` in its
    transaction, and per transaction its offset, commit LSN, xid and how many of them it has."""

    changes: list[Change] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    runs: list[tuple[int, int, int | None, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.changes)

    def pending(self) -> _Pending:
        ops, olds, news, addeds = zip(*self.changes, strict=True) if self.changes else ((), (), (), ())
        return _Pending(
            offsets=_repeated(self.runs, 0),
            lsns=_repeated(self.runs, 1),
            xids=_repeated(self.runs, 2),
            seqs=self.seqs,
            ops=ops,
            olds=olds,
            news=news,
            addeds=addeds,
        )


@dataclass(frozen=True)
class _Pending:
    """A batch's changes of one output, field by field."""

    offsets: list[int]
    lsns: list[int]
    xids: list[int | None]
    seqs: list[int]
    ops: Sequence[str]
    olds: Sequence[Row | None]
    news: Sequence[Row | None]
    addeds: Sequence[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.offsets)


def _repeated(runs: list[tuple[int, int, int | None, int]], field: int) -> list:
    return list(chain.from_iterable(repeat(run[field], run[3]) for run in runs))


@dataclass(frozen=True)
class TableColumns:
    """One output's changes among a :class:`ChangeColumns`: their positions there (ascending),
    their kinds (``I``, ``U``, ``D`` as bytes) and, per column (the output's, then those
    ``added``), the text of the row each lands: an insert's or update's new row, a delete's old
    key or row."""

    output: str
    at: np.ndarray
    kinds: np.ndarray
    columns: list[pa.Array]


@dataclass(frozen=True)
class ChangeColumns:
    """Changes of committed transactions, column by column (:meth:`ChangeBatches.columns`): per
    transaction its source time (``offsets``, the commit LSN) and xid; per change, in commit
    order, its transaction's index (``txn``, ascending); and the changes by output."""

    offsets: np.ndarray
    xids: Sequence[int | None]
    txn: np.ndarray
    tables: Sequence[TableColumns]


_KIND_OPS = {ord("I"): "c", ord("U"): "u", ord("D"): "d"}
_DELETE_KIND = ord("D")


class ChangeBatches:
    """Collects changes per table and yields ``(output, batch)`` pairs of at most ``flush_rows``."""

    def __init__(
        self,
        specs: Sequence[TableSpec],
        envelope: str,
        partition: str,
        *,
        flush_rows: int = 50_000,
        fail: bool = False,
        unknown: Collection[str] = (),
    ) -> None:
        self.specs = {spec.output: spec for spec in specs}
        self.unknown = frozenset(unknown)
        self.envelope = envelope
        self.partition = partition
        self.flush_rows = flush_rows
        self.fail = fail
        self._waiting: dict[str, _Waiting] = {}
        #: Per output, its key's values in a row (positions worked out once, not per change).
        self._keys: dict[str, Callable[[Row], Any]] = {output: _key_of(spec) for output, spec in self.specs.items()}
        self._errors: list[tuple[int, str, str, bytes | None]] = []

    def transaction(
        self, offset: int, lsn: int, xid: int | None, changes: Sequence[tuple[str, Change]]
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Add the changes ``(output, change)`` of one committed transaction, in their order, at
        source time ``offset``; ``lsn`` is its commit LSN (the snapshot's: the slot's consistent point)."""
        if self.envelope == UPSERT:
            changes = self._last_per_key(offset, changes)
        waiting = self._waiting
        counts: dict[str, int] = {}
        for seq, (output, change) in enumerate(changes):
            into = waiting.get(output)
            if into is None:
                into = waiting[output] = _Waiting()
            into.changes.append(change)
            into.seqs.append(seq)
            counts[output] = counts.get(output, 0) + 1
        for output, count in counts.items():
            waiting[output].runs.append((offset, lsn, xid, count))
        yield from self._flush(full_only=True)

    def drops(self, output: str, lsn: int) -> bool:
        """Whether ``output``'s changes of the transaction committed at ``lsn`` are dropped (a
        reader then does not check the table's definition they came under): none here."""
        return False

    def takes_columns(self, output: str) -> bool:
        """Whether :meth:`columns` can take ``output``'s changes: an ``upsert`` output whose
        unknown fields are not kept (every other output takes :meth:`transaction`)."""
        return self.envelope == UPSERT and output in self.specs and output not in self.unknown

    def columns(self, changes: ChangeColumns) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Add the changes of committed transactions given column by column, exactly as
        :meth:`transaction` would take them one transaction after the other; only for outputs
        that :meth:`takes_columns`, and for inserts, updates and deletes that each carry one row
        (no truncate, no update sending its old key or row, no unsent TOAST value).

        Step 1 keeps, per output, the last change of each key in each transaction (a group-by of
        transaction and key, the greatest position); step 2 numbers the kept changes within
        their transaction across outputs (``seq``, as :meth:`transaction` does); step 3 types
        each output's kept rows, sends values their column cannot hold to ``_errors``, and
        yields the output's batch, after any of its changes still waiting from
        :meth:`transaction`, so the order stays the commit order."""
        # Step 1: the last change of each key in each transaction
        kept: list[np.ndarray] = []
        for table in changes.tables:
            assert self.takes_columns(table.output), f"output {table.output} takes transactions, not columns"
            spec = self.specs[table.output]
            txn = changes.txn[table.at]
            keyed = {f"k{i}": table.columns[i] for i, c in enumerate(spec.columns) if c.name in spec.key}
            grouped = pa.table({"txn": txn, "pos": np.arange(len(txn)), **keyed})
            last = grouped.group_by(["txn", *keyed], use_threads=False).aggregate([("pos", "max")])
            kept.append(np.sort(last.column("pos_max").to_numpy()))
        # Step 2: seq, the kept changes' order in their transaction
        every = np.sort(np.concatenate([t.at[k] for t, k in zip(changes.tables, kept, strict=True)]))
        txn_of_every = changes.txn[every]
        seq_of_every = np.arange(len(every)) - np.searchsorted(txn_of_every, txn_of_every, side="left")
        # Step 3: each output's batch
        for table, keep in zip(changes.tables, kept, strict=True):
            spec = self.specs[table.output]
            waiting = self._waiting.pop(table.output, None)
            if waiting is not None:
                yield from self._batch(table.output, waiting.pending())
            take = pa.array(keep, pa.int64())
            texts = [column.take(take) for column in table.columns]
            txn = changes.txn[table.at[keep]]
            kinds = table.kinds[keep]
            columns, wrong = typed_rows(spec, texts[: len(spec.columns)], len(keep))  # added columns come after
            offsets = changes.offsets[txn]
            if wrong:
                seqs = seq_of_every[np.searchsorted(every, table.at[keep])]
                for i in sorted(wrong):
                    row = tuple(values[i].as_py() for values in texts)
                    op = _KIND_OPS[int(kinds[i])]
                    self._reject_change(
                        spec,
                        int(offsets[i]),
                        Change(op, row if op == "d" else None, None if op == "d" else row),
                        changes.xids[int(txn[i])],
                        int(seqs[i]),
                        "decode",
                        cannot_hold(spec, *wrong[i]),
                    )
            deleted = pa.array(kinds == _DELETE_KIND)
            arrays = [
                pa.array([self.partition] * len(keep), pa.string()),
                pa.array(offsets, pa.int64()),
                *columns,
                deleted,
                pa.array(np.zeros(len(keep), np.bool_)),
                pa.nulls(len(keep), pa.list_(pa.string())),  # these changes sent every value
            ]
            if wrong:
                rows = pa.array([i for i in range(len(keep)) if i not in wrong], pa.int64())
                arrays = [array.take(rows) for array in arrays]
            names = [PARTITION, OFFSET, *spec.row_schema.names, DELETED, TRUNCATED, UNSENT]
            yield table.output, pa.RecordBatch.from_arrays(arrays, names=names)
        yield from self._flush(full_only=True)

    def finish(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Everything still pending."""
        yield from self._flush(full_only=False)

    def _last_per_key(self, offset: int, changes: Sequence[tuple[str, Change]]) -> list[tuple[str, Change]]:
        latest: dict[tuple[str, Any], Change] = {}
        keys = self._keys
        for output, change in changes:
            op, old, new = change.op, change.old, change.new
            if op == "t":
                for earlier in [k for k in latest if k[0] == output]:
                    del latest[earlier]
                latest[(output, _TRUNCATE)] = change
                continue
            key = keys[output]
            if old is not None and op in ("u", "d"):
                old_key = (output, key(old))
                if op == "u" and new is not None and UNCHANGED in new:
                    new = _filled(new, old, latest.get(old_key))
                    change = Change(op, old, new, change.added)
                if op == "d" or (output, key(new)) != old_key:  # type: ignore[arg-type]
                    latest.pop(old_key, None)
                    latest[old_key] = Change("d", old, None, change.added)
            if new is not None:
                new_key = (output, key(new))
                if UNCHANGED in new:
                    change = Change(op, old, _filled(new, None, latest.get(new_key)), change.added)
                latest.pop(new_key, None)  # re-inserted: its position is its last change's
                latest[new_key] = change
        return [(output, change) for (output, _), change in latest.items()]

    def _flush(self, *, full_only: bool) -> Iterator[tuple[str, pa.RecordBatch]]:
        for output in list(self._waiting):
            waiting = self._waiting[output]
            if full_only and len(waiting) < self.flush_rows:
                continue
            del self._waiting[output]
            yield from self._batch(output, waiting.pending())
        if self._errors and (not full_only or len(self._errors) >= self.flush_rows):
            errors, self._errors = self._errors, []
            offsets, kinds, messages, raws = zip(*errors, strict=True)
            yield ERRORS, error_batch(self.partition, list(offsets), list(kinds), list(messages), list(raws))

    def _batch(self, output: str, pending: _Pending) -> Iterator[tuple[str, pa.RecordBatch]]:
        spec = self.specs[output]
        n = len(pending)
        if self.envelope == UPSERT:
            rows = [new if new is not None else old for new, old in zip(pending.news, pending.olds, strict=True)]
            # a value the server did not send (unchanged TOAST) lands null, named in _unsent: the
            # sink's MERGE keeps the output's value of it (an earlier record's, or the table's)
            unsent = with_unchanged(rows)
            columns, wrong = self._typed(spec, rows)
            self._reject_values(spec, pending, wrong)
            keep = [i for i in range(n) if i not in wrong]
            ops = pa.array(pending.ops, pa.string())
            deleted, truncated = pc.is_in(ops, pa.array(["d", "t"])), pc.equal(ops, "t")
            arrays = [*self._lineage(pending, keep), *columns, deleted, truncated]
            arrays.append(unsent_column(spec, rows, unsent))
            names = [PARTITION, OFFSET, *spec.row_schema.names, DELETED, TRUNCATED, UNSENT]
            if wrong:
                take = pa.array(keep, pa.int64())
                arrays[2:] = [array.take(take) for array in arrays[2:]]
            if output in self.unknown:
                arrays.append(_unknown(spec, rows, pending.addeds, keep))
                names.append(UNKNOWN_FIELDS)
            yield output, pa.RecordBatch.from_arrays(arrays, names=names)
            return
        unsent = with_unchanged(pending.news)
        for i in sorted(unsent):  # an append output has no earlier row to keep a value from
            self._reject(spec, pending, i, "unchanged_toast", toast_message(spec, unsent_names(spec, pending.news[i])))
        befores, wrong_before = self._typed(spec, pending.olds)
        afters, wrong_after = self._typed(spec, pending.news)
        wrong = {**wrong_after, **wrong_before}
        self._reject_values(spec, pending, {i: w for i, w in wrong.items() if i not in unsent})
        keep = [i for i in range(n) if i not in wrong and i not in unsent]
        take = pa.array(keep, pa.int64())
        row_type = pa.struct(list(spec.row_schema))
        arrays = [
            *self._lineage(pending, keep),
            _struct(befores, row_type, [pending.olds[i] is None for i in keep], take),
            _struct(afters, row_type, [pending.news[i] is None for i in keep], take),
            pa.array([pending.ops[i] for i in keep], pa.string()),
            pa.array([pending.lsns[i] for i in keep], pa.int64()),
            pa.array([pending.xids[i] for i in keep], pa.int64()),
            pa.array([pending.seqs[i] for i in keep], pa.int64()),
        ]
        names = [PARTITION, OFFSET, "before", "after", "op", "commit_lsn", "xid", "seq"]
        if output in self.unknown:
            rows = [new if new is not None else old for new, old in zip(pending.news, pending.olds, strict=True)]
            arrays.append(_unknown(spec, rows, pending.addeds, keep))
            names.append(UNKNOWN_FIELDS)
        yield output, pa.RecordBatch.from_arrays(arrays, names=names)

    def _lineage(self, pending: _Pending, keep: list[int]) -> list[pa.Array]:
        offsets = pending.offsets if len(keep) == len(pending) else [pending.offsets[i] for i in keep]
        return [pa.array([self.partition] * len(keep), pa.string()), pa.array(offsets, pa.int64())]

    def _typed(self, spec: TableSpec, rows: Sequence[Row | None]) -> tuple[list[pa.Array], dict[int, tuple[str, Any]]]:
        """Per column of the output's rows (``_unheld`` included), the typed values of ``rows``
        (a missing row or an unsent value is null), and the rows with a value no column holds."""
        width = len(spec.columns)
        if None in rows:
            missing = (None,) * width
            rows = [missing if row is None else row for row in rows]
        # rows may be wider than the output (columns added), never narrower
        texts: list[Sequence[Any]] = list(zip(*rows, strict=False))[:width] if rows else [()] * width
        texts = [[None if v is UNCHANGED else v for v in values] if UNCHANGED in values else values for values in texts]
        return typed_rows(spec, texts, len(rows))

    def _reject_values(self, spec: TableSpec, pending: _Pending, wrong: dict[int, tuple[str, Any]]) -> None:
        for i in sorted(wrong):
            self._reject(spec, pending, i, "decode", cannot_hold(spec, *wrong[i]))

    def _reject(self, spec: TableSpec, pending: _Pending, i: int, kind: str, message: str) -> None:
        change = Change(pending.ops[i], pending.olds[i], pending.news[i])
        self._reject_change(spec, pending.offsets[i], change, pending.xids[i], pending.seqs[i], kind, message)

    def _reject_change(
        self, spec: TableSpec, offset: int, change: Change, xid: int | None, seq: int, kind: str, message: str
    ) -> None:
        raw = {
            "table": spec.table.qualified,
            "op": change.op,
            "xid": xid,
            "seq": seq,
            "old": _jsonable(change.old),
            "new": _jsonable(change.new),
        }
        if self.fail:
            raise RecordError(f"{message} (commit LSN {offset})")
        self._errors.append((offset, kind, message, json.dumps(raw).encode()))


def _key_of(spec: TableSpec) -> Callable[[Row], Any]:
    """The values of ``spec``'s key in one of its rows (one value for a one-column key)."""
    at = [i for i, c in enumerate(spec.columns) if c.name in spec.key]
    if not at:
        return lambda row: ()
    return operator.itemgetter(*at)


def _filled(new: Row, old: Row | None, before: Change | None) -> Row:
    """``new`` with each unsent TOAST value taken from the old row or the key's earlier change."""
    sources = [r for r in (old, before.new if before is not None else None) if r is not None]
    values = list(new)
    for j, value in enumerate(values):
        if value is UNCHANGED:
            for row in sources:
                if j < len(row) and row[j] is not UNCHANGED:
                    values[j] = row[j]
                    break
    return tuple(values)


def _unknown(
    spec: TableSpec, rows: Sequence[Row | None], addeds: Sequence[tuple[str, ...]], keep: list[int]
) -> pa.Array:
    """Per kept row, its values of the columns added since the output was made, as one JSON
    object (null when there are none; an unsent TOAST value as null)."""
    width = len(spec.columns)
    out: list[str | None] = []
    for i in keep:
        row, added = rows[i], addeds[i]
        if row is None or not added:
            out.append(None)
            continue
        values = row[width:]
        fields = {name: None if v is UNCHANGED else v for name, v in zip(added, values, strict=True)}
        out.append(json.dumps(fields, separators=(",", ":"), ensure_ascii=False))
    return pa.array(out, pa.string())


def _struct(columns: list[pa.Array], row_type: pa.StructType, missing: list[bool], take: pa.Array) -> pa.Array:
    fields = [column.take(take) for column in columns]
    return pa.StructArray.from_arrays(fields, fields=list(row_type), mask=pa.array(missing, pa.bool_()))


def _jsonable(row: Row | None) -> list[str | None] | None:
    if row is None:
        return None
    return ["<unchanged toast>" if v is UNCHANGED else v for v in row]
