"""The reader of a binlog range: the transactions whose groups start in ``[start, end)``, as output batches.

A range is read by one binlog dump (``COM_BINLOG_DUMP`` from ``start``'s file and position, which
is always the start of a group, :mod:`~reclock.sources.mysql.position`), decoded by
python-mysql-replication (``BinLogStreamReader``; why that library, and what it costs, is in
docs/design/20261202_mysql_source.md). Every event is seen, so the reader knows the position
after each one:

1. a GTID event opens a group at its own position: the transaction's offset. A group that opens
   at or past ``end`` is not the range's, and the read stops before it;
2. row events of the source's tables add their rows to the open transaction;
3. its XID event (or a ``COMMIT`` query) commits it: each table's changes, the last per key
   (:func:`~reclock.sources.mysql.changes.last_per_key`), join their output's pending batch at
   the transaction's offset; a DDL query ends its group with no rows (the changes after it carry
   their new columns themselves, ``binlog_row_metadata = FULL``);
4. once the position after a finished group reaches ``end`` the range is read whole.

``end`` is a probe (the server's position then) or the snapshot's position, so every group below it
is in the binlog: the read never waits for a transaction that is not there. The library
reconnects by itself when a connection is lost, from the last event's position, which can be
inside a group: the reader's connection instead raises the loss as
:class:`~reclock.sources.mysql.clients.MysqlUnavailable`, a transient error, and the batch reads
its range again from ``start``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from reclock.sources.mysql.catalog import TableSpec
from reclock.sources.mysql.changes import Change, last_per_key, upsert_batch
from reclock.sources.mysql.clients import MysqlUnavailable, connect, server_errors
from reclock.sources.mysql.config import MysqlOptions
from reclock.sources.mysql.position import check_kept, offset_of, position_of, text

__all__ = ["read_range"]

_LOST = {2006, 2013}


class _Connection(pymysql.connections.Connection):
    """The dump's connection: a lost connection is the pipeline's transient error, never the
    library's silent reconnect from inside a group."""

    def _read_packet(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._read_packet(*args, **kwargs)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in _LOST:
                raise MysqlUnavailable(f"lost the binlog dump's connection: {exc.args[-1]}") from None
            raise


def read_range(
    options: MysqlOptions,
    specs: Sequence[TableSpec],
    base: str,
    start: int,
    end: int,
    *,
    partition: str,
    unknown: frozenset[str],
    fail: bool,
    flush_rows: int,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Every change of ``specs``' tables in the transactions of ``[start, end)`` (module
    docstring), as upsert batches of at most about ``flush_rows`` rows."""
    conn = connect(options)
    try:
        with server_errors(options), conn.cursor() as cur:
            check_kept(cur, start, base)
    finally:
        conn.close()
    by_table = {spec.table: spec for spec in specs}
    file, pos = position_of(start, base)
    settings = {k: v for k, v in options.connection().items() if k != "password"}
    stream = BinLogStreamReader(
        connection_settings={**settings, "password": options.password},
        server_id=options.server_id,
        log_file=file,
        log_pos=pos,
        resume_stream=True,
        blocking=True,
        only_schemas=[options.database],
        only_tables=list(by_table),
        filter_non_implemented_events=False,
        pymysql_wrapper=_Connection,
        slave_heartbeat=max(1.0, options.read_timeout_s / 3),
        enable_logging=False,
    )
    pending: dict[str, list[Change]] = {}
    waiting = 0
    opened: int | None = None
    changes: dict[str, list[tuple[dict | None, dict | None]]] = {}
    try:
        with server_errors(options, position=text(start, base)):
            for event in stream:
                after = offset_of(stream.log_file, stream.log_pos) if stream.log_pos else start
                if isinstance(event, (MariadbGtidEvent, GtidEvent)):
                    at = after - event.event_size
                    if at >= end:
                        break
                    opened, changes = at, {}
                elif isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                    assert opened is not None, f"a row event outside a transaction at {text(after, base)}"
                    rows = changes.setdefault(event.table, [])
                    if isinstance(event, WriteRowsEvent):
                        rows += [(None, row["values"]) for row in event.rows]
                    elif isinstance(event, UpdateRowsEvent):
                        rows += [(row["before_values"], row["after_values"]) for row in event.rows]
                    else:
                        rows += [(row["values"], None) for row in event.rows]
                elif isinstance(event, XidEvent) or (isinstance(event, QueryEvent) and _ends_group(event)):
                    if opened is not None:
                        for table, rows in changes.items():
                            kept = last_per_key(by_table[table], rows, opened)
                            pending.setdefault(by_table[table].output, []).extend(kept)
                            waiting += len(kept)
                    opened, changes = None, {}
                    if waiting >= flush_rows:
                        yield from _flush(pending, by_table, partition, unknown, fail)
                        waiting = 0
                if opened is None and after >= end:
                    break
    finally:
        stream.close()
    yield from _flush(pending, by_table, partition, unknown, fail)


def _ends_group(event: QueryEvent) -> bool:
    """A query that ends its group: a ``COMMIT`` (a non-transactional table's changes) or a DDL
    statement, which is a group of its own; a ``BEGIN`` opens one (MySQL writes it after the GTID)."""
    query = event.query.decode() if isinstance(event.query, bytes) else event.query
    return query.strip().upper() != "BEGIN"


def _flush(
    pending: dict[str, list[Change]],
    by_table: dict[str, TableSpec],
    partition: str,
    unknown: frozenset[str],
    fail: bool,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    specs = {spec.output: spec for spec in by_table.values()}
    for output, changes in pending.items():
        if changes:
            yield from upsert_batch(specs[output], partition, changes, unknown=output in unknown, fail=fail)
    pending.clear()
