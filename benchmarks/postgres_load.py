"""Postgres for the Postgres scenarios: one server per run, the tables, the changes, a steady writer.

The server is the demo's and the tests' (:class:`~reclock.demo.postgres_server.PostgresServer`:
the Debian package's PostgreSQL 15 on 127.0.0.1, a free port, stopped by its PID when the run
ends). Every contender reads the same rows or the same WAL: the snapshot scenario copies one table,
the stream scenario reads one range of changes through a replication slot each contender made
before the changes were written.

Run as a module it is the freshness scenario's steady writer, in its own process so that its CPU
and GIL never compete with the pipeline being measured::

    python -m benchmarks.postgres_load steady DSN RATE SECONDS
"""

from __future__ import annotations

import atexit
import sys
import time
from contextlib import closing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reclock.demo.postgres_server import PostgresServer

__all__ = [
    "CHANGES_PER_TRANSACTION",
    "EVENT_TABLE",
    "TABLES",
    "create_tables",
    "execute",
    "fill",
    "flush_lsn",
    "scalar",
    "seed",
    "server",
    "write_changes",
]

#: The two tables every Postgres scenario writes: the JSON events of the Kafka scenarios as rows.
TABLES = ("clicks", "views")
EVENT_TABLE = (
    "(id bigint PRIMARY KEY, user_name text NOT NULL, amount numeric(10,2) NOT NULL, kind text NOT NULL, "
    "page text NOT NULL, ts bigint NOT NULL)"
)
#: The stream scenario's transactions: 4 inserts and 1 update in each of the two tables.
CHANGES_PER_TRANSACTION = 10

_SERVER: PostgresServer | None = None


def server() -> PostgresServer:
    """One PostgreSQL server for the whole benchmark run (stopped when the process exits)."""
    global _SERVER
    if _SERVER is None:
        from reclock.demo.postgres_server import PostgresServer

        _SERVER = PostgresServer(settings={"max_wal_size": "4GB", "shared_buffers": "256MB"})
        atexit.register(_SERVER.close)
    return _SERVER


def execute(dsn: str, *statements: str) -> None:
    import psycopg2

    with closing(psycopg2.connect(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)


def scalar(dsn: str, sql: str) -> Any:
    import psycopg2

    with closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def flush_lsn(dsn: str) -> int:
    """The server's WAL flush position, as an integer LSN."""
    high, low = scalar(dsn, "SELECT pg_current_wal_flush_lsn()::text").split("/")
    return (int(high, 16) << 32) | int(low, 16)


def create_tables(dsn: str) -> None:
    execute(dsn, *(f"CREATE TABLE {table} {EVENT_TABLE}" for table in TABLES))


def _values(first: str) -> str:
    """The SELECT list of an event row whose id is the expression ``first``."""
    first = f"({first})"
    return (
        f"{first}, 'user-' || lpad(({first} % 50000)::text, 5, '0'), ({first} % 997) + 0.25, "
        f"(ARRAY['click','view','scroll','buy'])[({first} % 4) + 1], '/p/' || lpad(({first} % 5000)::text, 4, '0'), "
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    )


def fill(dsn: str, table: str, rows: int) -> None:
    """``rows`` event rows in ``table`` (ids 1..rows), then VACUUM ANALYZE (every page all-visible)
    and a CHECKPOINT, so that the server writes the fill's pages out now rather than during the
    measured runs."""
    execute(
        dsn,
        f"INSERT INTO {table} SELECT {_values('g')} FROM generate_series(1, {rows}) g",
        f"VACUUM ANALYZE {table}",
        "CHECKPOINT",
    )


def seed(dsn: str) -> None:
    """Row 0 of each table: what the first transaction of :func:`write_changes` updates."""
    execute(dsn, *(f"INSERT INTO {t} SELECT {_values('0')}" for t in TABLES))


def write_changes(dsn: str, transactions: int) -> int:
    """``transactions`` transactions of :data:`CHANGES_PER_TRANSACTION` changes, committed one by
    one on the server (a ``DO`` block that commits in its loop): in each of the two tables 4
    inserts and an update of a row an earlier transaction inserted (row 0 of :func:`seed` for the
    first). Returns the number of changes."""
    a, b = TABLES
    execute(
        dsn,
        f"""DO $$
        DECLARE first bigint := coalesce((SELECT max(id) FROM {a}), 0) + 1;
        BEGIN
          FOR i IN 0..{transactions - 1} LOOP
            INSERT INTO {a} SELECT {_values("first + i * 4 + g")} FROM generate_series(0, 3) g;
            INSERT INTO {b} SELECT {_values("first + i * 4 + g")} FROM generate_series(0, 3) g;
            UPDATE {a} SET amount = amount + 1 WHERE id = CASE WHEN i = 0 THEN 0 ELSE first + (i - 1) * 4 END;
            UPDATE {b} SET amount = amount + 1 WHERE id = CASE WHEN i = 0 THEN 0 ELSE first + (i - 1) * 4 END;
            COMMIT;
          END LOOP;
        END $$""",
    )
    return transactions * CHANGES_PER_TRANSACTION


def _steady_main(dsn: str, rate: str, seconds: str) -> None:
    """Insert ``rate`` rows a second for ``seconds``, half into each table, in transactions of 10
    rows; each row's ``ts`` is the wall-clock ms when its transaction is sent, a round trip before
    its commit (the start of its commit-to-visible latency). Prints ``ready``, then ``done <rows>``."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True  # each transaction is one round trip: BEGIN; INSERT; INSERT; COMMIT
    cur = conn.cursor()
    cur.execute(f"SELECT coalesce(max(id), 0) FROM {TABLES[0]}")
    next_id = cur.fetchone()[0] + 1
    print("ready", flush=True)
    per_txn = 10
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < float(seconds):
        owed = float(rate) * (time.monotonic() - started) - sent
        if owed < per_txn:
            time.sleep((per_txn - owed) / float(rate))
            continue
        ts = int(time.time() * 1000)
        rows = ",".join(
            f"({i}, 'user-{i % 50000:05d}', {i % 997}.25, 'click', '/p/{i % 5000:04d}', {ts})"
            for i in range(next_id, next_id + per_txn // 2)
        )
        cur.execute("BEGIN; " + " ".join(f"INSERT INTO {table} VALUES {rows};" for table in TABLES) + " COMMIT")
        next_id += per_txn // 2
        sent += per_txn
    conn.close()
    print(f"done {sent}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "steady":
        _steady_main(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
