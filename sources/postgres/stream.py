"""The reader of a replication range: every transaction whose commit LSN is in ``[start, end)``.

It runs in a Spark task (or the driver's data plane) on its own replication connection:
``START_REPLICATION SLOT <slot> LOGICAL <start>`` makes the server send, in commit order, every
transaction whose commit record is at or after ``start`` (and after the slot's
``confirmed_flush_lsn``, which the committer never moves past the resume frontier, so a replayed
range is always still there). The reader stops at the first transaction whose commit LSN is
``end`` or more, or once the server says it has read its WAL to ``end`` (the ``wal_end`` of a
keepalive the reader asks for) with no transaction open. A transaction's changes are handed on
only at its Commit, all at its commit LSN: a transaction is in a range whole or not at all.

While it reads, the reader answers the server on a timer (``feedback_interval_s``: a standby
status update) so that ``wal_sender_timeout`` never cuts a long read. The reader confirms
nothing itself, but psycopg2 does: on a keepalive that came before any change on the connection,
it takes the keepalive's position as flushed and reports it in the next update. The server sends
a change before it moves that position past the change's commit, so the slot can only be
confirmed over WAL without a change of the publication, which a replay of the range would not
read either (docs/sources/postgres.md, "Offsets committed upstream").
A read that sees no progress for ``read_timeout_s`` is a transient error: the batch is retried.

Row changes (``I``, ``U``, ``D``) of the tables the pipeline reads are kept as the server sent them
and decoded together once the committed transactions hold :data:`DECODE_ROWS` of them, or at the
end of the range (:mod:`~reclock.sources.postgres.pgoutput`'s bulk decoders): as Arrow columns
when every change is plain, else as rows, transaction by transaction. Either way a transaction
is handed on whole and in commit order. Messages of tables the pipeline does not read are
skipped undecoded.

A ``Relation`` message (sent before a table's first change in a session, and again after its
definition changed) is matched with the table's spec by column name: a column of the output
missing (dropped, renamed) or of another type than the output holds is a definite error naming
the table and the column (except in a transaction whose changes of the table the reader drops:
below a joined table's copy, :mod:`~reclock.sources.postgres.joining`); columns added come after
the output's in each change's rows, named (:class:`~reclock.sources.postgres.changes.Change`),
for the output's ``schema_evolution``.
"""

from __future__ import annotations

import operator
import select
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from reclock.errors import DefiniteSourceError
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.changes import Change, ChangeBatches, ChangeColumns, TableColumns
from reclock.sources.postgres.clients import PostgresUnavailable, replication, server_errors
from reclock.sources.postgres.columns import arrow_type
from reclock.sources.postgres.pgoutput import (
    Begin,
    Commit,
    Relation,
    Truncate,
    Tuple,
    decode_message,
    lsn_text,
)
from reclock.sources.postgres.pgoutput_bulk import decode_changes, decode_columns

__all__ = ["read_range"]


def read_range(
    dsn: str,
    slot: str,
    publication: str,
    specs: Sequence[TableSpec],
    batches: ChangeBatches,
    start: int,
    end: int,
    *,
    read_timeout_s: float,
    feedback_interval_s: float,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Every change committed in ``[start, end)``, as ``batches`` builds them (see the module docstring)."""
    by_name = {spec.table.qualified: spec for spec in specs}
    relations: dict[bytes, _Columns | None] = {}  # by the relation id's 4 bytes, as a message carries it
    conn, cursor = replication(dsn, slot, publication, start, wait_s=read_timeout_s)
    try:
        with server_errors(slot, publication):
            txn: tuple[Begin, list[_Item]] | None = None
            pending = _Committed()
            last_progress = last_feedback = time.monotonic()
            cursor.send_feedback(reply=True)
            while True:
                message = cursor.read_message()
                now = time.monotonic()
                if now - last_feedback >= feedback_interval_s:
                    cursor.send_feedback(reply=True)
                    last_feedback = now
                if message is None:
                    if txn is None and cursor.wal_end >= end:
                        break
                    if now - last_progress > read_timeout_s:
                        raise PostgresUnavailable(
                            f"replication slot {slot}: no progress towards LSN {lsn_text(end)} for {read_timeout_s} s "
                            f"(server at {lsn_text(cursor.wal_end)})"
                        )
                    select.select([cursor], [], [], min(feedback_interval_s, 0.5))
                    if time.monotonic() - last_feedback >= min(feedback_interval_s, 0.5):
                        cursor.send_feedback(reply=True)  # ask where the server's WAL is
                        last_feedback = time.monotonic()
                    continue
                last_progress = now
                payload = message.payload
                if payload[:1] in _ROW_CHANGES:  # the hot path: kept as bytes, decoded in bulk
                    assert txn is not None, "a change outside a transaction"
                    columns = relations.get(payload[1:5], _UNSEEN)
                    if columns is _UNSEEN:  # a relation never announced: not read, but checked
                        decode_message(payload)
                    elif columns is not None:  # None: a table of the publication the pipeline does not read
                        txn[1].append(len(pending.payloads))
                        pending.payloads.append(payload)
                        pending.columns.append(columns)
                    continue
                decoded = decode_message(payload)
                if isinstance(decoded, Begin):
                    if decoded.final_lsn >= end:
                        break
                    txn = (decoded, [])
                elif isinstance(decoded, Commit):
                    assert txn is not None, "Commit without Begin"
                    pending.transactions.append(txn)
                    txn = None
                    if len(pending.payloads) >= DECODE_ROWS:
                        yield from pending.land(batches)
                        pending = _Committed()
                elif isinstance(decoded, Relation):
                    lsn = None if txn is None else txn[0].final_lsn
                    relations[_U32.pack(decoded.relation_id)] = _checked(decoded, by_name, batches, lsn)
                elif isinstance(decoded, Truncate):
                    assert txn is not None, "a change outside a transaction"
                    txn[1].extend(_truncated(decoded, relations))
                    pending.truncates = True
            yield from pending.land(batches)
        yield from batches.finish()
    finally:
        conn.close()


#: Row changes decoded together (:func:`~reclock.sources.postgres.pgoutput_bulk.decode_changes`): the
#: committed transactions read so far are decoded and handed on once they hold this many.
DECODE_ROWS = 20_000

_ROW_CHANGES = (b"I", b"U", b"D")
_OPS = {"I": "c", "U": "u", "D": "d"}
_U32 = struct.Struct(">I")
_UNSEEN: Any = object()

#: One change of a transaction as read: a row change's place among the undecoded payloads, or a
#: truncate's change, ready.
_Item = int | tuple[str, Change]


@dataclass
class _Committed:
    """Committed transactions whose row changes wait, as payloads, to be decoded together."""

    payloads: list[bytes] = field(default_factory=list)
    columns: list[_Columns] = field(default_factory=list)
    transactions: list[tuple[Begin, list[_Item]]] = field(default_factory=list)
    truncates: bool = False

    def land(self, batches: ChangeBatches) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Hand the transactions to ``batches`` in commit order: as columns when they are plain
        (:meth:`columns`), else decoded at once into rows, one transaction after the other."""
        plain = None if self.truncates or not self.payloads else self.as_columns(batches)
        if plain is not None:
            yield from batches.columns(plain)
            return
        rows = decode_changes(self.payloads)
        kinds, olds, news = rows.kinds, rows.olds, rows.news
        for begin, items in self.transactions:
            changes: list[tuple[str, Change]] = []
            for item in items:
                if isinstance(item, int):
                    columns = self.columns[item]
                    change = Change(_OPS[kinds[item]], columns.row(olds[item]), columns.row(news[item]), columns.added)
                    changes.append((columns.output, change))
                else:
                    changes.append(item)
            yield from batches.transaction(begin.final_lsn, begin.final_lsn, begin.xid, changes)

    def as_columns(self, batches: ChangeBatches) -> ChangeColumns | None:
        """The row changes as columns, if every output takes them and each table's messages are
        of the plain kind (:func:`~reclock.sources.postgres.pgoutput_bulk.decode_columns`); else ``None``."""
        groups: dict[int, tuple[_Columns, list[int]]] = {}
        for i, columns in enumerate(self.columns):
            group = groups.get(id(columns))
            if group is None:
                group = groups[id(columns)] = (columns, [])
            group[1].append(i)
        outputs = [columns.output for columns, _ in groups.values()]
        if len(set(outputs)) < len(outputs) or not all(batches.takes_columns(output) for output in outputs):
            return None  # a table read under two definitions, or an output that takes rows
        tables = []
        for columns, at in groups.values():
            decoded = decode_columns([self.payloads[i] for i in at])
            if decoded is None or len(decoded.columns) != len(columns.order):
                return None
            ordered = [decoded.columns[j] for j in columns.order]
            tables.append(TableColumns(columns.output, np.array(at, np.int64), decoded.kinds, ordered))
        counts = [len(items) for _, items in self.transactions]
        return ChangeColumns(
            offsets=np.array([begin.final_lsn for begin, _ in self.transactions], np.int64),
            xids=[begin.xid for begin, _ in self.transactions],
            txn=np.repeat(np.arange(len(counts)), counts),
            tables=tables,
        )


@dataclass(frozen=True)
class _Columns:
    """Where a relation's columns go: the output's, in its order, then the ``added`` ones."""

    output: str
    order: tuple[int, ...]  # positions in the relation's rows: the output's columns, then the added
    added: tuple[str, ...]
    pick: Callable[[Tuple], Tuple] | None = field(init=False, compare=False)  # None: the order is the relation's

    def __post_init__(self) -> None:
        identity = self.order == tuple(range(len(self.order)))
        object.__setattr__(self, "pick", None if identity else operator.itemgetter(*self.order))

    def row(self, values: Tuple | None) -> Tuple | None:
        if values is None or self.pick is None:
            return values
        return self.pick(values)


def _truncated(message: Truncate, relations: Mapping[bytes, _Columns | None]) -> list[tuple[str, Change]]:
    read = [relations.get(_U32.pack(r)) for r in message.relation_ids]
    return [(columns.output, Change("t", None, None)) for columns in read if columns is not None]


def _checked(
    relation: Relation, by_name: Mapping[str, TableSpec], batches: ChangeBatches, lsn: int | None
) -> _Columns | None:
    """Where ``relation``'s columns go, if the pipeline reads its table; a definite error naming
    the column if one its output was made for is gone or holds another type now, unless
    ``batches`` drops the table's changes of the transaction committed at ``lsn`` (below a joined
    table's copy, whose spec is the definition at the copy): an older definition is then no
    error, and they are not read. A change of the table after them comes with a ``Relation`` of
    its own: the server sends one again after every change of the definition."""
    spec = by_name.get(relation.qualified)
    if spec is None:
        return None
    try:
        return _columns(relation, spec)
    except DefiniteSourceError:
        if lsn is not None and batches.drops(spec.output, lsn):
            return None
        raise


def _columns(relation: Relation, spec: TableSpec) -> _Columns:
    now = {c.name: i for i, c in enumerate(relation.columns)}
    for column in spec.columns:
        at = now.get(column.name)
        if at is None:
            raise DefiniteSourceError(
                f"table {relation.qualified}: column {column.name} was dropped or renamed, and output {spec.output} "
                "holds it; recreate the pipeline to follow the new definition"
            )
        new = relation.columns[at]
        kind = arrow_type(new.type_oid, new.typmod)
        if kind != column.arrow:
            raise DefiniteSourceError(
                f"table {relation.qualified}: column {column.name} is now of type OID {new.type_oid} ({kind}), and "
                f"output {spec.output} holds {column.arrow}; recreate the pipeline to follow the new definition"
            )
    made = {column.name for column in spec.columns}
    added = tuple(i for i, c in enumerate(relation.columns) if c.name not in made)
    return _Columns(
        spec.output,
        (*(now[column.name] for column in spec.columns), *added),
        tuple(relation.columns[i].name for i in added),
    )
