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

A ``Relation`` message (sent before a table's first change in a session, and again after its
definition changed) is matched with the table's spec by column name: a column of the output
missing (dropped, renamed) or of another type than the output holds is a definite error naming
the table and the column; columns added come after the output's in each change's rows, named
(:class:`~reclock.sources.postgres.changes.Change`), for the output's ``schema_evolution``.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from reclock.errors import DefiniteSourceError
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.changes import Change, ChangeBatches
from reclock.sources.postgres.clients import PostgresUnavailable, replication, server_errors
from reclock.sources.postgres.columns import arrow_type
from reclock.sources.postgres.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    Truncate,
    Tuple,
    Update,
    decode_message,
    lsn_text,
)

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
    relations: dict[int, _Columns | None] = {}
    conn, cursor = replication(dsn, slot, publication, start, wait_s=read_timeout_s)
    try:
        with server_errors(slot, publication):
            txn: tuple[Begin, list[tuple[str, Change]]] | None = None
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
                decoded = decode_message(message.payload)
                if isinstance(decoded, Begin):
                    if decoded.final_lsn >= end:
                        break
                    txn = (decoded, [])
                elif isinstance(decoded, Commit):
                    assert txn is not None, "Commit without Begin"
                    begin, changes = txn
                    txn = None
                    yield from batches.transaction(begin.final_lsn, begin.final_lsn, begin.xid, changes)
                elif isinstance(decoded, Relation):
                    relations[decoded.relation_id] = _checked(decoded, by_name)
                elif isinstance(decoded, (Insert, Update, Delete, Truncate)):
                    assert txn is not None, "a change outside a transaction"
                    txn[1].extend(_changes(decoded, relations))
        yield from batches.finish()
    finally:
        conn.close()


@dataclass(frozen=True)
class _Columns:
    """Where a relation's columns go: the output's, in its order, then the ``added`` ones."""

    output: str
    order: tuple[int, ...]  # positions in the relation's rows: the output's columns, then the added
    added: tuple[str, ...]

    def row(self, values: Tuple | None) -> Tuple | None:
        return None if values is None else tuple(values[i] for i in self.order)


def _changes(
    message: Insert | Update | Delete | Truncate, relations: Mapping[int, _Columns | None]
) -> list[tuple[str, Change]]:
    if isinstance(message, Truncate):
        read = [relations.get(r) for r in message.relation_ids]
        return [(columns.output, Change("t", None, None)) for columns in read if columns is not None]
    columns = relations.get(message.relation_id)
    if columns is None:  # a table of the publication the pipeline does not read
        return []
    if isinstance(message, Insert):
        return [(columns.output, Change("c", None, columns.row(message.new), columns.added))]
    if isinstance(message, Update):
        return [(columns.output, Change("u", columns.row(message.old), columns.row(message.new), columns.added))]
    return [(columns.output, Change("d", columns.row(message.old), None, columns.added))]


def _checked(relation: Relation, by_name: Mapping[str, TableSpec]) -> _Columns | None:
    """Where ``relation``'s columns go, if the pipeline reads its table; a definite error naming
    the column if one its output was made for is gone or holds another type now."""
    spec = by_name.get(relation.qualified)
    if spec is None:
        return None
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
