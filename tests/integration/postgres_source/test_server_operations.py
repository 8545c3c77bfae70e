"""The Postgres source under a server's life: a restart under a running job, and idle hours.

Each test starts a server of its own (``tests/integration/postgres.py``), because the server's
life is what it tests: one is stopped and started again, the other runs with a 30 s
``checkpoint_timeout`` and must see no other test's WAL. The job is a real ``reclock start``
process; what it did is read from outside: ``status.json``, the Delta logs with the tests' own
reader (``tests.faults.reader``), and the server's own views (``pg_replication_slots``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing, suppress
from pathlib import Path

import psycopg2
import pytest

from tests import zygote
from tests.faults.reader import DeltaLog, read_rows
from tests.integration.helpers import reclock_cli, write_config
from tests.integration.postgres import PostgresServer

MiB = 1 << 20


def _execute(server: PostgresServer, database: str, *statements: str) -> list[tuple]:
    with closing(server.connect(database)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        return cur.fetchall() if cur.description else []


def _start_job(lake: Path, name: str, stderr: Path) -> subprocess.Popen:
    with open(stderr, "ab") as err:
        return zygote.popen(
            ["--lake", str(lake), "start", name],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def _status(lake: Path, name: str) -> dict:
    try:
        return json.loads((lake / name / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _held(lake: Path, name: str) -> int:
    """The WAL position every output holds, as the job last reported it."""
    return json.loads(_status(lake, name).get("resume_frontier", "{}")).get("offsets", {}).get("wal", 0)


def _wait(what: str, done, job: subprocess.Popen, stderr: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert job.poll() is None, f"the job exited while waiting for {what}: {stderr.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _stop(lake: Path, name: str, job: subprocess.Popen, stderr: Path) -> None:
    stopped = reclock_cli("--lake", str(lake), "stop", name, "--wait", "60")
    assert stopped.returncode == 0, stopped.stderr
    assert job.wait(timeout=60) == 0, stderr.read_text()[-3000:]


def _create(tmp_path: Path, name: str, dsn: str, tables: list[str], **source) -> Path:
    config = write_config(
        tmp_path / f"{name}.toml",
        pipeline={
            "name": name,
            "lake": "lake",
            "engine": "local",
            "max_batch": 1,
            "batch_interval": 0.5,
            "idle_interval": 2.0,
            "retry_backoff": 0.2,
            "max_backoff": 1.0,
        },
        source={"kind": "postgres", "dsn": dsn, "tables": tables, **source},
    )
    created = reclock_cli("create", str(config), cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    return tmp_path / "lake"


@pytest.mark.usefixtures("reclock_processes")
def test_a_server_restart_under_a_running_job_stalls_it_then_every_change_lands_once(tmp_path):
    """A fast shutdown (``pg_ctl stop -m fast``: SIGINT to the postmaster) under a running job,
    with a transaction open: the job is ``stalled``, not failed, and keeps running; once the
    server is started again every committed change lands exactly once (``append``: one row per
    change, named by commit LSN and order), each transaction at one into time in both tables,
    and the transaction the shutdown rolled back never appears."""
    server = PostgresServer()
    try:
        db, name = "shop", "shop"
        dsn = server.create_database(db)
        _execute(
            server,
            db,
            "CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL)",
            "CREATE TABLE lines (id int PRIMARY KEY, order_id int NOT NULL, amount int NOT NULL)",
            "INSERT INTO orders VALUES (0, 0)",
        )
        lake = _create(tmp_path, name, dsn, ["orders", "lines"], envelope="append", read_timeout_s=3.0)
        stderr = tmp_path / "job.stderr"
        job = _start_job(lake, name, stderr)
        _wait("the snapshot's batch", lambda: _status(lake, name).get("batches", 0) >= 1, job, stderr)

        def place(first: int, last: int) -> None:
            """An order and its two lines per transaction, the total their sum."""
            with closing(psycopg2.connect(dsn)) as conn:
                for order in range(first, last + 1):
                    with conn.cursor() as cur:
                        cur.execute(
                            "INSERT INTO lines VALUES (%s, %s, %s), (%s, %s, %s)",
                            (2 * order, order, order, 2 * order + 1, order, 1),
                        )
                        cur.execute("INSERT INTO orders VALUES (%s, %s)", (order, order + 1))
                    conn.commit()

        place(1, 30)
        open_txn = psycopg2.connect(dsn)  # in flight when the server goes: rolled back by the shutdown
        with open_txn.cursor() as cur:
            cur.execute("INSERT INTO orders VALUES (999, 1)")
            cur.execute("INSERT INTO lines VALUES (1998, 999, 1)")
        server.stop()
        _wait("the job to stall", lambda: _status(lake, name).get("health") == "stalled", job, stderr)
        stalled = _status(lake, name)
        assert "Postgres server" in (stalled.get("last_error") or ""), stalled
        time.sleep(3)  # a few more attempts against a server that is not there
        assert job.poll() is None, stderr.read_text()[-3000:]
        server.start()
        with suppress(psycopg2.Error):
            open_txn.close()
        place(31, 60)
        _execute(
            server,
            db,
            "BEGIN",
            "UPDATE orders SET total = total + 10 WHERE id BETWEEN 1 AND 10",
            "UPDATE lines SET amount = amount + 10 WHERE order_id BETWEEN 1 AND 10 AND id % 2 = 0",
            "COMMIT",
            "DELETE FROM lines WHERE order_id > 50",
            "DELETE FROM orders WHERE id > 50",
        )
        flushed = int(_execute(server, db, "SELECT pg_current_wal_flush_lsn() - '0/0'")[0][0])
        _wait("the job to catch up", lambda: _held(lake, name) >= flushed, job, stderr)
        assert _status(lake, name).get("health") == "running", _status(lake, name)
        truth = {
            t: dict(_execute(server, db, f"SELECT id, {c} FROM {t}"))
            for t, c in (("orders", "total"), ("lines", "amount"))
        }
        _stop(lake, name, job, stderr)
    finally:
        server.close()

    rows = {}
    for table in ("orders", "lines"):
        found = read_rows(DeltaLog(lake / name / "outputs" / f"public_{table}").refresh())
        assert found is not None, table
        rows[table] = found.to_pylist()
    # Every change once: (commit LSN, order in its transaction) unique, and as many as were made.
    for table, changes in (("orders", 1 + 60 + 10 + 10), ("lines", 120 + 10 + 20)):
        names = Counter((r["_offset"], r["seq"]) for r in rows[table] if r["op"] != "r")
        snapshot = [r for r in rows[table] if r["op"] == "r"]
        assert max(names.values()) == 1, f"{table}: a change landed twice"
        assert len(names) + len(snapshot) == changes, (table, len(names), len(snapshot))
    # Replayed in commit order, the changes are the database; the rolled-back order is nowhere.
    for table, column, rolled_back in (("orders", "total", 999), ("lines", "amount", 1998)):
        state: dict[int, int] = {}
        for r in sorted(rows[table], key=lambda r: (r["_offset"], r["seq"] if r["op"] != "r" else -1)):
            if r["op"] == "d":
                del state[r["before"]["id"]]
            else:
                state[r["after"]["id"]] = r["after"][column]
        assert state == truth[table], table
        ids = {(r[side] or {}).get("id") for r in rows[table] for side in ("before", "after")}
        assert rolled_back not in ids, f"{table}: a change of the rolled-back transaction landed"
    # Each order's transaction: one commit LSN and one into time for the order and its lines.
    inserted = {r["after"]["id"]: (r["_offset"], r["_into_ts"]) for r in rows["orders"] if r["op"] == "c"}
    for r in rows["lines"]:
        if r["op"] == "c":
            assert (r["_offset"], r["_into_ts"]) == inserted[r["after"]["order_id"]], r


@pytest.mark.waits
@pytest.mark.usefixtures("reclock_processes")
def test_an_idle_source_does_not_grow_the_servers_retained_wal(tmp_path, long_lane):
    """The source's tables idle, first while another database of the server writes (``busy``
    seconds), then with the whole server quiet (``quiet`` seconds): 10 minutes in all with
    ``--long``, 100 s by default. The slot's retained WAL, ``pg_current_wal_lsn() - restart_lsn``
    sampled every second, stays within the bound docs/sources/postgres.md gives: the WAL the
    server wrote in the last minute, plus 1 MiB (a logical slot's restart point moves only to
    the background writer's standby snapshots, logged every 15 s while anything is written, and
    may trail by one); quiet, it falls under 1 MiB. A slot the job did not confirm would keep
    the burst before the idle time and everything written since."""
    busy, quiet = (300, 300) if long_lane else (60, 40)
    window = 60
    server = PostgresServer(settings={"checkpoint_timeout": "30s"})
    try:
        db, name = "quiet", "quiet"
        dsn = server.create_database(db)
        server.create_database("elsewhere")
        _execute(server, db, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
        _execute(server, "elsewhere", "CREATE TABLE notes (id bigserial PRIMARY KEY, note text NOT NULL)")
        lake = _create(tmp_path, name, dsn, ["t"])
        stderr = tmp_path / "job.stderr"
        job = _start_job(lake, name, stderr)
        _wait("the snapshot's batch", lambda: _status(lake, name).get("batches", 0) >= 1, job, stderr)
        burst_from = int(_execute(server, db, "SELECT pg_current_wal_lsn() - '0/0'")[0][0])
        _execute(server, db, "INSERT INTO t SELECT g, g FROM generate_series(1, 200000) g")
        flushed = int(_execute(server, db, "SELECT pg_current_wal_flush_lsn() - '0/0'")[0][0])
        burst = flushed - burst_from
        _wait("the job to land the burst", lambda: _held(lake, name) >= flushed, job, stderr)

        samples: list[tuple[float, int, int, int]] = []  # (seconds idle, current LSN, retained, pg_wal bytes)
        with closing(server.connect(db)) as conn, closing(server.connect("elsewhere")) as other:
            started = time.monotonic()
            while (idle := time.monotonic() - started) < busy + quiet:
                if idle < busy:
                    with other.cursor() as cur:
                        cur.execute("INSERT INTO notes (note) SELECT repeat('n', 100) FROM generate_series(1, 4000)")
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT pg_current_wal_lsn() - '0/0', pg_current_wal_lsn() - restart_lsn, "
                        "(SELECT sum(size) FROM pg_ls_waldir()) FROM pg_replication_slots WHERE slot_name = %s",
                        (f"reclock_{name}",),
                    )
                    current, retained, wal_dir = cur.fetchone()
                samples.append((idle, int(current), int(retained), int(wal_dir)))
                assert job.poll() is None, stderr.read_text()[-3000:]
                time.sleep(1)
        _stop(lake, name, job, stderr)
    finally:
        server.close()

    assert burst > 16 * MiB, f"the burst wrote {burst} bytes of WAL, too few to tell a stuck slot"
    written_busy = samples[-1][1] - samples[0][1]
    assert written_busy > 16 * MiB, f"the other database wrote {written_busy} bytes of WAL, too few to tell"
    worst = 0
    for idle, current, retained, _ in samples:
        if idle < window:
            continue
        before = max((s for s in samples if s[0] <= idle - window), key=lambda s: s[0])
        bound = current - before[1] + MiB
        assert retained <= bound, f"{idle:.0f} s idle: the slot retains {retained} bytes of WAL, over {bound}"
        worst = max(worst, retained)
    last_idle, _, last_retained, _ = samples[-1]
    assert last_retained <= MiB, f"quiet since {last_idle - busy:.0f} s, the slot still retains {last_retained} bytes"
    print(
        f"idle={busy}+{quiet}s burst={burst} written_while_busy={written_busy} "
        f"retained_at_start={samples[0][2]} worst_after_{window}s={worst} final={last_retained} "
        f"pg_wal_start={samples[0][3]} pg_wal_max={max(s[3] for s in samples)} pg_wal_final={samples[-1][3]}"
    )
