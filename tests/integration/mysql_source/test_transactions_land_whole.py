"""Transactions land whole under fire, from MariaDB's binlog: transfers between two tables, the job SIGKILLed.

Four threads run transfers, each one transaction moving an amount from an account of ``checking``
to one of ``savings`` (or back), and now and then opening an account in both tables with a
deposit moved from an old one, so the total of both tables never changes. A thread records a
transfer (its GTID, ``@@last_gtid``, and its effect) only once its COMMIT returned. Meanwhile
``reclock start`` runs the pipeline (``engine = "local"``, ``max_batch = 1``: one batch per
binding) and is killed with SIGKILL, the first time inside the snapshot's capture (chunk files
written, no manifest yet), then restarted; at the end a last run catches up and is stopped.

Ground truth is the test's own: the transfers it saw commit, placed in binlog order by the
server package's ``mysqlbinlog`` (GTID -> position of its group), from the tables' state before
the first transfer. Then, read with the tests' own Delta log reader (``tests.faults.reader``), for
every batch label time ``T`` of either output: both tables as of ``T`` keep the total, and equal
the state after every transfer whose group starts below the frontier the remap table binds at
``T``; the product's ``read_as_of`` agrees; the final tables equal the database's, row for row. A
third table, ``history`` (only in the snapshot), makes the capture long; it ends with every row once.

The short lane kills 3 times; ``--long`` (scripts/test --long) 20 times.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pymysql
import pytest
from pymysql.constants import CLIENT

from reclock.persist.asof import read_as_of
from reclock.sources.mysql.position import offset_of
from tests import zygote
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import reclock_cli, write_config
from tests.integration.postgres_source.test_transactions_land_whole import Cuts, _labels
from tests.waiting import PATIENCE_S

ACCOUNTS = 20
START = 1_000
TOTAL = 2 * ACCOUNTS * START
BINLOG = "binlog"  # the source's one partition, as the remap table holds it
NAME = "mbank"
DB = "mbank"
HISTORY = 100_000
MIN_LABELS = 8


class Transfers(threading.Thread):
    """One client moving money; ``done`` holds ``(gtid, [(table, id, delta), ...])`` per commit."""

    def __init__(self, mariadb, seed: int, next_id: list[int], opened: list[int], lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.mariadb, self.random, self.next_id, self.lock = mariadb, random.Random(seed), next_id, lock
        self.opened = opened
        self.stop = threading.Event()
        self.done: list[tuple[str, list[tuple[str, int, int]]]] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            # Matched rows, not changed ones: a transfer of 0 still finds its row.
            conn = self.mariadb.connect(DB, autocommit=False, client_flag=CLIENT.FOUND_ROWS)
            while not self.stop.is_set():
                effects = self._one(conn)
                if effects is not None:
                    self.done.append(effects)
                time.sleep(self.random.uniform(0, 0.01))
            conn.close()
        except BaseException as exc:
            self.failure = exc

    def _one(self, conn) -> tuple[str, list[tuple[str, int, int]]] | None:
        with self.lock:
            a, b = self.random.choice(self.opened), self.random.choice(self.opened)
        amount = self.random.randint(-50, 50)
        effects = [("checking", a, -amount), ("savings", b, amount)]
        new = None
        try:
            with conn.cursor() as cur:
                if self.random.random() < 0.05:  # open an account in both tables, funded from checking a
                    with self.lock:
                        new = self.next_id[0]
                        self.next_id[0] += 1
                    cur.execute("INSERT INTO checking VALUES (%s, 0)", (new,))
                    cur.execute("INSERT INTO savings VALUES (%s, 5)", (new,))
                    assert cur.execute("UPDATE checking SET balance = balance - 5 WHERE id = %s", (a,)) == 1
                    effects = [("checking", new, 0), ("savings", new, 5), ("checking", a, -5)]
                else:
                    assert cur.execute("UPDATE checking SET balance = balance - %s WHERE id = %s", (amount, a)) == 1
                    assert cur.execute("UPDATE savings SET balance = balance + %s WHERE id = %s", (amount, b)) == 1
            conn.commit()
            with conn.cursor() as cur:
                cur.execute("SELECT @@last_gtid")
                gtid = cur.fetchone()[0]
        except pymysql.err.OperationalError as exc:
            if exc.args[0] != 1213:  # a deadlock: rolled back, try another
                raise
            conn.rollback()
            return None
        if new is not None:
            with self.lock:
                self.opened.append(new)
        return gtid, effects


def _start_job(lake: Path, stderr: Path) -> subprocess.Popen:
    with open(stderr, "ab") as err:
        return zygote.popen(
            ["--lake", str(lake), "start", NAME],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def _status(lake: Path) -> dict:
    try:
        return json.loads((lake / NAME / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _labels_if_any(lake: Path, table: str) -> list[int]:
    path = lake / NAME / "outputs" / f"{DB}_{table}"
    return _labels(path) if (path / "_delta_log").is_dir() else []


@pytest.mark.usefixtures("reclock_processes")
def test_transfers_land_whole_at_every_batch_time_through_kills(mariadb, tmp_path, long_lane):
    kills = 20 if long_lane else 3
    options = mariadb.create_database(DB)
    conn = mariadb.connect(DB)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE checking (id INT PRIMARY KEY, balance BIGINT NOT NULL)")
        cur.execute("CREATE TABLE savings (id INT PRIMARY KEY, balance BIGINT NOT NULL)")
        cur.execute(f"INSERT INTO checking SELECT seq, {START} FROM seq_1_to_{ACCOUNTS}")
        cur.execute(f"INSERT INTO savings SELECT seq, {START} FROM seq_1_to_{ACCOUNTS}")
        cur.execute("CREATE TABLE history (id INT PRIMARY KEY, note VARCHAR(64))")
        cur.execute(f"INSERT INTO history SELECT seq, REPEAT('h', 40) FROM seq_1_to_{HISTORY}")
        cur.execute("SHOW MASTER STATUS")
        before = offset_of(*cur.fetchone()[:2])
    conn.close()
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "bank.toml",
        pipeline={"name": NAME, "lake": "lake", "engine": "local", "max_batch": 1, "batch_interval": 0.2},
        source={"kind": "mysql", **options, "tables": ["checking", "savings", "history"], "snapshot_chunk_rows": 2000},
    )
    created = reclock_cli("create", str(config), cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    next_id, lock = [ACCOUNTS + 1], threading.Lock()
    opened = list(range(1, ACCOUNTS + 1))
    clients = [Transfers(mariadb, seed, next_id, opened, lock) for seed in range(4)]
    for client in clients:
        client.start()
    stderr = tmp_path / "job.stderr"
    rng = random.Random(42)
    state = lake / NAME / "control" / "source" / "mysql"
    in_snapshot = 0
    job = None
    try:
        for kill in range(kills):
            job = _start_job(lake, stderr)
            deadline = time.monotonic() + 120
            if kill == 0:  # inside the capture: chunk files written, the manifest not yet
                while not any((state / "chunks").glob("*.parquet")):
                    assert job.poll() is None, stderr.read_text()[-3000:]
                    assert time.monotonic() < deadline, "the capture never started"
                    time.sleep(0.005)
            else:
                batches = _status(lake).get("batches", 0)
                while _status(lake).get("batches", 0) <= batches and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(rng.uniform(0, 1.0))
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=PATIENCE_S)
            in_snapshot += kill == 0 and not (state / "manifest.json").exists()
        job = _start_job(lake, stderr)
        deadline = time.monotonic() + 120
        while len({label for t in ("checking", "savings") for label in _labels_if_any(lake, t)}) <= MIN_LABELS:
            assert job.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "the last run landed too few batches while the transfers went on"
            time.sleep(0.2)
        for client in clients:
            client.stop.set()
        for client in clients:
            client.join(timeout=PATIENCE_S)
            assert client.failure is None, client.failure
        conn = mariadb.connect(DB)
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            end = offset_of(*cur.fetchone()[:2])
        conn.close()
        deadline = time.monotonic() + 120
        while json.loads(_status(lake).get("resume_frontier", "{}")).get("offsets", {}).get(BINLOG, 0) < end:
            assert job.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "the last run did not catch up"
            time.sleep(0.2)
        assert reclock_cli("--lake", str(lake), "stop", NAME, "--wait", f"{PATIENCE_S:.0f}").returncode == 0
        assert job.wait(timeout=60) == 0, stderr.read_text()[-3000:]
    finally:
        for client in clients:
            client.stop.set()
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)

    # Ground truth: the committed transfers in binlog order, by the server package's mysqlbinlog.
    groups = mariadb.group_offsets()
    done = [effect for client in clients for effect in client.done]
    assert len(done) > 50
    missing = [gtid for gtid, _ in done if gtid not in groups]
    assert not missing, f"{len(missing)} committed transfers not in mysqlbinlog's output"
    history = sorted((groups[gtid], effects) for gtid, effects in done)
    assert history[0][0] >= before  # the first group starts where the binlog stood before

    def state_below(offset: int) -> dict[str, dict[int, int]]:
        tables = {t: dict.fromkeys(range(1, ACCOUNTS + 1), START) for t in ("checking", "savings")}
        for at, effects in history:
            if at >= offset:
                break
            for table, key, delta in effects:
                tables[table][key] = tables[table].get(key, 0) + delta
        return tables

    paths = {t: lake / NAME / "outputs" / f"{DB}_{t}" for t in ("checking", "savings")}
    cuts = {t: Cuts(path) for t, path in paths.items()}
    remap = Remap.read(lake / NAME / "remap")
    labels = sorted({label for path in paths.values() for label in _labels(path)})
    assert len(labels) > MIN_LABELS
    for at in labels:
        cut = {t: table.at(at) for t, table in cuts.items()}
        assert sum(cut["checking"].values()) + sum(cut["savings"].values()) == TOTAL, at
        frontier = remap.frontier_at(at)[BINLOG]
        assert cut == state_below(frontier), f"the cut at {at} is not the database below binlog offset {frontier}"
    for at in labels[:: max(1, len(labels) // 10)]:
        theirs = read_as_of(lake, NAME, at)
        for t in ("checking", "savings"):
            got = dict(zip(*theirs[f"{DB}_{t}"].select(["id", "balance"]).to_pydict().values(), strict=True))
            assert got == state_below(remap.frontier_at(at)[BINLOG])[t]
    conn = mariadb.connect(DB)
    with conn.cursor() as cur:
        cur.execute("SELECT (SELECT SUM(balance) FROM checking) + (SELECT SUM(balance) FROM savings)")
        assert cur.fetchone()[0] == TOTAL
        for t in ("checking", "savings"):
            cur.execute(f"SELECT id, balance FROM {t}")
            final = read_rows(DeltaLog(paths[t]).refresh(), ["id", "balance"])
            assert dict(cur.fetchall()) == dict(zip(*final.to_pydict().values(), strict=True))
    conn.close()
    snapshot_rows = read_rows(DeltaLog(lake / NAME / "outputs" / f"{DB}_history").refresh(), ["id"])
    assert sorted(snapshot_rows.column("id").to_pylist()) == list(range(1, HISTORY + 1))
    assert in_snapshot == 1, "the first kill did not land inside the snapshot's capture"
    print(f"kills={kills} in_snapshot={in_snapshot} cuts={len(labels)} transfers={len(done)}")
