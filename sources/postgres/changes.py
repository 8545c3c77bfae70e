"""Row changes of committed transactions, as the Arrow batches of their outputs.

A reader hands every change of a transaction to :class:`ChangeBatches` once the transaction's
Commit arrived (the stream) or a snapshot chunk's rows (the snapshot); both carry the source time
``_offset``: the transaction's commit LSN, or for the snapshot the LSN just below the slot's
consistent point, so that every row of one transaction, in every table, is complete at the same
binding.

* ``upsert`` outputs get the table's columns and an explicit ``_deleted``; within a transaction
  only the last change of a key is kept (they share one ``_offset``, and the upsert keeps the
  latest offset per key, so two rows of one key at one offset would leave the winner to chance).
  An update that changes the key deletes the old key. A TRUNCATE drops the transaction's
  earlier changes of its table and becomes one record marked ``_truncated`` (no key), placed
  before the transaction's later changes of the table: the sink's MERGE then empties the output
  at that point, in the batch's one commit. A TOASTed value the update did not change
  (``u``) is taken from the old row (replica identity full) or from the key's earlier change in
  the same transaction; when neither has it the change cannot be mirrored and goes to ``_errors``
  saying what to run.
* ``append`` outputs get one row per change: ``before``, ``after``, ``op``, ``commit_lsn``,
  ``xid`` and ``seq`` (its order in the transaction).

**Columns added** to a table after its output was made come after the output's columns in a
change's rows, named by the change (``added``). For an output that evolves its schema (the
runtime asks, :meth:`~reclock.sources.postgres.source.PostgresSource.keep_unknown_fields`) they
go on as the record's unknown fields, one JSON object of text values (an ``append`` output: the
new row's, or the old row's for a delete), and the output's ``schema_evolution`` decides; other
outputs ignore them.

Values are typed per column in one go (:func:`~reclock.sources.postgres.columns.typed_column`);
a change with a value its column's type cannot hold goes to ``_errors`` with its coordinates.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from reclock.sources.base import ERRORS, RecordError, error_batch
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.columns import typed_column
from reclock.sources.postgres.pgoutput import UNCHANGED
from reclock.timeline.frontier import OFFSET, PARTITION, UNKNOWN_FIELDS

__all__ = ["DELETED", "TRUNCATED", "Change", "ChangeBatches"]

DELETED = "_deleted"
#: The sink's staged column that marks a TRUNCATE record of an upsert output.
TRUNCATED = "_truncated"

#: The key of a transaction's TRUNCATE of a table among its changes by key (no real key is empty).
_TRUNCATE: tuple = ()

Row = tuple  # the text values of one row, in the table's column order (None: null)


@dataclass(frozen=True)
class Change:
    """One change of a table: ``op`` is ``c``, ``u``, ``d``, ``t`` (truncate) or ``r`` (snapshot).
    Rows hold the output's columns, then the values of the columns ``added`` since it was made."""

    op: str
    old: Row | None
    new: Row | None
    added: tuple[str, ...] = ()


@dataclass
class _Pending:
    offsets: list[int] = field(default_factory=list)
    lsns: list[int] = field(default_factory=list)
    xids: list[int | None] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    olds: list[Row | None] = field(default_factory=list)
    news: list[Row | None] = field(default_factory=list)
    addeds: list[tuple[str, ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)


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
        self._pending: dict[str, _Pending] = {}
        self._errors: list[tuple[int, str, str, bytes | None]] = []

    def transaction(
        self, offset: int, lsn: int, xid: int | None, changes: Sequence[tuple[str, Change]]
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Add the changes ``(output, change)`` of one committed transaction, in their order, at
        source time ``offset``; ``lsn`` is its commit LSN (the snapshot's: the slot's consistent point)."""
        if self.envelope == "upsert":
            changes = self._last_per_key(offset, changes)
        for seq, (output, change) in enumerate(changes):
            pending = self._pending.setdefault(output, _Pending())
            pending.offsets.append(offset)
            pending.lsns.append(lsn)
            pending.xids.append(xid)
            pending.seqs.append(seq)
            pending.ops.append(change.op)
            pending.olds.append(change.old)
            pending.news.append(change.new)
            pending.addeds.append(change.added)
        yield from self._flush(full_only=True)

    def finish(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Everything still pending."""
        yield from self._flush(full_only=False)

    def _last_per_key(self, offset: int, changes: Sequence[tuple[str, Change]]) -> list[tuple[str, Change]]:
        latest: dict[tuple[str, Row], Change] = {}
        for output, change in changes:
            spec = self.specs[output]
            if change.op == "t":
                for earlier in [k for k in latest if k[0] == output]:
                    del latest[earlier]
                latest[(output, _TRUNCATE)] = change
                continue
            key_at = [i for i, c in enumerate(spec.columns) if c.name in spec.key]
            if change.op in ("u", "d") and change.old is not None:
                old_key = tuple(change.old[i] for i in key_at)
                before = latest.get((output, old_key))
                if change.op == "u" and change.new is not None and UNCHANGED in change.new:
                    change = Change(change.op, change.old, _filled(change.new, change.old, before), change.added)
                if change.op == "d" or tuple(change.new[i] for i in key_at) != old_key:  # type: ignore[index]
                    latest.pop((output, old_key), None)
                    latest[(output, old_key)] = Change("d", change.old, None, change.added)
            if change.new is not None:
                new_key = tuple(change.new[i] for i in key_at)
                before = latest.get((output, new_key))
                if UNCHANGED in change.new:
                    change = Change(change.op, change.old, _filled(change.new, None, before), change.added)
                latest.pop((output, new_key), None)  # re-inserted: its position is its last change's
                latest[(output, new_key)] = change
        return [(output, change) for (output, _), change in latest.items()]

    def _flush(self, *, full_only: bool) -> Iterator[tuple[str, pa.RecordBatch]]:
        for output in list(self._pending):
            pending = self._pending[output]
            if full_only and len(pending) < self.flush_rows:
                continue
            del self._pending[output]
            yield from self._batch(output, pending)
        if self._errors and (not full_only or len(self._errors) >= self.flush_rows):
            errors, self._errors = self._errors, []
            offsets, kinds, messages, raws = zip(*errors, strict=True)
            yield ERRORS, error_batch(self.partition, list(offsets), list(kinds), list(messages), list(raws))

    def _batch(self, output: str, pending: _Pending) -> Iterator[tuple[str, pa.RecordBatch]]:
        spec = self.specs[output]
        n = len(pending)
        bad: set[int] = set()
        if self.envelope == "upsert":
            rows = [new if new is not None else old for new, old in zip(pending.news, pending.olds, strict=True)]
            for i, row in enumerate(rows):
                if row is not None and UNCHANGED in row:
                    self._reject(spec, pending, i, "unchanged_toast", _toast_message(spec))
                    bad.add(i)
            columns, wrong = self._typed(spec, [None if i in bad else r for i, r in enumerate(rows)])
            self._reject_values(spec, pending, wrong - bad)
            keep = [i for i in range(n) if i not in bad and i not in wrong]
            deleted = pa.array([pending.ops[i] in ("d", "t") for i in keep], pa.bool_())
            truncated = pa.array([pending.ops[i] == "t" for i in keep], pa.bool_())
            own = [column.take(pa.array(keep, pa.int64())) for column in columns]
            names = [c.name for c in spec.columns]
            arrays = [*self._lineage(pending, keep), *own, deleted, truncated]
            names = [PARTITION, OFFSET, *names, DELETED, TRUNCATED]
            if output in self.unknown:
                arrays.append(_unknown(spec, rows, pending.addeds, keep))
                names.append(UNKNOWN_FIELDS)
            yield output, pa.RecordBatch.from_arrays(arrays, names=names)
            return
        befores, wrong_before = self._typed(spec, pending.olds)
        afters, wrong_after = self._typed(spec, pending.news)
        wrong = wrong_before | wrong_after
        self._reject_values(spec, pending, wrong)
        keep = [i for i in range(n) if i not in wrong]
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
        return [
            pa.array([self.partition] * len(keep), pa.string()),
            pa.array([pending.offsets[i] for i in keep], pa.int64()),
        ]

    def _typed(self, spec: TableSpec, rows: Sequence[Row | None]) -> tuple[list[pa.Array], set[int]]:
        """Per column, the typed values of ``rows`` (a missing row or an unsent value is null),
        and the positions of rows with a value its column cannot hold."""
        columns, wrong = [], set()
        for j, column in enumerate(spec.columns):
            texts = [None if row is None or row[j] is UNCHANGED else row[j] for row in rows]
            array, bad = typed_column(texts, column.arrow)
            columns.append(array)
            wrong.update(bad)
        return columns, wrong

    def _reject_values(self, spec: TableSpec, pending: _Pending, wrong: set[int]) -> None:
        for i in sorted(wrong):
            self._reject(spec, pending, i, "decode", f"table {spec.table.qualified}: a value its column cannot hold")

    def _reject(self, spec: TableSpec, pending: _Pending, i: int, kind: str, message: str) -> None:
        raw = {
            "table": spec.table.qualified,
            "op": pending.ops[i],
            "xid": pending.xids[i],
            "seq": pending.seqs[i],
            "old": _jsonable(pending.olds[i]),
            "new": _jsonable(pending.news[i]),
        }
        if self.fail:
            raise RecordError(f"{message} (commit LSN {pending.offsets[i]})")
        self._errors.append((pending.offsets[i], kind, message, json.dumps(raw).encode()))


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


def _toast_message(spec: TableSpec) -> str:
    return (
        f"table {spec.table.qualified}: an update left a TOASTed value unchanged and the server did not send it; "
        f"run ALTER TABLE {spec.table.quoted} REPLICA IDENTITY FULL so updates carry it"
    )
