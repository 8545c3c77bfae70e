"""Transactions land whole under fire: transfers between two tables, the job SIGKILLed at random.

Four threads run transfers, each one transaction moving an amount from an account of
``checking`` to one of ``savings`` (or back), and now and then opening an account in both tables
with a deposit moved from an old one, so the total of both tables never changes. A thread records
a transfer (its xid and effect) only once its COMMIT returned. Meanwhile ``reclock start`` runs
the pipeline (``engine = "local"``, ``max_batch = 1``: one batch per binding) and is killed with
SIGKILL at random moments, the first ones while it starts and captures the snapshot, then
restarted; at the end a last run catches up and is stopped.

Ground truth is the test's own: the transfers it saw commit, placed in commit order by the
server's ``pg_waldump`` (xid -> LSN of the commit record), from the tables' state before the
first transfer. Then, read with the tests' own Delta log reader (``tests.faults.reader``), for
every batch label time ``T`` of either output: both tables as of ``T`` (the first version whose
label reaches ``T``, rows with ``_into_ts <= T``) keep the total, and equal the state after every
transfer whose commit LSN is below the frontier the remap table binds at ``T``; the product's
``read_as_of`` agrees (at every ``T``; at 100 of the long lane's 1,500); the final tables equal
the database's, row for row; and the slot's ``confirmed_flush_lsn``, sampled every 100 ms from a
connection of the test's while the jobs ran and were killed, never passed a transfer the outputs
did not hold (it may pass what their labels bind over WAL without any change of the published
tables: a reader's keepalive confirms that, see docs/sources/postgres.md). A third table,
``history`` (200,000 rows, only in the snapshot), makes the capture long; it ends with every row
once.

The first two kills land inside the snapshot's capture, whose tasks land the chunks ahead of
their binding. The first by construction: once the slot's exporting connection is open
(``pg_stat_activity``), the test takes an exclusive lock on ``history`` (unless a task copies it
already), so the capture waits for it; the test sees the exporting connection still open and
kills then, with no manifest. The second once the tasks copy ``history`` from a random page of its
first half on.

The short lane kills 4 times; ``--long`` (scripts/test --long) 24 times.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, suppress
from pathlib import Path

import psycopg2
import pytest

from reclock.persist.asof import read_as_of
from tests import zygote
from tests.faults.reader import _COMMIT, DeltaLog, Remap, read_rows
from tests.integration.helpers import reclock_cli, write_config
from tests.waiting import PATIENCE_S

ACCOUNTS = 20
START = 1_000
TOTAL = 2 * ACCOUNTS * START
WAL = "wal"  # the source's one partition, as the remap table and _partition hold it
NAME = "bank"
HISTORY = 200_000
MIN_LABELS = 10  # cuts the check needs at least: a campaign with fewer would check little


class Transfers(threading.Thread):
    """One client moving money; ``done`` holds ``(xid, [(table, id, delta), ...])`` per commit."""

    def __init__(self, dsn: str, seed: int, next_id: list[int], opened: list[int], lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.dsn, self.random, self.next_id, self.lock = dsn, random.Random(seed), next_id, lock
        self.opened = opened
        self.stop = threading.Event()
        self.done: list[tuple[int, list[tuple[str, int, int]]]] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            while not self.stop.is_set():
                effects = self._one(conn)
                if effects is not None:
                    self.done.append(effects)
                time.sleep(self.random.uniform(0, 0.01))
            conn.close()
        except BaseException as exc:
            self.failure = exc

    def _one(self, conn) -> tuple[int, list[tuple[str, int, int]]] | None:
        with self.lock:  # accounts whose opening committed: another client's may be in flight or rolled back
            a, b = self.random.choice(self.opened), self.random.choice(self.opened)
        amount = self.random.randint(-50, 50)
        effects = [("checking", a, -amount), ("savings", b, amount)]
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT txid_current()")
                xid = cur.fetchone()[0]
                new = None
                if self.random.random() < 0.05:  # open an account in both tables, funded from checking a
                    with self.lock:
                        new = self.next_id[0]
                        self.next_id[0] += 1
                    cur.execute("INSERT INTO checking VALUES (%s, 0)", (new,))
                    cur.execute("INSERT INTO savings VALUES (%s, 5)", (new,))
                    effects = [("checking", new, 0), ("savings", new, 5), ("checking", a, -5)]
                    cur.execute("UPDATE checking SET balance = balance - 5 WHERE id = %s", (a,))
                    assert cur.rowcount == 1
                else:
                    cur.execute("UPDATE checking SET balance = balance - %s WHERE id = %s", (amount, a))
                    assert cur.rowcount == 1
                    cur.execute("UPDATE savings SET balance = balance + %s WHERE id = %s", (amount, b))
                    assert cur.rowcount == 1
            conn.commit()
            if new is not None:
                with self.lock:
                    self.opened.append(new)
        except psycopg2.errors.DeadlockDetected:
            conn.rollback()
            return None
        return xid & 0xFFFFFFFF, effects


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
    """The labels of an output that may not have a log yet."""
    path = lake / NAME / "outputs" / f"public_{table}"
    return _labels(path) if (path / "_delta_log").is_dir() else []


def _labels(path: Path) -> list[int]:
    """The labels a Delta table's JSON commits carry."""
    log = path / "_delta_log"
    found = []
    for name in sorted(p.name for p in log.iterdir() if _COMMIT.match(p.name)):
        for line in (log / name).read_text().splitlines():
            if '"txn"' in line and "txn" in (action := json.loads(line)):
                found.append(int(action["txn"]["version"]))
    return found


def _versions(path: Path) -> Iterator[tuple[int | None, list[tuple[int, int, int]]]]:
    """Every version of a Delta table in order, as ``(label, rows)`` with rows ``(id, balance,
    _into_ts)``, replayed from its JSON commits: one version at a time, each data file read once
    (the long lane's tables are 1,500 versions long)."""
    log = path / "_delta_log"
    versions = sorted(int(m.group(1)) for m in map(_COMMIT.match, (p.name for p in log.iterdir())) if m)
    assert versions == list(range(len(versions))), "the log has a gap"
    live: dict[str, list[tuple[int, int, int]]] = {}
    label: int | None = None
    for version in versions:
        for line in (log / f"{version:020d}.json").read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                one = DeltaLog(path)
                one.files, one.version = {action["add"]["path"]: action["add"]}, version
                table = read_rows(one, ["id", "balance", "_into_ts"])
                assert table is not None
                live[action["add"]["path"]] = list(zip(*(c.to_pylist() for c in table.columns), strict=True))
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
            elif "txn" in action:
                label = int(action["txn"]["version"])
        yield label, [row for rows in live.values() for row in rows]


class Cuts:
    """A table as of ascending times ``at``: the first version whose label reaches ``at``, its
    rows stamped at or before it. Versions are read forward once, as the times go up."""

    def __init__(self, path: Path) -> None:
        self.versions = _versions(path)
        self.label: int | None = None
        self.rows: list[tuple[int, int, int]] = []

    def at(self, at: int) -> dict[int, int]:
        while self.label is None or self.label < at:
            try:
                self.label, self.rows = next(self.versions)
            except StopIteration:
                raise AssertionError(f"no version reaches {at}") from None
        return {key: balance for key, balance, into_ts in self.rows if into_ts <= at}


def _landed_samples(watch: SlotWatch) -> list[tuple[float, int, dict[str, int | None]]]:
    """The slot's samples taken once every output held a label (the snapshot landed)."""
    return [sample for sample in list(watch.samples) if None not in sample[2].values()]


class SlotWatch(threading.Thread):
    """Samples the slot's confirmed_flush_lsn between two reads of what every output holds.

    A sample is ``(when, confirmed, labels)``: ``labels`` read after ``confirmed`` bound what the
    outputs held when it was read (the committer confirms only after the outputs commit, so a
    label read before could be older than a confirmation it legitimately made). ``exact`` counts
    the samples whose labels were the same before and after: for them the bound is exact.
    """

    OUTPUTS = ("public_checking", "public_savings", "public_history")

    def __init__(self, dsn: str, slot: str, lake: Path) -> None:
        super().__init__(daemon=True)
        self.dsn, self.slot = dsn, slot
        # Refreshed in place: a refresh parses only the commits it has not seen.
        self.logs = {output: DeltaLog(lake / NAME / "outputs" / output) for output in self.OUTPUTS}
        self.stop = threading.Event()
        self.samples: list[tuple[float, int, dict[str, int | None]]] = []
        self.exact = 0
        self.failure: BaseException | None = None

    def _labels(self) -> dict[str, int | None]:
        return {output: max(log.refresh().txns.values(), default=None) for output, log in self.logs.items()}

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            while not self.stop.wait(0.1):
                before = self._labels()
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot,),
                    )
                    row = cur.fetchone()
                if row is None or row[0] is None:
                    continue
                after = self._labels()
                self.exact += before == after
                self.samples.append((time.monotonic(), int(row[0]), after))
            conn.close()
        except BaseException as exc:
            self.failure = exc


def _capturing(dsn: str) -> bool:
    """Whether a capture is under way: its slot's exporting replication connection is open (the
    server's own ``pg_stat_activity``; nothing else of the job's replicates before a manifest)."""
    with closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'walsender' "
            "AND datname = current_database())"
        )
        return cur.fetchone()[0]


def _copying(dsn: str, table: str) -> int:
    """The highest first page of the snapshot chunks of ``table`` the capture's tasks copy now
    (the server's own ``pg_stat_activity``; -1: none)."""
    with closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT query FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'COPY (SELECT%'")
        queries = [query for (query,) in cur.fetchall() if f'FROM "public"."{table}"' in query]
    lows = [int(m.group(1)) for query in queries if (m := re.search(r"ctid >= '\((\d+),0\)'", query))]
    return max(lows, default=-1)


@pytest.mark.usefixtures("reclock_processes")
def test_transfers_land_whole_at_every_batch_time_through_kills(postgres, tmp_path, long_lane):
    kills = 24 if long_lane else 4
    db = "bank"
    dsn = postgres.create_database(db)
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("ALTER SYSTEM SET wal_keep_size = '4GB'")  # pg_waldump reads the workload's WAL after
        cur.execute("SELECT pg_reload_conf()")
        cur.execute("CREATE TABLE checking (id int PRIMARY KEY, balance bigint NOT NULL)")
        cur.execute("CREATE TABLE savings (id int PRIMARY KEY, balance bigint NOT NULL)")
        cur.execute(f"INSERT INTO checking SELECT g, {START} FROM generate_series(1, {ACCOUNTS}) g")
        cur.execute(f"INSERT INTO savings SELECT g, {START} FROM generate_series(1, {ACCOUNTS}) g")
        # Bulk the snapshot up (many chunks of a few pages each) so that kills land inside its capture.
        cur.execute("CREATE TABLE history (id int PRIMARY KEY, note text)")
        cur.execute(f"INSERT INTO history SELECT g, repeat('h', 40) FROM generate_series(1, {HISTORY}) g")
        cur.execute("SELECT pg_relation_size('history') / current_setting('block_size')::int")
        history_pages = int(cur.fetchone()[0])
        cur.execute("SELECT pg_current_wal_lsn()")
        wal_start = cur.fetchone()[0]
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "bank.toml",
        pipeline={
            "name": NAME,
            "lake": "lake",
            "engine": "local",
            "max_batch": 1,
            "batch_interval": 0.2,
            "idle_interval": 1.0,
        },
        source={
            "kind": "postgres",
            "dsn": dsn,
            "tables": ["checking", "savings", "history"],
            "read_timeout_s": 10.0,
            "snapshot_chunk_pages": 16,
        },
    )
    created = reclock_cli("create", str(config), cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    next_id, lock = [ACCOUNTS + 1], threading.Lock()
    opened = list(range(1, ACCOUNTS + 1))  # shared by the clients, under the lock
    clients = [Transfers(dsn, seed, next_id, opened, lock) for seed in range(4)]
    watch = SlotWatch(dsn, "reclock_bank", lake)
    for client in clients:
        client.start()
    watch.start()
    stderr = tmp_path / "job.stderr"
    rng = random.Random(22)
    in_snapshot = 0
    manifest = lake / NAME / "control" / "source" / "snapshot.json"
    job = None
    try:
        for kill in range(kills):
            job = _start_job(lake, stderr)
            deadline = time.monotonic() + 120
            held = None
            if kill == 0:  # the capture is held before its copy of history: the kill lands inside it
                while not _capturing(dsn):
                    assert job.poll() is None, stderr.read_text()[-3000:]
                    assert not manifest.exists(), "the capture ended before the test saw it"
                    assert time.monotonic() < deadline, "the capture never started"
                    time.sleep(0.01)
                held = psycopg2.connect(dsn)
                with suppress(psycopg2.errors.LockNotAvailable), held.cursor() as cur:
                    # The chunks of history after wait for it (unless a task copies history already).
                    cur.execute("LOCK TABLE history IN ACCESS EXCLUSIVE MODE NOWAIT")
                assert _capturing(dsn), "the capture ended before the test held it"
            elif kill == 1:  # at a random page of the first half of history's copy (a chunk copies in ms)
                wanted = rng.randint(0, history_pages // 2)
                while not manifest.exists() and time.monotonic() < deadline:
                    if _copying(dsn, "history") >= wanted:
                        break
                    time.sleep(0.01)
            else:
                batches = _status(lake).get("batches", 0)
                while _status(lake).get("batches", 0) <= batches and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(rng.uniform(0, 1.5))
                while kill == kills - 1 and len(_landed_samples(watch)) <= 20 and time.monotonic() < deadline:
                    time.sleep(0.1)  # the last job lives until the slot was sampled enough with jobs running
            capturing = _capturing(dsn)
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=PATIENCE_S)
            if held is not None:
                held.close()  # lets the dead capture's waiting copies end
            # Dead now: a capture it started (its slot's snapshot exported) left no manifest.
            partial = capturing and not manifest.exists()
            assert partial or kill != 0, "the first kill landed outside the capture"
            in_snapshot += partial
        kills_ended = time.monotonic()
        # The last run starts while the transfers go on, and they stop only once the outputs hold
        # enough cuts to check: under load the killed runs spend their lives starting up, and a
        # count of batches that trusted timing came short (9 labels at a load average of 12).
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
        with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_flush_lsn() - '0/0', pg_current_wal_lsn()")
            flushed, wal_end = cur.fetchone()
        deadline = time.monotonic() + 120
        while json.loads(_status(lake).get("resume_frontier", "{}")).get("offsets", {}).get("wal", 0) < int(flushed):
            assert job.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "the last run did not catch up"
            time.sleep(0.2)
        assert reclock_cli("--lake", str(lake), "stop", NAME, "--wait", f"{PATIENCE_S:.0f}").returncode == 0
        assert job.wait(timeout=60) == 0, stderr.read_text()[-3000:]
    finally:
        for client in clients:
            client.stop.set()
        watch.stop.set()
        watch.join(timeout=PATIENCE_S)
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)

    # Ground truth: the committed transfers in commit order, by the server's own WAL dump.
    commits = postgres.commit_lsns(wal_start, wal_end)
    done = [effect for client in clients for effect in client.done]
    assert len(done) > 50
    missing = [xid for xid, _ in done if xid not in commits]
    assert not missing, f"{len(missing)} committed transfers not in pg_waldump's output"
    history = sorted((commits[xid], effects) for xid, effects in done)

    replayed = {"upto": 0, "next": 0, "tables": {}}

    def state_below(lsn: int) -> dict[str, dict[int, int]]:
        """The tables after every transfer committed below ``lsn``: replayed on from the last
        call's point when ``lsn`` is not lower (labels come in order: the long lane's 1,500 cuts
        would replay the whole history each otherwise)."""
        if lsn < replayed["upto"] or not replayed["tables"]:
            replayed["next"] = 0
            replayed["tables"] = {t: dict.fromkeys(range(1, ACCOUNTS + 1), START) for t in ("checking", "savings")}
        tables, i = replayed["tables"], replayed["next"]
        while i < len(history) and history[i][0] < lsn:
            for table, key, delta in history[i][1]:
                tables[table][key] = tables[table].get(key, 0) + delta
            i += 1
        replayed["upto"], replayed["next"] = lsn, i
        return {t: dict(rows) for t, rows in tables.items()}

    paths = {t: lake / NAME / "outputs" / f"public_{t}" for t in ("checking", "savings")}
    cuts = {t: Cuts(path) for t, path in paths.items()}
    remap = Remap.read(lake / NAME / "remap")
    labels = sorted({label for path in paths.values() for label in _labels(path)})
    assert len(labels) > MIN_LABELS
    checked = 0
    # The product's read_as_of at every label too, or, in the long lane's 1,500 labels, at 100
    # spread over them (a read of a table 1,500 commits long takes about a second).
    step = max(1, len(labels) // 100)
    products = set(labels[::step]) | {labels[-1]}
    for at in labels:
        cut = {t: table.at(at) for t, table in cuts.items()}
        assert sum(cut["checking"].values()) + sum(cut["savings"].values()) == TOTAL, at
        frontier = remap.frontier_at(at)[WAL]
        assert cut == state_below(frontier), f"the cut at {at} is not the database below LSN {frontier}"
        checked += 1
        if at not in products:
            continue
        theirs = read_as_of(lake, NAME, at)
        for t in ("checking", "savings"):
            assert (
                dict(zip(*theirs[f"public_{t}"].select(["id", "balance"]).to_pydict().values(), strict=True))
                == (cut[t])
            )
    # The final tables are the database's, row for row (and the database kept the total).
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("SELECT (SELECT sum(balance) FROM checking) + (SELECT sum(balance) FROM savings)")
        assert cur.fetchone()[0] == TOTAL
        for t in ("checking", "savings"):
            cur.execute(f"SELECT id, balance FROM {t}")
            final = read_rows(DeltaLog(paths[t]).refresh(), ["id", "balance"])
            assert dict(cur.fetchall()) == dict(zip(*final.to_pydict().values(), strict=True))
    # The snapshot-only table: every row once.
    snapshot_rows = read_rows(DeltaLog(lake / NAME / "outputs" / "public_history").refresh(), ["id"])
    assert sorted(snapshot_rows.column("id").to_pylist()) == list(range(1, HISTORY + 1))
    assert in_snapshot >= 1, "no kill landed inside the snapshot's capture"
    # The slot never confirmed past a transfer the outputs did not hold, sampled while jobs ran.
    assert watch.failure is None, watch.failure
    during = [(c, held) for when, c, held in _landed_samples(watch) if when < kills_ended]
    assert len(during) > 20, f"{len(during)} samples of the slot while the jobs ran"
    assert len({c for c, _ in during}) >= 3, "the slot never moved while the jobs ran"
    commit_lsns = [lsn for lsn, _ in history]
    checked_samples = ahead = 0
    for confirmed, held in (s[1:] for s in watch.samples):
        if None in held.values():
            continue
        bound = min(remap.frontier_at(label).get(WAL, 0) for label in held.values())
        if confirmed > bound:  # allowed only over WAL that holds no transfer
            ahead += 1
            skipped = [lsn for lsn in commit_lsns if bound <= lsn < confirmed]
            assert not skipped, f"the slot confirmed {confirmed}, past transfers at {skipped[:3]}; outputs held {bound}"
        checked_samples += 1
    print(
        f"kills={kills} in_snapshot={in_snapshot} cuts={checked} read_as_of={len(products)} transfers={len(done)} "
        f"slot_samples={checked_samples} "
        f"during_kills={len(during)} exact={watch.exact} ahead_over_empty_wal={ahead}"
    )
