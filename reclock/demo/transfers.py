"""``reclock demo --source postgres``: bank transfers across two tables, landed whole, read as cuts.

The demo starts its own PostgreSQL server (:class:`~reclock.demo.postgres_server.PostgresServer`,
the one the tests use: the Debian package's binaries on 127.0.0.1, a free port, a temporary data
directory, stopped by its PID at the end), creates a database ``bank`` with two tables,
``checking`` and ``savings``, one row per account in each, and a Postgres pipeline (``<lake>/demo``,
``max_batch = 1``: every binding time is a cut, docs/sources/postgres.md) that snapshots both
tables and then streams their changes. Once the job runs, :data:`CLIENTS` client threads move money
between the two tables, each transfer one transaction that takes an amount from one account's row
in one table and adds it to another's in the other: the sum over both tables never changes in the
database, but a per-table committer would show it changed between the two tables' commits.

Once every transfer has committed and the job's resume frontier (what every output holds) has
passed the server's WAL flush position after the last one, the job is asked to stop. The demo then
reads both outputs ``read_as_of`` every binding time of the pipeline (up to :data:`MAX_CUTS` of
them, evenly spaced, the first and the last always) and checks the invariant in each: the total is
the opening total, in every cut. The last cut must equal the database's tables row for row. The
demo returns that last cut's into time, or ``None`` if a check failed.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import closing, nullcontext
from decimal import Decimal
from typing import Any, TextIO

from reclock.demo.postgres_server import PostgresServer
from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.job.status import read_status
from reclock.persist.asof import read_as_of, readable_upper
from reclock.persist.lake import Lake
from reclock.runtime.health import Health
from reclock.sources.postgres.pgoutput import parse_lsn
from reclock.sources.postgres.source import WAL
from reclock.timeline.frontier import Frontier, IntoTime

__all__ = [
    "ACCOUNTS",
    "CLIENTS",
    "DATABASE",
    "MAX_CUTS",
    "OPENING_BALANCE",
    "TABLES",
    "TOTAL",
    "TransferClients",
    "bank_source",
    "flush_lsn",
    "open_bank",
    "run_transfers_demo",
    "total",
]

#: The database the demo creates (dropped first if it exists) and the tables the pipeline reads.
DATABASE = "bank"
TABLES = ("checking", "savings")
ACCOUNTS = 1_000
#: Every account opens with this much in each table, so the total is ``2 * ACCOUNTS * OPENING_BALANCE``.
OPENING_BALANCE = 1_000
TOTAL = 2 * ACCOUNTS * OPENING_BALANCE
CLIENTS = 4
#: Cuts checked at most (reading a cut opens every output's Delta log: a few tens of ms each).
MAX_CUTS = 200

_POLL_S = 0.2


def run_transfers_demo(
    lake: Lake,
    name: str,
    *,
    transfers: int,
    rate: float,
    engine: str,
    out: TextIO,
    server: PostgresServer | None = None,
) -> IntoTime | None:
    """Run the demo pipeline ``name`` over ``transfers`` transfers (at most ``rate`` a second).

    ``server`` is a running server to use instead of starting one (the tests' session server);
    the demo's own server is stopped and its data directory removed at the end.
    """
    with PostgresServer() if server is None else nullcontext(server) as running:
        dsn = open_bank(running)
        config = parse_config(
            {
                "pipeline": {
                    "name": name,
                    "lake": str(lake.root),
                    "engine": engine,
                    "batch_interval": 0.2,
                    "max_batch": 1,
                },
                "source": bank_source(dsn),
            }
        )
        lifecycle.create(config, storage_options=lake.store.options)
        out.write(
            f"demo: PostgreSQL on 127.0.0.1:{running.port} (database {DATABASE!r}, tables {', '.join(TABLES)}: "
            f"{ACCOUNTS:,} accounts with {OPENING_BALANCE:,} in each);\n"
            f"      {transfers:,} transfers between the two tables by {CLIENTS} clients at up to {rate:,.0f}/s, "
            f"ingested live by pipeline {name!r} ({engine} engine) into {lake.root}/{name}\n"
        )
        out.flush()
        watcher = _Watcher(lake, name, running, transfers, rate, out)
        watcher.start()
        try:
            pipeline = lifecycle.run(lake, name, progress=out)
        finally:
            watcher.done.set()
            watcher.join()
        if watcher.error is not None:
            out.write(f"demo: {watcher.error}\n")
            return None
        if pipeline.health is Health.FAILED or not watcher.complete:
            out.write("demo: the pipeline stopped before every transfer was in the lake\n")
            return None
        database = {table: _balances(running, table) for table in TABLES}
    return _check_cuts(lake, name, [time for time, _ in pipeline.remap.bindings], database, out)


def open_bank(server: PostgresServer) -> str:
    """The database :data:`DATABASE` (made afresh) with its accounts; its DSN."""
    dsn = server.create_database(DATABASE)
    with closing(server.connect(DATABASE)) as conn, conn.cursor() as cur:
        for table in TABLES:
            cur.execute(f"CREATE TABLE {table} (account int PRIMARY KEY, balance numeric(14,2) NOT NULL)")
            cur.execute(f"INSERT INTO {table} SELECT g, %s FROM generate_series(1, %s) g", (OPENING_BALANCE, ACCOUNTS))
    return dsn


def bank_source(dsn: str) -> dict[str, Any]:
    """The pipeline's source: both tables, upsert outputs ``public_checking`` and ``public_savings``."""
    return {"kind": "postgres", "dsn": dsn, "tables": [f"public.{t}" for t in TABLES]}


def flush_lsn(server: PostgresServer) -> int:
    """The server's WAL flush position: every transaction committed so far is below it."""
    with closing(server.connect(DATABASE)) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_flush_lsn()")
        return parse_lsn(cur.fetchone()[0])


def total(cut: dict[str, Any]) -> Any:
    """The money in a cut of the pipeline's outputs (``read_as_of``): both tables' balances summed."""
    return sum(sum(cut[f"public_{t}"]["balance"].to_pylist()) for t in TABLES)


def _balances(server: PostgresServer, table: str) -> dict[int, Decimal]:
    with closing(server.connect(DATABASE)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT account, balance FROM {table}")
        return dict(cur.fetchall())


class TransferClients:
    """:data:`CLIENTS` threads that commit ``transfers`` transfers in all, paced to ``rate``; the
    first error any of them met (the watcher reports it)."""

    def __init__(self, server: PostgresServer, transfers: int, rate: float) -> None:
        self.server, self.transfers, self.rate = server, transfers, rate
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.threads = [
            threading.Thread(target=self._client, args=(i,), name=f"reclock-demo-bank-{i}", daemon=True)
            for i in range(CLIENTS)
        ]
        for thread in self.threads:
            thread.start()

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def close(self) -> None:
        """Stop the clients that still run (the job failed or stopped) and wait for them."""
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _client(self, index: int) -> None:
        pick = random.Random(index)
        try:
            with closing(self.server.connect(DATABASE)) as conn, conn.cursor() as cur:
                conn.autocommit = False
                for number in range(index, self.transfers, CLIENTS):
                    if self.stop.is_set():
                        return
                    wait = self.started + number / self.rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    source, target = pick.sample(TABLES, 2)
                    amount = Decimal(pick.randint(1, 10_000)) / 100
                    cur.execute(
                        f"UPDATE {source} SET balance = balance - %s WHERE account = %s",
                        (amount, pick.randint(1, ACCOUNTS)),
                    )
                    cur.execute(
                        f"UPDATE {target} SET balance = balance + %s WHERE account = %s",
                        (amount, pick.randint(1, ACCOUNTS)),
                    )
                    conn.commit()
        except Exception as exc:  # reported by the watcher, which stops the job
            self.errors.append(exc)


class _Watcher(threading.Thread):
    """Starts the clients once the job runs; asks the job to stop once every output holds every
    transfer: the job's resume frontier (``status.json``) has reached the server's WAL flush
    position taken after the last commit, so every commit LSN is below what every output holds."""

    def __init__(self, lake: Lake, name: str, server: PostgresServer, transfers: int, rate: float, out: TextIO) -> None:
        super().__init__(name="reclock-demo-watcher", daemon=True)
        self.lake, self.name, self.server = lake, name, server
        self.transfers, self.rate, self.out = transfers, rate, out
        self.done = threading.Event()
        self.complete = False
        self.error: str | None = None

    def run(self) -> None:
        self.clients: TransferClients | None = None
        try:
            self._watch()
        finally:
            if self.clients is not None:
                self.clients.close()

    def _watch(self) -> None:
        clients: TransferClients | None = None
        flushed: int | None = None
        while not self.done.wait(_POLL_S):
            status = read_status(self.lake, self.name) or {}
            health = status.get("health")
            if health in (Health.FAILED.value, Health.STOPPED.value):
                return
            if clients is None:
                if health == Health.RUNNING.value:  # the job is up (Spark too): transfer into it, live
                    clients = self.clients = TransferClients(self.server, self.transfers, self.rate)
                    self.out.write("\ndemo: the pipeline is running; transferring\n")
                    self.out.flush()
                continue
            if flushed is None:
                if clients.alive():
                    continue
                if clients.errors:
                    self.error = f"a client failed: {clients.errors[0]}"
                    lifecycle.request_stop(self.lake, self.name)
                    return
                seconds = max(time.monotonic() - clients.started, 1e-9)
                flushed = flush_lsn(self.server)
                self.out.write(
                    f"\ndemo: {self.transfers:,} transfers committed in {seconds:.1f} s "
                    f"({self.transfers / seconds:,.0f}/s); waiting until every output holds all of them\n"
                )
                self.out.flush()
            if Frontier.from_json(status.get("resume_frontier", "{}")).covers(WAL, flushed - 1):
                self.complete = True
                lifecycle.request_stop(self.lake, self.name)
                return


def _check_cuts(
    lake: Lake, name: str, bindings: list[IntoTime], database: dict[str, dict[int, Decimal]], out: TextIO
) -> IntoTime | None:
    """Read both outputs as of the pipeline's binding times; the total must hold in every cut and
    the last cut must be the database. The last cut's time, or ``None``."""
    upper = readable_upper(lake, name)
    times = [t for t in bindings if t < upper]
    if len(times) > MAX_CUTS:
        step = (len(times) - 1) / (MAX_CUTS - 1)
        times = [times[round(i * step)] for i in range(MAX_CUTS)]
    out.write(f"\ndemo: reading both tables as of {len(times):,} of the pipeline's {len(bindings):,} binding times\n")
    for at in times:
        found = total(read_as_of(lake, name, at))
        if found != TOTAL:
            out.write(f"demo: the cut at {at} holds a total of {found}, not {TOTAL}: a transfer is half-applied\n")
            return None
    last = _cut(lake, name, times[-1])
    if last != database:
        out.write(f"demo: the last cut ({times[-1]}) differs from the database's tables\n")
        return None
    out.write(
        f"demo: the total over {' + '.join(TABLES)} is {TOTAL:,} in every cut: no transfer is ever half in the lake; "
        f"the last cut ({times[-1]}) equals the database, row for row\n"
    )
    return times[-1]


def _cut(lake: Lake, name: str, at: IntoTime) -> dict[str, dict[int, Any]]:
    tables = read_as_of(lake, name, at)
    return {
        table: dict(zip(rows["account"].to_pylist(), rows["balance"].to_pylist(), strict=True))
        for table, rows in ((t, tables[f"public_{t}"]) for t in TABLES)
    }
